"""Issue 37 item 8, on a plain host: mallory aims root's stop and the hub's token at bob.

Bob and mallory are real Unix users, each with a Jupyter server (a stand-in: its runtime
file, its ``api/kernels``, kernels as its children). Mallory's kernel lies, as the review
found one could: its beacon names bob's kernel id (the resolution is world-readable), its
``$JPY_PARENT_PID`` names bob's server, it claims bob's hub user, its command line names
bob's kernel. Root's ``jax-nbmem shutdown <mallory's PID> --yes``, with or without a hub
token, never asks bob's server for anything, and says which claim contradicts which fact;
bob's kernel keeps running. Honest kernels are still stopped, through their own server.
"""

from __future__ import annotations

import psutil
import pytest

from jax_nbmem.cli.command import main
from tests.hostile.conftest import HUB_TOKEN, StandInHub
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)


def _shutdown(capsys, pid: int, *args: str) -> tuple[int, str]:
    code = main(["shutdown", str(pid), "--yes", *args])
    said = capsys.readouterr()
    return code, said.out + said.err


def _bobs(servers):
    bob = servers.server(servers.bob, [{"id": "b0b0b0b0-bob-kernel"}])
    return bob, bob.kernels["b0b0b0b0-bob-kernel"]


def test_a_beacon_naming_bobs_kernel_and_a_parent_naming_bobs_server_stop_nothing(servers, capsys):
    bob, bobs_kernel = _bobs(servers)
    mallory = servers.server(servers.mallory, [{
        "id": "3a11-mallory", "env": {"JPY_PARENT_PID": str(bob.pid)},
        "beacon": {"kernel_id": "b0b0b0b0-bob-kernel", "hub_user": servers.bob.name},
    }])  # fmt: skip
    hers = mallory.kernels["3a11-mallory"]
    code, said = _shutdown(capsys, hers, "--share-dir", str(servers.share))
    assert code == 1 and "nothing done" in said, said
    assert "its claims contradict what the host proves" in said
    assert f"to stop this very process regardless, signal it: kill {hers}" in said
    assert f"its JPY_PARENT_PID names PID {bob.pid}, which is not one of its real ancestors" in (
        said
    )
    beacon_lie = "its beacon claims kernel id b0b0b0b0-bob-kernel, but its own command line"
    assert f"{beacon_lie} names kernel-3a11-mallory.json" in said
    assert bob.deletes() == [] and mallory.deletes() == []
    assert psutil.pid_exists(bobs_kernel) and psutil.pid_exists(hers)


def test_a_forged_parent_alone_is_refused_by_name(servers, capsys):
    bob, bobs_kernel = _bobs(servers)
    mallory = servers.server(servers.mallory, [
        {"id": "3a11-forged-parent", "env": {"JPY_PARENT_PID": str(bob.pid)}}])  # fmt: skip
    hers = mallory.kernels["3a11-forged-parent"]
    code, said = _shutdown(capsys, hers)
    assert code == 1 and f"its JPY_PARENT_PID names PID {bob.pid}" in said, said
    assert f"real ancestors ({mallory.pid}" in said
    assert bob.deletes() == [] and psutil.pid_exists(bobs_kernel) and psutil.pid_exists(hers)


def test_a_command_line_naming_bobs_kernel_is_asked_of_her_own_server_only(servers, capsys):
    bob, bobs_kernel = _bobs(servers)
    # Her server starts her kernel with bob's kernel id in its command line; nothing else lies.
    mallory = servers.server(servers.mallory, [
        {"id": "3a11-own", "command_line_id": "b0b0b0b0-bob-kernel"}])  # fmt: skip
    hers = mallory.kernels["3a11-own"]
    code, said = _shutdown(capsys, hers)
    assert code == 1, said
    assert "kernel b0b0b0b0-bob-kernel is not on the list of its server" in said
    assert f"127.0.0.1:{mallory.port}" in said and "nothing done" in said
    assert bob.deletes() == [] and mallory.deletes() == []
    assert psutil.pid_exists(bobs_kernel) and psutil.pid_exists(hers)


def test_an_honest_kernel_is_stopped_through_its_own_server(servers, capsys):
    bob, bobs_kernel = _bobs(servers)
    code, said = _shutdown(capsys, bobs_kernel, "--log", str(servers.folder / "admin.log"))
    assert code == 0, said
    assert f"through its Jupyter server http://127.0.0.1:{bob.port}/" in said
    assert bob.deletes() == ["b0b0b0b0-bob-kernel"]
    wait_for("bob's kernel gone", lambda: not psutil.pid_exists(bobs_kernel), 30)


def test_with_a_hub_token_the_claimed_hub_user_is_not_whose_server_is_asked(servers, capsys):
    bob, bobs_kernel = _bobs(servers)
    mallory = servers.server(servers.mallory, [
        {"id": "3a11-hub", "beacon": {"hub_user": servers.bob.name, "kernel_id": "3a11-hub"}},
        {"id": "3a11-quiet", "command_line_id": "b0b0b0b0-bob-kernel"},
    ])  # fmt: skip
    hub = StandInHub({servers.bob.name: bob, servers.mallory.name: mallory})
    try:
        hub_args = ["--hub-url", hub.url, "--share-dir", str(servers.share)]
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
            patch.delenv("JUPYTERHUB_API_URL", raising=False)
            code, said = _shutdown(capsys, mallory.kernels["3a11-hub"], *hub_args)
            assert code == 1, said
            assert f"it claims hub user {servers.bob.name}, but it runs as Unix user " in said
            assert f"{servers.mallory.name}, whose server the hub is asked for" in said
            # No claimed hub user, bob's kernel id on its command line: her own server is
            # asked (the hub's record of the proven owner), and its list does not have it.
            code, said = _shutdown(capsys, mallory.kernels["3a11-quiet"], *hub_args)
            assert code == 1, said
            assert "kernel b0b0b0b0-bob-kernel is not on the list of the server " in said
            assert f"/user/{servers.mallory.name}/" in said
        assert hub.deletes() == [], hub.requests
        assert not any(f"/user/{servers.bob.name}/" in path for _, path in hub.requests)
        assert bob.deletes() == [] and psutil.pid_exists(bobs_kernel)
    finally:
        hub.close()
