"""Which host process holds a TCP connection's far end, read from a /proc tree made here.

A network namespace is a file every process in it links to (``ns/net``: the same inode, as
the kernel's nsfs gives), its table ``net/tcp`` or ``tcp6`` as the kernel writes it, and a
process's sockets ``fd/N -> socket:[inode]``.
"""

import ipaddress
import os
import socket
import struct

import pytest

from jax_nbmem.agent.netpeer import PeerFinder, parse_tcp_table

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"  # noqa: E501


def hex_end(address: str, port: int) -> str:
    packed = ipaddress.ip_address(address).packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def line(local, remote, inode, state="01"):
    return (f"   0: {hex_end(*local)} {hex_end(*remote)} {state} 00000000:00000000 00:00000000 "
            f"00000000  1000        0 {inode} 1 0000000000000000 20 4 30 10 -1\n")  # fmt: skip


class Proc:
    """A /proc of namespaces and processes."""

    def __init__(self, root):
        self.root = root
        root.mkdir(exist_ok=True)

    def namespace(self, name, tcp="", tcp6="", addresses=()):
        """A network namespace with its sockets, and ``addresses`` of its own."""
        ns = self.root / f"ns-{name}"
        ns.write_text(name)
        return ns, tcp, tcp6, addresses

    def process(self, pid, namespace, sockets=()):
        ns, tcp, tcp6, addresses = namespace
        base = self.root / str(pid)
        (base / "ns").mkdir(parents=True)
        os.link(ns, base / "ns" / "net")
        (base / "net").mkdir()
        (base / "net" / "tcp").write_text(HEADER + tcp)
        (base / "net" / "tcp6").write_text(HEADER + tcp6)
        v4 = [ipaddress.ip_address(a) for a in addresses if ipaddress.ip_address(a).version == 4]
        v6 = [ipaddress.ip_address(a) for a in addresses if ipaddress.ip_address(a).version == 6]
        (base / "net" / "fib_trie").write_text(fib_trie(v4))
        (base / "net" / "if_inet6").write_text("".join(
            f"{a.exploded.replace(':', '')} 02 40 00 80   eth0\n" for a in v6))  # fmt: skip
        (base / "fd").mkdir()
        for number, inode in enumerate(sockets, start=3):
            os.symlink(f"socket:[{inode}]", base / "fd" / str(number))
        os.symlink("/dev/null", base / "fd" / "0")


def fib_trie(addresses) -> str:
    """``/proc/net/fib_trie`` as the kernel writes it, with ``addresses`` as local ones."""
    text = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
    for address in addresses:
        network = ".".join(str(address).split(".")[:3]) + ".0"
        text += (f"     |-- {network}\n        /24 link UNICAST\n"
                 f"     |-- {address}\n        /32 host LOCAL\n")  # fmt: skip
    return text + "Local:\n  +-- 0.0.0.0/0 3 0 5\n"


AGENT = ("10.0.0.5", 9842)
POD = ("10.244.1.7", 40112)


@pytest.fixture
def proc(tmp_path):
    return Proc(tmp_path / "proc")


def test_the_kernel_s_own_table_has_the_tuple_and_its_process_the_socket(proc):
    host = proc.namespace("host", tcp=line(AGENT, POD, 111), addresses=["10.0.0.5"])
    listening = line(("10.244.1.7", 8888), ("0.0.0.0", 0), 501, "0A")
    alice = proc.namespace("alice", tcp=line(POD, AGENT, 500) + listening, addresses=[POD[0]])
    bob = proc.namespace("bob", tcp=line(("10.244.1.9", 40112), AGENT, 600),
                         addresses=["10.244.1.9"])  # fmt: skip
    proc.process(1, host, [111])
    proc.process(4000, alice)  # the pod's pause process: same namespace, not the socket
    proc.process(4100, alice, [501, 500])
    proc.process(4200, bob, [600])
    assert PeerFinder(str(proc.root)).holders(POD, AGENT) == ([4100], None)


