"""A pod that forges another pod's source address is not proven as that pod (issue 45 item 2).

Two pods (network namespaces) on one bridge with the node, the agent on ``--agent-listen``
(every address of the node). Bob's kernel proves itself over TCP. Mallory, with a pod's
default CAP_NET_RAW, poisons the node's ARP entry for bob's address (real ARP replies from her
namespace), takes bob's address as her own and connects *from bob's address and source port*
to the node's other address, claiming bob's process. Only a socket with the connection's exact
4-tuple proves anything: bob's has the same source but another destination, so she is refused,
and the refusal names nothing of bob's. And a caller behind destination NAT (the DaemonSet's
hostPort, an iptables DNAT rule here) is proven exactly, through the host's connection
tracking. Root only.
"""

import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from jax_nbmem.agent.server import AgentServer, Registry
from tests.agent.namespaces import need_namespaces

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "tests" / "agent" / "agent_client_net.py"


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=20).stdout


class Bridge:
    """A bridge with the node's two addresses (.1, .100) and two pods on it (.2, .3)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        self.bridge = f"jnbr{tag}"[:15]
        self.network = f"10.{random.randrange(213, 255)}.{random.randrange(256)}"
        self.pods: dict[str, str] = {}

    def up(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        for host in (1, 100):
            _run("ip", "addr", "add", f"{self.network}.{host}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for number, name in ((2, "bob"), (3, "mallory")):
            netns, veth = f"{self.bridge}{name[0]}", f"{self.bridge}{name[0]}"[:13] + "v"
            _run("ip", "netns", "add", netns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            inside = ["ip", "netns", "exec", netns, "ip"]
            _run(*inside, "addr", "add", f"{self.network}.{number}/24", "dev", "eth0")
            _run(*inside, "link", "set", "eth0", "up")
            _run(*inside, "link", "set", "lo", "up")
            self.pods[name] = netns

    def down(self) -> None:
        for netns in self.pods.values():
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=20)

    def mac(self, netns: str | None, interface: str) -> str:
        prefix = ["ip", "netns", "exec", netns] if netns else []
        return _run(*prefix, "cat", f"/sys/class/net/{interface}/address").strip()


@pytest.fixture
def bridge():
    need_namespaces()
    made = Bridge()
    try:
        made.up()
        yield made
    finally:
        made.down()


def _arp_reply(mine: str, node_mac: str, claimed: str, node_ip: str) -> bytes:
    """An ARP reply, as a raw frame: ``claimed`` is at ``mine`` (sent to the node)."""
    mac = [bytes.fromhex(m.replace(":", "")) for m in (mine, node_mac)]
    ips = [socket.inet_aton(ip) for ip in (claimed, node_ip)]
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 2, mac[0], ips[0], mac[1], ips[1])
    return mac[1] + mac[0] + b"\x08\x06" + arp


def _in(netns: str, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


_SEND_RAW = """
import socket, sys, time
frame = bytes.fromhex(sys.argv[1])
with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
    raw.bind(("eth0", 0))
    for _ in range(int(sys.argv[2])):
        raw.send(frame)
        time.sleep(0.2)
