"""Which host process holds the far end of a TCP connection to the node agent.

Over a Unix socket the kernel's host PID arrives with the connection (SO_PEERCRED). Over TCP
nothing does, and what a caller says is a claim, so the agent finds the caller from the
host's side, reading ``/proc`` in the host's PID namespace (:mod:`.server`):

1. The agent sees the connection's far end as ``peer`` (address, port). A pod has a network
   namespace of its own: its kernel's socket is listed in *that* namespace's table only.
   Every host process's ``/proc/PID/ns/net`` says its network namespace; one process of each
   is enough to read the namespace's own addresses (``net/fib_trie``'s ``/32 host LOCAL``
   entries, ``net/if_inet6``: microseconds; kept in a map of address to namespaces, made again
   when an address is new to it, at most every 0.25 s, and every 30 s) and only the
   namespaces that own the peer's address (a loopback one: the agent's own) have their TCP
   tables read (``net/tcp`` and ``tcp6``: a millisecond each, for the kernel walks every
   namespace's sockets to list one's). An address no namespace on this node owns is a caller
   from elsewhere: refused at once (a flood of them costs a dictionary lookup each).
2. In those tables, the caller's socket is an ESTABLISHED one whose local end is ``peer`` and
   whose remote end is the agent's own (address, port): the connection's 4-tuple as the
   caller's namespace sees it, exactly: one socket in one namespace, or nothing is proven.
   A socket whose local end alone is ``peer`` proves nothing: a caller that forges its
   source (ARP poisoning on a bridge, a pod's default CAP_NET_RAW) and dials another of the
   agent's addresses would be taken for the process whose end it copied. Where destination
   NAT rewrote the address the caller dialled (the DaemonSet's ``hostPort``, a Service), the
   host's connection tracking (:mod:`.conntrack`) says what it dialled, and the 4-tuple with
   that remote end is matched, exactly as well. Source NAT (masquerading pod traffic to the
   node's address) leaves nothing to match: refused, and the refusal says so.
3. The table gives the socket's inode; the process (or processes, after a fork) holding
   ``socket:[inode]`` among its ``/proc/PID/fd`` links, in that namespace, is the caller.

IPv4, IPv6 and IPv4-mapped IPv6 (a dual-stack listener) are compared as addresses, not text.
Reading another user's ``/proc/PID/ns/net`` and ``/proc/PID/fd`` needs CAP_SYS_PTRACE (the
agent's, as for the PID namespace). Nothing here raises: :meth:`PeerFinder.holders` gives the
host PIDs, or none and why.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass

from jax_nbmem.agent import conntrack

__all__ = ["PeerFinder", "Socket", "family_of", "parse_tcp_table", "sockets_with_local_end"]

_ESTABLISHED = "01"
_MAP_FRESH_S = 0.25
_MAP_MAX_AGE_S = 30.0
_MAX_TABLE_BYTES = 16 << 20
_MAX_FDS = 65536
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Socket:
    """One line of ``/proc/PID/net/tcp{,6}``: its two ends, state and inode."""

    local: tuple[Address, int]
    remote: tuple[Address, int]
    state: str
    inode: int


def _address(text: str) -> Address | None:
    """``/proc/net/tcp``'s hex address (32-bit words in host byte order) as an address."""
    try:
        words = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
        packed = struct.pack(f"={len(words)}I", *words)
        return ipaddress.ip_address(packed) if len(packed) in (4, 16) else None
    except (ValueError, struct.error):
        return None


