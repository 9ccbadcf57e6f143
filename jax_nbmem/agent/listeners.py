"""Where a process itself listens, read from the kernel, and whether that is where a file says.

A Jupyter server's runtime file is its user's to write: it may name any address. Before its
token is sent anywhere, the address is matched *whole* against the sockets the server process
itself holds open and listening — its own file descriptors (``/proc/PID/fd``) found in its own
network namespace's tables (``/proc/PID/net/tcp``, ``tcp6``, ``unix``) — never the port
alone: mallory's server on 127.0.0.2:18888 with a runtime file naming 127.0.0.1:18888 (where
bob's listens) is no server at 127.0.0.1:18888. What is then asked is the address the
process is proven to listen on (a wildcard bind: loopback of its family), and only in this
process's own network namespace (and, for a Unix socket, mount namespace): the same address
in another namespace is another socket.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import stat
from dataclasses import dataclass

from jax_nbmem.node.servers import JupyterServer

__all__ = ["Listeners", "listeners_of", "proven_address"]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's "Flags": a listening socket
_LOCALHOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_WILDCARD_NAMES = ("", "*", "0.0.0.0", "::")
_ANY4 = ipaddress.ip_address("0.0.0.0")
_ANY6 = ipaddress.ip_address("::")


@dataclass(frozen=True)
class Listeners:
    """A process's listening sockets: TCP (address, port) pairs and Unix socket paths."""

    tcp: frozenset[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]
    unix: frozenset[str]

    def describe(self) -> str:
        """``127.0.0.2:18888, [::1]:8888`` or ``nothing``, for messages."""
        shown = [_endpoint(a, p) for a, p in sorted(self.tcp, key=lambda x: (x[0].version, x))]
        shown += sorted(self.unix)
        return ", ".join(shown) or "nothing"


def listeners_of(pid: int, proc: str = "/proc") -> Listeners:
    """The sockets host PID ``pid`` holds open and listening; OSError when unreadable."""
    inodes = set()
    fd_dir = f"{proc}/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    tcp = set()
    for table in ("tcp", "tcp6"):
        try:
            tcp |= _tcp_listeners(f"{proc}/{pid}/net/{table}", inodes)
        except FileNotFoundError:
            continue  # no IPv6 in that namespace
    return Listeners(frozenset(tcp), frozenset(_unix_listeners(f"{proc}/{pid}/net/unix", inodes)))


def _tcp_listeners(table: str, inodes: set[str]) -> set:
    found = set()
    with open(table, encoding="ascii", errors="replace") as lines:
        next(lines, None)
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN or fields[9] not in inodes:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            found.add((_address(hex_address), int(hex_port, 16)))
    return found


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in the host's byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ipaddress.IPv4Address(words)
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address


def _unix_listeners(table: str, inodes: set[str]) -> set[str]:
    found = set()
    with open(table, encoding="utf-8", errors="surrogateescape") as lines:
        next(lines, None)
        for line in lines:
            fields = line.split(maxsplit=7)
            if len(fields) < 8 or fields[6] not in inodes:
                continue
            if int(fields[3], 16) & _ACCEPTING:
                found.add(fields[7].rstrip("\n"))
    return found


def same_namespaces(pid: int, proc: str = "/proc", kinds: tuple[str, ...] = ("net",)) -> str:
    """Why ``pid`` does not share this process's namespaces of ``kinds``; "" when it does."""
    for kind in kinds:
        try:
            theirs, ours = os.stat(f"{proc}/{pid}/ns/{kind}"), os.stat(f"{proc}/self/ns/{kind}")
        except OSError as error:
            return f"its {kind} namespace is unreadable ({error.strerror or error})"
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            return f"it runs in a {kind} namespace of its own, where that address is another one"
    return ""


def proven_address(
    pid: int, uid: int, server: JupyterServer, proc: str = "/proc"
) -> tuple[JupyterServer | None, str]:
    """``server`` to be asked where host PID ``pid`` is proven to listen, or (None, why not).

    TCP: the runtime file's address and port matched whole against ``pid``'s own listening
    sockets, in this process's network namespace; a wildcard bind is asked on loopback of its
    family, ``localhost`` on 127.0.0.1 or ::1, whichever ``pid`` listens on. A Unix socket:
    its path among ``pid``'s listening sockets, in this mount namespace, a socket of ``uid``.
    """
    kinds = ("net", "mnt") if server.sock else ("net",)
    elsewhere = same_namespaces(pid, proc, kinds)
    if elsewhere:
        return None, elsewhere
    try:
        held = listeners_of(pid, proc)
    except OSError as error:
        return None, f"its sockets are unreadable ({error.strerror or error})"
    if server.sock:
        return _unix(server, held, uid)
    chosen = _tcp_match(server.host, server.port, held)
    if chosen is None:
        named = _named(server.host, server.port)
        return None, f"it names {named}, but PID {pid} listens at {held.describe()}"
    return dataclasses.replace(server, connect_host=str(chosen)), ""


def _unix(server: JupyterServer, held: Listeners, uid: int) -> tuple[JupyterServer | None, str]:
    if server.sock not in held.unix:
        return None, f"it names the socket {server.sock}, which its process does not listen on"
    try:
        info = os.lstat(server.sock)
    except OSError as error:
        return None, f"its socket {server.sock} is unreadable ({error.strerror or error})"
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != uid:
        return None, f"{server.sock} is not a socket of its own user"
    return server, ""


def _tcp_match(host: str, port: int | None, held: Listeners):
    """The address to ask (one ``held`` proves), or None: the whole address, never the port."""
    if port is None:
        return None
    bound = {address for address, its_port in held.tcp if its_port == port}
    name = host.strip("[]").lower()
    if name in _WILDCARD_NAMES:
        wanted = [(_ANY4, "127.0.0.1"), (_ANY6, "::1")]
    elif name in _LOCALHOST_NAMES:
        wanted = [(ipaddress.ip_address(a), a) for a in ("127.0.0.1", "::1")]
        wanted += [(_ANY4, "127.0.0.1"), (_ANY6, "::1")]
    else:
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        if not address.is_loopback:
            return None
        wildcard = _ANY4 if address.version == 4 else _ANY6
        wanted = [(address, str(address)), (wildcard, str(address))]
    for listening, asked in wanted:
        if listening in bound:
            return ipaddress.ip_address(asked)
    return None


def _named(host: str, port: int | None) -> str:
    try:
        return _endpoint(ipaddress.ip_address(host.strip("[]")), port)
    except ValueError:
        return f"{host or '*'}:{port}"


def _endpoint(address, port) -> str:
    return f"[{address}]:{port}" if getattr(address, "version", 4) == 6 else f"{address}:{port}"
