"""Issue 51 item 5: the culler speaks, against a real JupyterHub (tests/hub/conftest.py's).

What an administrator reads in the culler's log before removing ``--dry-run``: a start line
with what the hub says of the token (its owner and scopes, or which of the needed scopes it
lacks), its thresholds and whether it is a dry run; a dry run that fails, exit status 2,
where the real culler would (no token, a token the hub refuses, a missing scope, a hub that
does not answer); a line per round; the reason each time it takes a warning back; the config
file in the command line's words.
"""

from __future__ import annotations

import json
import secrets
import socket
import time

import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.hub.conftest import running_hub
from tests.hub.test_hub import POOL, START_JAX, Kernel, _jax_nbmem

pytestmark = pytest.mark.kernel

HALF_TOKEN = secrets.token_hex(24)
# A service whose role lacks one of the culler's two scopes.
_HALF = f"""
c.JupyterHub.services.append({{"name": "half-culler", "api_token": {HALF_TOKEN!r}}})
c.JupyterHub.load_roles.append({{
    "name": "half-culler", "services": ["half-culler"], "scopes": ["read:servers"],
}})
"""
NO_POOL = START_JAX.replace("\n", "\n%jaxalloc off\n", 1)  # a kernel without a pool


@pytest.fixture(scope="module")
def hub(simgpu_lib):
    with running_hub(simgpu_lib, extra_config=_HALF, prefix="jnm-cull-lines-") as started:
        yield started


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("jax-nbmem cull: ")]


def test_the_start_line_says_the_hub_s_word_on_the_token_and_a_dry_run_stops_where_the_culler_would(
    hub, tmp_path
):
    once = ["cull", "--once", "--dry-run", "--hub-url", hub.url, "--log", str(tmp_path / "log")]
    rc, out = _jax_nbmem(hub, *once, "--idle", "2h", token=hub.culler_token)
    assert rc == 0, out
    start = _lines(out)[0]
    assert start.startswith("jax-nbmem cull: started, dry run: it warns and stops nothing"), out
    assert f"hub {hub.url} (API {hub.url}/hub/api)" in start, start
    assert "token of service jax-nbmem-culler has the scopes read:servers and tokens" in start
    assert "--idle 2 h 00 min, --warn 10 min 00 s, one round (--once)" in start, start
    assert "round: " in _lines(out)[1], out
    logged = [json.loads(x) for x in (tmp_path / "log").read_text().splitlines()]
    assert [e["action"] for e in logged] == ["start"], logged  # rounds go to stdout only

    rc, out = _jax_nbmem(hub, *once, token=HALF_TOKEN)  # its role has read:servers only
    assert rc == 2, out
    assert "the token of service half-culler lacks tokens" in out, out
    assert "it needs the scopes read:servers and tokens" in out and "load_roles" in out, out
    assert "the dry run stops here: without --dry-run the culler would not start" in out, out

    rc, out = _jax_nbmem(hub, *once, token="not" + secrets.token_hex(20))
    assert rc == 2 and "the hub refused this token (HTTP 403)" in out, out

    rc, out = _jax_nbmem(hub, *once)  # no token at all
    assert rc == 2 and "no hub API token" in out and "(checked by --dry-run)" in out, out

    down = f"http://127.0.0.1:{_closed_port()}"
    args = ["cull", "--once", "--hub-url", down, "--log", str(tmp_path / "log")]
    rc, out = _jax_nbmem(hub, *args, "--dry-run", token=hub.culler_token)
    assert rc == 2, out
    assert "does not answer (connection refused: nothing listens at 127.0.0.1:" in out, out
    assert "the culler would start, and stop nothing until the hub answers" in out, out
    assert "refused this token" not in out, out
    rc, out = _jax_nbmem(hub, *args, token=hub.culler_token)  # in earnest it starts, and says
    assert rc == 0 and "started, in earnest" in out and "it starts anyway" in out, out


