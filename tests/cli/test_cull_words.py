"""The culler's words without a hub: its config file, its round line, its reasons, and what
"does not answer" is said as (the real hub's answers: tests/admin/test_culler_lines.py)."""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import threading

import pytest

from jax_nbmem.cli.cullconfig import ConfigError, generate_config, read_config, settle
from jax_nbmem.cli.cullround import RoundTally, why_no_longer
from jax_nbmem.cli.hubapi import Hub
from jax_nbmem.cli.hubcheck import check_token
from jax_nbmem.node.notices import Notice
from jax_nbmem.tenants.culling import CullPolicy, NotCulled, assess


def test_the_generated_config_reads_back_as_every_default(tmp_path):
    path = tmp_path / "cull.conf"
    path.write_text(generate_config())
    assert read_config(path) == {"idle": 3600.0, "warn": 600.0, "every": 60.0,
                                 "dry-run": False, "once": False}  # fmt: skip
    args = settle(argparse.Namespace(config=None))
    assert (args.idle, args.warn, args.share, args.exempt, args.hub_url) == (
        3600.0, 600.0, None, [], None)  # fmt: skip


def test_flags_win_over_the_file_and_a_file_s_list_is_replaced(tmp_path):
    path = tmp_path / "cull.conf"
    path.write_text("idle = 2h\nexempt = alice\nexempt = bob\ndry-run = yes\nshare = 0.5\n")
    args = settle(argparse.Namespace(config=path, idle=60.0, exempt=["carol"]))
    assert (args.idle, args.exempt, args.dry_run, args.share) == (60.0, ["carol"], True, 0.5)
    args = settle(argparse.Namespace(config=path, dry_run=False))
    assert args.exempt == ["alice", "bob"] and args.dry_run is False and args.idle == 7200.0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("idle 3600\n", "line 1: 'idle 3600' is not NAME = VALUE"),
        ("# fine\nidel = 3\n", "line 2: 'idel' is no setting of jax-nbmem cull"),
        ("idle = 1h\nidle = 2h\n", "line 2: idle is set a second time; keep one"),
        ("dry-run = maybe\n", "line 1: dry-run is true or false, not 'maybe'"),
        ("share = 1.5\n", "line 1: share: --share must be in (0, 1], got 1.5; fix the value"),
        ("every = 0\n", "line 1: every: --every must be > 0"),
        ("hub-url = localhost:8000\n", "line 1: hub-url: --hub-url takes the hub's http(s)"),
        ("warn = \x1b[2J\n", "line 1: warn: --warn takes seconds like 3600, or 10m, 1h, 2d; "
         "got '\\x1b[2J'"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_the_file_the_line_and_the_fix(tmp_path, text, said):
    path = tmp_path / "cull.conf"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        read_config(path)
    assert str(refused.value).startswith(f"{path} ") and said in str(refused.value), refused.value


def test_an_unreadable_file_is_said():
    with pytest.raises(ConfigError, match=r"--config /no/such/file: cannot read it"):
        read_config(__import__("pathlib").Path("/no/such/file"))


def _report(free_gib: float, idle: float | None, preallocated: bool = True) -> dict:
    gib = 1 << 30
    return {
        "gpus": [{"index": 0, "total_bytes": 80 * gib, "free_bytes": int(free_gib * gib)}],
        "processes": [{"pid": 7, "gpu": 0, "kind": "kernel", "idle_s": idle,
                       "preallocated": preallocated, "used_bytes": 60 * gib}],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("report", "short", "words"),
    [
        (_report(10, 0), "busy", "it is running a cell"),
        (_report(10, None), "idle unknown", "how long it has been idle is unknown"),
        (_report(10, 30), "active", "it ran a cell 30.0 s ago, under the --idle limit of 1 min"),
        (_report(70, 600), "GPU has room", "free, enough for the 60.0 GiB a default JAX start"),
        (_report(10, 600, False), "no pool", "it holds no preallocated pool"),
    ],
)  # fmt: skip
def test_every_kernel_not_culled_has_its_reason(report, short, words):
    (verdict,) = assess(report, CullPolicy(idle_s=60)).values()
    assert isinstance(verdict, NotCulled) and verdict.short == short, verdict
    assert words in verdict.why, verdict.why
    assert why_no_longer(7, verdict, None, None, None) == verdict.why


def test_a_change_of_mind_names_an_exited_kernel_a_reused_pid_and_an_exempt_owner():
    (candidate,) = assess(_report(10, 600), CullPolicy(idle_s=60)).values()
    assert "no longer on a GPU" in why_no_longer(None, None, None, None, None)
    old = Notice(pid=7, started_at=100.0, warned_at=1, deadline=2, reason="r", why="w")
    said = why_no_longer(7, candidate, None, old, 200.0)
    assert said == "the warned kernel exited: PID 7 is another process now"
    exempt = "its owner alice is exempt (--exempt)"
    assert why_no_longer(7, candidate, exempt, old, 100.0) == exempt


def test_the_round_line_counts_idle_kernels_skipped_by_reason():
    verdicts = assess(_report(70, 600), CullPolicy(idle_s=60))
    tally = RoundTally.of(verdicts, {})
    tally.done["warn"] += 0
    line = tally.line(60, dry_run=True)
    assert line.startswith("round: 1 kernel on the GPUs, 1 idle past --idle 1 min 00 s; "
                           "would warn 0, would stop 0"), line  # fmt: skip
    assert line.endswith("skipped 1 (1 GPU has room)"), line


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Answers(http.server.BaseHTTPRequestHandler):
    answers: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, body = self.answers[self.headers["Authorization"]]
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _hub(address: str, token: str = "t", scheme: str = "http") -> Hub:
    return Hub(url=f"{scheme}://{address}", api_url=f"{scheme}://{address}/hub/api", token=token)


def test_no_answer_is_said_as_what_it_is_and_never_as_a_refused_token(answering):
    closed = check_token(_hub(f"127.0.0.1:{_closed_port()}"))
    assert closed.no_answer and not closed.fatal, closed
    assert "does not answer (connection refused: nothing listens at 127.0.0.1:" in closed.words
    tls = check_token(_hub(answering, scheme="https"))
    assert tls.no_answer and f"TLS with {answering} failed" in tls.words, tls
    for said in (closed.words, tls.words):
        assert "refused this token" not in said


def test_the_hub_s_word_on_the_token_refused_or_short_of_a_scope(answering):
    _Answers.answers = {
        "token bad": (403, {"status": 403, "message": "Missing or invalid credentials."}),
        "token half": (200, {"kind": "service", "name": "half", "scopes": [
            "read:servers", "tokens!user=alice"]}),
        "token good": (200, {"kind": "user", "name": "admin", "scopes": [
            "read:servers", "tokens", "admin:server_state"]}),
    }  # fmt: skip
    bad = check_token(_hub(answering, "bad"))
    assert bad.refused and bad.fatal and "the hub refused this token (HTTP 403)" in bad.words
    half = check_token(_hub(answering, "half"))
    assert half.missing == ("tokens",) and half.fatal, half
    assert "lacks tokens (it has only tokens!user=alice, limited to some)" in half.words
    assert "it needs the scopes read:servers and tokens" in half.words
    good = check_token(_hub(answering, "good"))
    assert good.ok and good.words == (
        "token of user admin has the scopes read:servers and tokens; admin:server_state too"
    )