"""

_SPOOF = """
import json, socket, sys
source, target, content = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
sock = socket.socket()
sock.bind(tuple(source))
sock.settimeout(20)
sock.connect(tuple(target))
sock.sendall(content.encode() + b"\\n")
print(sock.makefile().readline().strip())
"""


def test_a_forged_source_after_arp_poisoning_proves_nothing(bridge):
    network = bridge.network
    empty = json.dumps({"schema": 1, "processes": []})
    agent = AgentServer(None, Registry(), tcp=("0.0.0.0", 0), first_line_s=30.0,
                        resolution=lambda pid: (1000.0, empty))  # fmt: skip
    agent.start()
    bob = None
    try:
        port = agent.tcp_address[1]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        bob = subprocess.Popen(
            ["ip", "netns", "exec", bridge.pods["bob"], "unshare", "--pid", "--fork",
             "--mount-proc", sys.executable, str(CLIENT),
             f"{network}.1:{port}", "[{}]"], stdout=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        said = json.loads(bob.stdout.readline())
        assert said["ok"], said
        bob_pid = said["pid"]  # his host PID (his PID in his own namespace is 1)
        bob.stdout.readline()  # the resolution
        assert bob.stdout.readline().strip() == "READY"
        (connection,) = [c for c in agent._connections.values() if c.proven]
        bob_port = connection.peer[0][1]
        identity = agent.registry.proven()[bob_pid].content["identity"]
        # Mallory: bob's address as her own, then the node told (by ARP) that it is at her MAC.
        mallory = bridge.pods["mallory"]
        _run("ip", "netns", "exec", mallory, "ip", "addr", "add", f"{network}.2/32", "dev", "eth0")
        frame = _arp_reply(bridge.mac(mallory, "eth0"), bridge.mac(None, bridge.bridge),
                           f"{network}.2", f"{network}.1")  # fmt: skip
        sent = _in(mallory, _SEND_RAW, frame.hex(), "15")
        assert sent.returncode == 0, sent.stderr
        neighbour = _run("ip", "neigh", "show", f"{network}.2", "dev", bridge.bridge)
        assert bridge.mac(mallory, "eth0") in neighbour, neighbour  # the node is poisoned
        forged = {"schema": 1, "pid": identity["pid_in_ns"], "started_at": 1.0,
                  "hub_user": "mallory", "kernel_id": "forged", "notebook": "mallory.ipynb",
                  "identity": identity, "cell_running": False}  # fmt: skip
        spoof = _in(mallory, _SPOOF, json.dumps([f"{network}.2", bob_port]),
                    json.dumps([f"{network}.100", port]), json.dumps(forged))  # fmt: skip
        answer = json.loads(spoof.stdout or "{}")
        assert answer.get("ok") is False, (answer, spoof.stderr)
        assert str(bob_pid) not in answer["reason"]  # nothing of bob's is named to her
        kept = agent.registry.proven()[bob_pid]
        assert kept.content.get("hub_user") != "mallory"  # bob's registration stands as his
    finally:
        if bob is not None:
            os.killpg(bob.pid, 9)
            bob.wait(20)
        agent.stop()


def test_a_caller_behind_destination_nat_is_proven_through_connection_tracking(bridge):
    """As the DaemonSet's hostPort does: bob dials the node's address, a DNAT rule delivers
    the connection to the agent's; the agent undoes it through nf_conntrack, exactly."""
    if shutil.which("iptables") is None:
        pytest.fail("iptables is missing: .ci/system-deps.sh installs it")
    network = bridge.network
    empty = json.dumps({"schema": 1, "processes": []})
    agent = AgentServer(None, Registry(), tcp=(f"{network}.100", 0), first_line_s=30.0,
                        resolution=lambda pid: (1000.0, empty))  # fmt: skip
    agent.start()
    port = agent.tcp_address[1]
    rule = ["PREROUTING", "-i", bridge.bridge, "-p", "tcp", "-d", f"{network}.1", "--dport",
            str(port + 1), "-j", "DNAT", "--to-destination", f"{network}.100:{port}"]  # fmt: skip
    _run("iptables", "-t", "nat", "-A", *rule)
    bob = None
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        bob = subprocess.Popen(
            ["ip", "netns", "exec", bridge.pods["bob"], "unshare", "--pid", "--fork",
             "--mount-proc", sys.executable, str(CLIENT), f"{network}.1:{port + 1}", "[{}]"],
            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )  # fmt: skip
        said = json.loads(bob.stdout.readline())
        assert said["ok"], said
        (connection,) = agent._connections.values()
        assert connection.sock.getsockname()[:2] == (f"{network}.100", port)  # NATed to it
    finally:
        subprocess.run(["iptables", "-t", "nat", "-D", *rule], capture_output=True, timeout=20)
        if bob is not None:
            os.killpg(bob.pid, 9)
            bob.wait(20)
        agent.stop()