def test_each_round_says_what_it_saw_and_each_warning_taken_back_says_why(hub, tmp_path):
    alice, bob = Kernel(hub, hub.alice, "pool.ipynb"), Kernel(hub, hub.bob, "nopool.ipynb")
    try:
        alice.run(START_JAX)
        bob.run(NO_POOL)

        def gpu(total=80 * GIB, hers=True):
            state = SimState(hub.state_path).gpu(0, total=total)  # a new state each time
            if hers:
                state.process(0, alice.pid, POOL, ends_with_process=True)
            state.process(0, bob.pid, 300 << 20, ends_with_process=True).write()

        gpu()
        time.sleep(1.5)  # both idle past --idle 1
        log = ["--log", str(tmp_path / "log"), "--hub-url", hub.url]

        def cull(*more: str) -> list[str]:
            rc, out = _jax_nbmem(hub, "cull", "--once", "--idle", "1", *log, *more,
                                 token=hub.culler_token)  # fmt: skip
            assert rc == 0, out
            return _lines(out)

        said = cull("--warn", "600")
        warned = [x for x in said if f"warned kernel PID {alice.pid}" in x]
        assert warned and "unless it runs a cell" in warned[0], said
        assert said[-1].startswith("jax-nbmem cull: round: 2 kernels on the GPUs, 2 idle past "
                                   "--idle 1.00 s; warned 1, stopped 0"), said  # fmt: skip
        assert said[-1].endswith("skipped 1 (1 no pool)"), said

        reasons = [
            (lambda: gpu(total=400 * GIB), (), "free, enough for the", "a default JAX start"),
            (lambda: None, ("--exempt", hub.alice.name), f"its owner {hub.alice.name} is exempt"),
            (lambda: gpu(hers=False), (), "it is no longer on a GPU"),
            (lambda: alice.run("1 + 1"), ("--idle", "1h"), "it ran a cell", "under the --idle "
             "limit of 1 h"),
        ]  # fmt: skip
        for change, flags, *words in reasons:
            gpu()
            said = cull("--warn", "600")  # warned anew, or (the first time) still waiting
            assert any(f"warned kernel PID {alice.pid}" in x for x in said) or (
                "waiting for their deadline 1" in said[-1]), said  # fmt: skip
            change()
            said = cull("--warn", "600", *flags)
            back = [x for x in said if f"no longer culling kernel PID {alice.pid}" in x]
            assert back and all(w in back[0] for w in words), (words, said)
            assert "no longer qualifies" not in back[0], back
            assert "cancelled 1" in said[-1], said
            assert not list(hub.share_dir.glob("jax_nbmem-cull-*")), said

        gpu()
        time.sleep(1.5)  # she ran a cell above: idle past --idle 1 again
        cull("--warn", "0")
        said = cull("--warn", "0")
        assert any(f"culled: Stopped kernel PID {alice.pid}" in x for x in said), said
        assert "stopped 1" in said[-1] and "failed 0" in said[-1], said
    finally:
        alice.close()
        bob.close()


def test_the_config_file_keeps_the_command_line_s_words_and_a_bad_one_runs_nothing(hub, tmp_path):
    config = tmp_path / "cull.conf"
    rc, out = _jax_nbmem(hub, "cull", "--generate-config", str(config))
    assert rc == 0 and "idle = 3600" in config.read_text(), out
    rc, out = _jax_nbmem(hub, "cull", "--generate-config", str(config))
    assert rc == 2 and "the file exists and is left as it is" in out, out
    rc, printed = _jax_nbmem(hub, "cull", "--generate-config")
    assert rc == 0 and printed == config.read_text()
    for option in ("idle", "warn", "every", "share", "exempt", "dry-run", "once", "hub-url",
                   "share-dir", "log", "listen"):  # fmt: skip
        assert f"# --{option}: " in printed, option

    text = config.read_text().replace("dry-run = false", "dry-run = true")
    text = text.replace("# hub-url = http://127.0.0.1:8000", f"hub-url = {hub.url}")
    config.write_text(text.replace("idle = 3600", "idle = 2h") + "exempt = carol\n")
    base = ["cull", "--once", "--config", str(config), "--log", str(tmp_path / "log")]
    rc, out = _jax_nbmem(hub, *base, "--idle", "90m", token=hub.culler_token)
    assert rc == 0, out
    start = _lines(out)[0]
    assert "started, dry run" in start and "--idle 1 h 30 min" in start, start  # the flag wins
    assert "exempt: carol" in start and f"hub {hub.url}" in start, start

    config.write_text(text.replace("warn = 600", "warn = soon"))
    rc, out = _jax_nbmem(hub, *base, token=hub.culler_token)
    assert rc == 2 and "started" not in out, out
    number = text.splitlines().index("warn = 600") + 1
    assert f"{config} line {number}: warn: --warn takes seconds like 3600" in out, out
    assert "fix the value; nothing runs" in out, out
