"""Where a TCP caller dialled, when destination NAT rewrote it: the host's connection tracking.

The shipped DaemonSet takes its kernels' connections on a ``hostPort``: a kernel dials its
node's address, and the network plugin's NAT (``portmap``'s DNAT, or the plugin's own)
delivers the connection to the agent pod's address. The agent then sees the far end as the
kernel's socket has it, but its own end as the pod's address, which the kernel's socket does
not name: its remote end is the node's address. The kernel (``nf_conntrack``) keeps both: a
tracked connection's *original* tuple (what the kernel's socket sent: its source, the address
it dialled) and its *reply* tuple (what the agent's socket answers: from the agent's end to
the far end). :func:`dialled` finds the connection whose reply tuple is the agent's socket's
and gives the address the caller dialled, so that its socket can be matched exactly, 4-tuple
for 4-tuple (:mod:`.netpeer`). Source NAT (the original source is not the far end the agent
sees) gives nothing: nothing on the node then says which socket it was.

Read from ``/proc/PID/net/nf_conntrack`` of the agent's own network namespace and of the
host's (PID 1's: where a hostPort's DNAT happens), as root (the file is root's, 0440), bounded.
Nothing here raises.
"""

from __future__ import annotations

import ipaddress
import os

__all__ = ["dialled", "parse_dialled"]

_MAX_BYTES = 64 << 20
_CHUNK = 1 << 16
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _plain(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_dialled(line: str, far: tuple, near: tuple) -> tuple[Address, int] | None:
    """The original destination of a tracked TCP connection (one line of ``nf_conntrack``).

    Only of one whose reply tuple is ``near`` → ``far`` and whose original source is ``far``
    (no source NAT); else None.
    """
    words = line.split()
    if "tcp" not in words[:4]:
        return None
    tuples: list[dict[str, str]] = [{}, {}]
    side = 0
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or key not in ("src", "dst", "sport", "dport"):
            continue
        if key in tuples[side]:
            side += 1  # the reply tuple starts where a key comes again
            if side > 1:
                break
        tuples[side][key] = value
    try:
        original, reply = ([_end(t, "src", "sport"), _end(t, "dst", "dport")] for t in tuples)
    except (KeyError, ValueError):
        return None
    if reply[0] == near and reply[1] == far and original[0] == far:
        return original[1]
    return None


def _end(ends: dict[str, str], address: str, port: str) -> tuple[Address, int]:
    return _plain(ipaddress.ip_address(ends[address])), int(ends[port])


def dialled(proc: str, far: tuple, near: tuple) -> tuple[list[tuple[Address, int]], str | None]:
    """The distinct addresses a caller at ``far`` dialled to reach the agent's ``near``.

    As the host's connection tracking has them; or none, and why (no table readable).
    """
    needle = f"sport={near[1]} dport={far[1]}".encode()
    found: dict[tuple, None] = {}
    read, seen = False, set()
    for pid in (os.getpid(), 1):
        path = f"{proc}/{pid}/net/nf_conntrack"
        try:
            identity = os.stat(f"{proc}/{pid}/ns/net").st_ino
        except OSError:
            continue
        if identity in seen:
            continue
        seen.add(identity)
        try:
            for line in _lines_with(path, needle):
                end = parse_dialled(line, far, near)
                if end is not None:
                    found[end] = None
            read = True
        except OSError:
            continue
    if not read:
        return [], "the host's connection tracking (nf_conntrack) cannot be read"
    return list(found), None


def _lines_with(path: str, needle: bytes) -> list[str]:
    """The lines of ``path`` that contain ``needle``, read 64 KiB at a time, bounded."""
    lines, carry, size = [], b"", 0
    with open(path, "rb", buffering=0) as file:
        while size < _MAX_BYTES and (chunk := file.read(_CHUNK)):
            size += len(chunk)
            block = carry + chunk
            cut = block.rfind(b"\n") + 1
            lines += [ln.decode("ascii", "replace") for ln in block[:cut].split(b"\n")
                      if needle in ln]  # fmt: skip
            carry = block[cut:]
    if needle in carry:
        lines.append(carry.decode("ascii", "replace"))
    return lines