def _plain(address: Address) -> Address:
    """An IPv4-mapped IPv6 address as the IPv4 address it maps (how a dual stack shows it)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _end(text: str) -> tuple[Address, int] | None:
    host, _, port = text.partition(":")
    found = _address(host)
    if found is None or not port:
        return None
    try:
        return _plain(found), int(port, 16)
    except ValueError:
        return None


def parse_tcp_table(text: str) -> list[Socket]:
    """The sockets of a ``/proc/PID/net/tcp`` or ``tcp6`` text; malformed lines are skipped."""
    found = []
    for line in text.splitlines()[1:]:
        parsed = _parse_line(line)
        if parsed is not None:
            found.append(parsed)
    return found


def _parse_line(line: str) -> Socket | None:
    fields = line.split()
    if len(fields) < 10 or not fields[9].isdigit():
        return None
    local, remote = _end(fields[1]), _end(fields[2])
    if local is None or remote is None:
        return None
    return Socket(local, remote, fields[3], int(fields[9]))


def _hex_ends(end: tuple[Address, int]) -> tuple[str, ...]:
    """How ``/proc/net/tcp{,6}`` writes the end ``end`` (an IPv4 one also as IPv4-mapped)."""
    address, port = end
    forms = [address.packed]
    if address.version == 4:
        forms.append(ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed).packed)
    shown = []
    for packed in forms:
        words = struct.unpack(f"={len(packed) // 4}I", packed)
        shown.append("".join(f"{word:08X}" for word in words) + f":{port:04X}")
    return tuple(shown)


def sockets_with_local_end(data: bytes, end: tuple[Address, int]) -> list[Socket]:
    """The sockets of (whole lines of) a TCP table whose local end is ``end``.

    Found without parsing every line (a table of 12,000 sockets is a couple of MiB): the end
    is searched as the table writes it.
    """
    found = []
    for shown in _hex_ends(end):
        needle = f" {shown} ".encode()
        start = data.find(needle)
        while start >= 0:
            line_start = data.rfind(b"\n", 0, start) + 1
            line_end = data.find(b"\n", start)
            line = data[line_start : len(data) if line_end < 0 else line_end]
            parsed = _parse_line(line.decode("ascii", "replace"))
            if parsed is not None and parsed.local == end:
                found.append(parsed)
            start = data.find(needle, start + len(needle))
    return found


def _table_sockets(path: str, end: tuple[Address, int]) -> list[Socket]:
    """:func:`sockets_with_local_end` of a table file, read and searched 64 KiB at a time.

    Never the whole table in memory at once: a large buffer, freed, stays in the agent's
    resident memory (the allocator keeps it), and a flood of callers would make it so.
    """
    found, carry, size = [], b"", 0
    with open(path, "rb", buffering=0) as file:
        while size < _MAX_TABLE_BYTES and (chunk := file.read(65536)):
            size += len(chunk)
            block = carry + chunk
            cut = block.rfind(b"\n") + 1
            found += sockets_with_local_end(block[:cut], end)
            carry = block[cut:]
    return found + sockets_with_local_end(carry, end)


def _read(path: str) -> str:
    # In chunks: read(16 MiB) would allocate 16 MiB for every (mostly tiny) table.
    chunks, size = [], 0
    with open(path, "rb", buffering=0) as file:
        while size < _MAX_TABLE_BYTES and (chunk := file.read(65536)):
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks).decode("ascii", "replace")


class PeerFinder:
    """Finds the host processes that hold a TCP connection's far end (see the module).

    ``proc`` is the host's ``/proc`` (the agent runs in the host's PID namespace).
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        # Which namespaces own which address: made again when an address is not in it (at
        # most every _MAP_FRESH_S: a flood of callers from elsewhere costs a dict lookup each)
        # or when it is older than _MAP_MAX_AGE_S.
        self._groups: dict[int, list[int]] = {}
        self._by_address: dict[Address, list[int]] = {}
        self._map_at = -float("inf")
        self._map_lock = threading.Lock()  # the agent's look-up workers share one finder
        self.maps_made = 0

    def namespace_of(self, address: str) -> int | None:
        """The network namespace (inode) that owns ``address`` in the map as it stands.

        No ``/proc`` walk (the agent asks at accept, on its serving thread): None when the map
        does not know the address yet, or more than one namespace has it.
        """
        try:
            found = _plain(ipaddress.ip_address(address.split("%")[0]))
        except ValueError:
            return None
        if found.is_loopback:
            try:
                return os.stat(f"{self.proc}/{os.getpid()}/ns/net").st_ino
            except OSError:
                return None
        inodes = self._by_address.get(found, ())
        return inodes[0] if len(inodes) == 1 else None

    def namespaces(self) -> dict[int, list[int]]:
        """Every readable network namespace (its inode), with the host PIDs in it."""
        groups: dict[int, list[int]] = {}
        try:
            names = os.listdir(self.proc)
        except OSError:
            return groups
        for name in names:
            if not name.isdigit():
                continue
            try:
                inode = os.stat(f"{self.proc}/{name}/ns/net").st_ino
            except OSError:
                continue  # gone, a kernel thread, or unreadable without CAP_SYS_PTRACE
            groups.setdefault(inode, []).append(int(name))
        return groups

    def holders(
        self, peer: tuple[str, int], agent: tuple[str, int]
    ) -> tuple[list[int], str | None]:
        """The host PIDs holding the socket whose end the agent sees as ``peer``; else why not.

        ``peer`` and ``agent`` are ``getpeername()`` and ``getsockname()`` of the agent's side.
        """
        try:
            far = (_plain(ipaddress.ip_address(peer[0].split("%")[0])), int(peer[1]))
            near = (_plain(ipaddress.ip_address(agent[0].split("%")[0])), int(agent[1]))
        except (ValueError, IndexError, TypeError):
            return [], f"the connection's ends {peer!r}, {agent!r} are not IP addresses"
        owners = self._owners(far[0])
        matches = self._matches(owners, far, near)
        if not matches and not far[0].is_loopback and self._map_older_than(_MAP_FRESH_S):
            self._make_map()  # the address may have moved to a new pod since the map was made
            owners = self._owners(far[0])
            matches = self._matches(owners, far, near)
        translated = None
        if owners and not matches and not far[0].is_loopback:
            dialled, translated = conntrack.dialled(self.proc, far, near)
            if len(dialled) == 1:
                matches = self._matches(owners, far, dialled[0])
            elif dialled:
                translated = f"{len(dialled)} tracked connections have the end {_shown(far)}"
        if not owners:
            return [], (
                f"no network namespace on this node has the address {far[0]} (a caller from "
                "another machine)"
            )
        if not matches:
            return [], (
                f"no socket on this node is exactly this connection from {_shown(far)} (a "
                "forged source, a caller from another machine, or source NAT between the pod "
                f"and the node){f': {translated}' if translated else ''}; nothing is proven"
            )
        if len({inode for inode, _, _ in matches}) > 1:
            return [], f"{len(matches)} sockets on this node have the end {_shown(far)}"
        inode, namespace, pids = matches[0]
        held = self._holding(inode, pids)
        if not held:  # the map's list may predate the caller's process: the namespace's now
            held = self._holding(inode, self.namespaces().get(namespace) or [])
        if not held:
            return [], f"no process holds the connecting socket (inode {inode}) any more"
        return held, None

    def _matches(self, owners: list[tuple[int, list[int]]], far: tuple, near: tuple) -> list:
        """(socket inode, namespace inode, its PIDs) of the ESTABLISHED sockets of one 4-tuple.

        Their local end is ``far``, their remote end ``near``: the connection's exact 4-tuple,
        nothing less.
        """
        return [
            (found.inode, namespace, pids)
            for namespace, pids in owners
            for found in self._table(pids, far)
            if found.state == _ESTABLISHED and found.remote == near
        ]

    def _map_older_than(self, seconds: float) -> bool:
        return time.monotonic() - self._map_at > seconds

    def _owners(self, address: Address) -> list[tuple[int, list[int]]]:
        """(inode, PIDs) of each network namespace that has ``address`` as one of its own."""
        if address.is_loopback:  # loopback never leaves a namespace: the caller is in ours
            groups = self.namespaces()
            try:
                own = os.stat(f"{self.proc}/{os.getpid()}/ns/net").st_ino
            except OSError:
                return []
            return [(own, groups[own])] if own in groups else []
        if self._map_older_than(_MAP_MAX_AGE_S) or (
            address not in self._by_address and self._map_older_than(_MAP_FRESH_S)
        ):
            self._make_map()
        inodes = self._by_address.get(address, ())
        return [(inode, self._groups[inode]) for inode in inodes if inode in self._groups]

    def _make_map(self) -> None:
        with self._map_lock:
            groups, by_address = self.namespaces(), {}
            for inode, pids in groups.items():
                for address in self._addresses(pids):
                    by_address.setdefault(address, []).append(inode)
            self._groups, self._by_address = groups, by_address
            self._map_at = time.monotonic()
            self.maps_made += 1

    def _addresses(self, pids: list[int]) -> set[Address]:
        """The addresses a network namespace has as its own (read through one of its PIDs)."""
        for pid in pids:
            try:
                found = _locals_v4(_read(f"{self.proc}/{pid}/net/fib_trie"))
            except OSError:
                continue
            try:
                found |= _locals_v6(_read(f"{self.proc}/{pid}/net/if_inet6"))
            except OSError:
                pass  # IPv6 off in this namespace
            return found
        return set()

    def _table(self, pids: list[int], far: tuple[Address, int]) -> list[Socket]:
        """The sockets with the local end ``far`` in the network namespace ``pids`` share."""
        for pid in pids:
            sockets, read = [], False
            for name in ("tcp", "tcp6"):
                try:
                    sockets += _table_sockets(f"{self.proc}/{pid}/net/{name}", far)
                    read = True
                except OSError:
                    continue
            if read:
                return sockets
        return []

    def _holding(self, inode: int, pids: list[int]) -> list[int]:
        wanted = f"socket:[{inode}]"
        held = []
        for pid in pids:
            folder = f"{self.proc}/{pid}/fd"
            try:
                fds = os.listdir(folder)[:_MAX_FDS]
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"{folder}/{fd}") == wanted:
                        held.append(pid)
                        break
                except OSError:
                    continue
        return sorted(held)


def _locals_v4(fib_trie: str) -> set[Address]:
    """The addresses ``net/fib_trie`` lists as local ones (``|-- A`` then ``/32 host LOCAL``)."""
    found: set[Address] = set()
    leaf = None
    for line in fib_trie.splitlines():
        words = line.split()
        if words[:1] == ["|--"] and len(words) == 2:
            leaf = words[1]
        elif leaf and words[:1] == ["/32"] and "LOCAL" in words:
            try:
                found.add(ipaddress.IPv4Address(leaf))
            except ValueError:
                pass
        elif not words or not words[0].startswith("/"):
            leaf = None
    return found


def _locals_v6(if_inet6: str) -> set[Address]:
    """The addresses of ``net/if_inet6`` (32 hex digits first on each line)."""
    found: set[Address] = set()
    for line in if_inet6.splitlines():
        words = line.split()
        if words and len(words[0]) == 32:
            try:
                found.add(ipaddress.IPv6Address(int(words[0], 16)))
            except ValueError:
                pass
    return found


def _shown(end: tuple[Address, int]) -> str:
    address, port = end
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{port}"


def family_of(host: str) -> int:
    """The socket family for a listening address (AF_INET6 for an IPv6 one)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