def test_a_forked_child_holding_the_same_socket_is_a_holder_too(proc):
    alice = proc.namespace("alice", tcp=line(POD, AGENT, 500), addresses=[POD[0]])
    proc.process(4100, alice, [500])
    proc.process(4101, alice, [500])
    assert PeerFinder(str(proc.root)).holders(POD, AGENT) == ([4100, 4101], None)


def test_ipv6_and_ipv4_mapped_ends_are_compared_as_addresses(proc):
    pod6, agent6 = ("fd00:10:244::7", 40112), ("fd00::5", 9842)
    alice = proc.namespace("alice", tcp6=line(pod6, agent6, 700), addresses=[pod6[0]])
    proc.process(4100, alice, [700])
    bob = proc.namespace("bob", tcp6=line(("::ffff:10.244.1.9", 40200), ("::ffff:10.0.0.5", 9842),
                                          800), addresses=["10.244.1.9"])  # fmt: skip
    proc.process(4200, bob, [800])
    finder = PeerFinder(str(proc.root))
    assert finder.holders(pod6, agent6) == ([4100], None)
    # A dual-stack listener sees an IPv4 caller as ::ffff:a.b.c.d; its own table says IPv4.
    mapped = finder.holders(("::ffff:10.244.1.9", 40200), ("::ffff:10.0.0.5", 9842))
    assert mapped == ([4200], None)


def conntrack(proc, *lines):
    """The host's connection tracking (PID 1's network namespace), as the kernel writes it."""
    host = proc.namespace("host")
    proc.process(1, host)
    (proc.root / "1" / "net" / "nf_conntrack").write_text("".join(lines))


def tracked(caller, dialled, agent):
    """One tracked TCP connection: the caller dialled ``dialled``, DNAT gave it to ``agent``."""
    return (f"ipv4     2 tcp      6 431999 ESTABLISHED src={caller[0]} dst={dialled[0]} "
            f"sport={caller[1]} dport={dialled[1]} src={agent[0]} dst={caller[0]} "
            f"sport={agent[1]} dport={caller[1]} [ASSURED] mark=0 zone=0 use=2\n")  # fmt: skip


def test_destination_nat_is_undone_through_the_host_s_connection_tracking(proc):
    node = ("10.0.0.1", 9842)  # the caller dialled its node's address (the hostPort)
    alice = proc.namespace("alice", tcp=line(POD, node, 500), addresses=[POD[0]])
    proc.process(4100, alice, [500])
    conntrack(proc, tracked(("10.244.9.9", 5000), node, AGENT), tracked(POD, node, AGENT))
    assert PeerFinder(str(proc.root)).holders(POD, AGENT) == ([4100], None)


def test_a_socket_that_shares_only_the_caller_s_end_proves_nothing(proc):
    """Mallory forges bob's address and port and dials another of the agent's addresses: bob's
    socket has that end, but not the connection's other one (issue 45)."""
    other_address = ("10.0.0.6", 9842)
    bob = proc.namespace("bob", tcp=line(POD, other_address, 500), addresses=[POD[0]])
    proc.process(4100, bob, [500])
    conntrack(proc)  # nothing translated: the agent's own end is what she dialled
    held, reason = PeerFinder(str(proc.root)).holders(POD, AGENT)
    assert held == [] and "no socket on this node is exactly this connection" in reason
    assert "nothing is proven" in reason and "4100" not in reason


def test_source_nat_a_remote_caller_or_a_closed_socket_are_refused_with_the_reason(proc):
    alice = proc.namespace("alice", tcp=line(POD, AGENT, 500, state="06"), addresses=[POD[0]])
    proc.process(4100, alice, [500])
    held, reason = PeerFinder(str(proc.root)).holders(POD, AGENT)
    assert held == [] and "no socket on this node is exactly this connection" in reason
    assert "source NAT" in reason and "10.244.1.7:40112" in reason


