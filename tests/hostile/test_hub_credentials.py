"""Issue 44 item 2: what a user's server can turn of root's stop and the culler, through a hub.

Bob and mallory are real Unix users with stand-in servers behind a stand-in hub that answers
as JupyterHub does (its API, the proxy's routes, tokens it issues for one server). Mallory's
server is hostile: it answers ``api/kernels`` with a redirect to her own collector, or trickles
its answer one byte at a time, each byte well within any per-read timeout.

- The administrator's hub token (root's, the culler's) goes to the hub's API only; a user's
  server gets a token the hub issued for that server alone, revoked once used.
- No redirect is followed: her collector receives nothing, with or without a credential.
- Every exchange ends by its deadline, and the whole stop by ``--deadline``; a trickling
  server is cut off, and it delays no other user's cull in the same round.
"""

from __future__ import annotations

import io

import psutil
import pytest

from jax_nbmem.agent.hostproof import host_proof
from jax_nbmem.cli.command import main
from jax_nbmem.cli.culler import Culler
from jax_nbmem.cli.hubapi import REQUEST_S, Hub
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.culling import CullPolicy
from jax_nbmem.tenants.status import collect
from tests.hostile.conftest import HUB_TOKEN, Collector, StandInHub
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(240)

_IDLE_POOL = {"mode_requested": "on", "mode_in_effect": "on", "pool_fraction": 0.75}
_TRICKLE_S = 0.5  # a listing of ~70 bytes takes ~35 s: far past REQUEST_S, never a read timeout


def _shutdown(capsys, hub: StandInHub, share, pid: int, *args: str) -> tuple[int, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
        patch.delenv("JUPYTERHUB_API_URL", raising=False)
        code = main(["shutdown", str(pid), "--yes", "--hub-url", hub.url, "--share-dir",
                     str(share), "--log", str(share.parent / "admin.log"), *args])  # fmt: skip
    said = capsys.readouterr()
    return code, said.out + said.err


def _only_server_tokens_reached_servers(hub: StandInHub) -> None:
    assert hub.presented, "no user's server was asked"
    assert all(kind.startswith("server:") for _, kind in hub.presented), hub.presented
    for path, kind in hub.presented:
        assert path.startswith(f"/user/{kind.removeprefix('server:')}/"), (path, kind)
    assert set(hub.issued.values()) <= set(hub.servers)
    # Revoked once used: a stop given up by --deadline finishes its exchange by its own.
    wait_for("every server token revoked", lambda: sorted(hub.revoked) == sorted(hub.issued),
             REQUEST_S + 10)  # fmt: skip


def test_a_redirect_from_her_server_reaches_her_collector_with_nothing(servers, capsys):
    collector = Collector()
    mallory = servers.server(servers.mallory, [{"id": "ma11-redirect"}], redirect=collector.url)
    hub = StandInHub({servers.mallory.name: mallory})
    try:
        code, said = _shutdown(capsys, hub, servers.share, mallory.kernels["ma11-redirect"])
        assert code == 1 and "nothing done" in said, said
        assert f"with a redirect to {collector.url}, which is not followed" in said
        assert collector.received == []
        _only_server_tokens_reached_servers(hub)
        assert HUB_TOKEN not in said and not any(t in said for t in hub.issued)
        assert psutil.pid_exists(mallory.kernels["ma11-redirect"])
    finally:
        hub.close()
        collector.close()


def test_a_trickling_server_is_cut_off_by_the_deadline_and_the_stop_by_its_own(servers, capsys):
    mallory = servers.server(servers.mallory, [{"id": "ma11-trickle"}], trickle_s=_TRICKLE_S)
    hers = mallory.kernels["ma11-trickle"]
    hub = StandInHub({servers.mallory.name: mallory})
    try:
        code, said = _shutdown(capsys, hub, servers.share, hers)
        assert code == 1, said
        assert f"does not answer (no full answer within {REQUEST_S:g} s: " in said
        assert said.rstrip().endswith("given up; nothing done.")
        assert mallory.deletes() == [] and psutil.pid_exists(hers)
        code, said = _shutdown(capsys, hub, servers.share, hers, "--deadline", "2")
        assert code == 1, said
        assert "not finished within --deadline 2 s, so given up" in said
        _only_server_tokens_reached_servers(hub)
    finally:
        hub.close()


def test_her_trickling_server_delays_no_other_users_cull(servers, simgpu_in_process, tmp_path):
    pool = {**_IDLE_POOL, "pool_fraction": 0.45}  # two such pools leave 8 GiB free of 80
    bob = servers.server(servers.bob, [{"id": "b0b-idle", "beacon": pool}])
    mallory = servers.server(servers.mallory, [{"id": "ma11-idle", "beacon": pool}],
                             trickle_s=_TRICKLE_S)  # fmt: skip
    his, hers = bob.kernels["b0b-idle"], mallory.kernels["ma11-idle"]
    simgpu_in_process.gpu(0, total=80 * GIB).process(0, hers, 36 * GIB)
    simgpu_in_process.process(0, his, 36 * GIB).write()
    hub = StandInHub({servers.bob.name: bob, servers.mallory.name: mallory})
    api = Hub(url=hub.url, api_url=hub.url + "/hub/api", token=HUB_TOKEN)
    policy = CullPolicy(idle_s=60, warn_s=0)
    culler = Culler(policy, str(servers.share), api, out=io.StringIO(), log_path=tmp_path / "log")
    try:
        host = host_proof(str(servers.share))
        report = collect(share_dir=str(servers.share), host=host)
        report["processes"].sort(key=lambda p: p["pid"] != hers)  # hers is asked first
        warned = culler.round(report=report, host=host)
        assert sorted(e["action"] for e in warned) == ["warn", "warn"], warned
        done = {e["pid"]: e for e in culler.round(report=report, host=host)}
        assert done[his]["action"] == "cull", done[his]
        assert done[hers]["action"] == "error", done[hers]
        assert f"does not answer (no full answer within {REQUEST_S:g} s: " in done[hers]["message"]
        wait_for("bob's kernel gone", lambda: not psutil.pid_exists(his), 30)
        assert bob.deletes() == ["b0b-idle"] and mallory.deletes() == []
        (bobs_delete,) = [t for t in hub.timeline if t[0] == "DELETE"]
        hers_asked = f"/user/{servers.mallory.name}/"
        (her_list,) = wait_for("her exchange over", lambda: [
            t for t in hub.timeline if hers_asked in t[1]], 60)  # fmt: skip
        assert bobs_delete[2] < her_list[3], "bob's cull waited for her trickling server"
        _only_server_tokens_reached_servers(hub)
    finally:
        hub.close()