def test_an_address_no_namespace_here_owns_is_refused_without_reading_a_table(proc):
    other = proc.namespace("other", tcp=line(POD, AGENT, 500), addresses=["10.244.9.9"])
    proc.process(4100, other, [500])
    (proc.root / "4100" / "net" / "tcp").unlink()  # never read
    held, reason = PeerFinder(str(proc.root)).holders(POD, AGENT)
    assert held == [] and "no network namespace on this node has the address 10.244.1.7" in reason


def test_a_socket_nobody_holds_any_more_is_refused(proc):
    alice = proc.namespace("alice", tcp=line(POD, AGENT, 500), addresses=[POD[0]])
    proc.process(4100, alice, [999])
    held, reason = PeerFinder(str(proc.root)).holders(POD, AGENT)
    assert held == [] and "no process holds the connecting socket (inode 500)" in reason


def test_two_namespaces_with_the_same_end_are_ambiguous_and_refused(proc):
    alice = proc.namespace("alice", tcp=line(POD, AGENT, 500), addresses=[POD[0]])
    mallory = proc.namespace("mallory", tcp=line(POD, ("10.0.0.99", 9842), 900),
                             addresses=[POD[0]])  # fmt: skip
    proc.process(4100, alice, [500])
    proc.process(4300, mallory, [900])
    # The exact 4-tuple wins over an end alone: mallory's socket goes elsewhere.
    assert PeerFinder(str(proc.root)).holders(POD, AGENT) == ([4100], None)
    mallory2 = proc.namespace("mallory2", tcp=line(POD, AGENT, 901), addresses=[POD[0]])
    proc.process(4400, mallory2, [901])
    held, reason = PeerFinder(str(proc.root)).holders(POD, AGENT)
    assert held == [] and "2 sockets on this node have the end" in reason


def test_bad_ends_and_malformed_tables_never_raise(proc):
    alice = proc.namespace("alice", tcp="garbage\n   1: XYZ:ZZ 00:00 01 0 0 0 0 0 0 abc\n",
                           addresses=[POD[0]])  # fmt: skip
    proc.process(4100, alice, [500])
    finder = PeerFinder(str(proc.root))
    assert finder.holders(("not an address", 1), AGENT)[1].startswith("the connection's ends")
    assert finder.holders(POD, AGENT)[0] == []
    assert PeerFinder(str(proc.root / "missing")).holders(POD, AGENT)[0] == []
    assert parse_tcp_table(HEADER + "x\n") == []


def test_this_machine_s_own_table_is_read_as_written():
    """The parser on the real /proc/self/net/tcp: a listening socket of ours is found."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        port = listener.getsockname()[1]
        with open("/proc/self/net/tcp") as table:
            found = parse_tcp_table(table.read())
        inode = os.stat(f"/proc/self/fd/{listener.fileno()}").st_ino
        mine = [s for s in found if s.inode == inode]
        assert len(mine) == 1 and mine[0].state == "0A"
        assert mine[0].local == (ipaddress.ip_address("127.0.0.1"), port)
    finally:
        listener.close()


def test_callers_from_elsewhere_cost_a_lookup_and_a_new_pod_is_found_once_the_map_is_old(proc):
    host = proc.namespace("host", addresses=["10.0.0.5"])
    proc.process(1, host)
    finder = PeerFinder(str(proc.root))
    for port in range(40000, 40050):  # a flood from another machine
        assert finder.holders(("192.0.2.9", port), AGENT)[0] == []
    assert finder.maps_made <= 2
    alice = proc.namespace("alice", tcp=line(POD, AGENT, 500), addresses=[POD[0]])
    proc.process(4100, alice, [500])  # a pod made after the map
    finder._map_at -= 1.0  # the map is a second old
    assert finder.holders(POD, AGENT) == ([4100], None)
