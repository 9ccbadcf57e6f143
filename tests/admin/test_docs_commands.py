"""Every shell command the pages give is one a test runs, or one the real parser accepts.

The commands are those of the pages' ``bash`` blocks (README.md and docs/), a line each (a
trailing backslash joins lines, a ``#`` starts a comment). A ``jax-nbmem`` command line, there
or in a page's inline code, parses with the command's own argparse parser; a synopsis (with
``[...]``) names only options its subcommand has. Each other command is run by the test that
``RUN_BY`` names, which holds the command's own words; a ``systemctl`` line names a unit that
exists. Every block is valid bash.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jax_nbmem.cli.command import _parser
from tests.jupyterlab import REPO_ROOT

markdown_it = pytest.importorskip("markdown_it")

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]

# A command's first words → (the test that runs it, words of the command that test holds).
RUN_BY = {
    "python benchmarks/gpu_check.py": ("tests/test_gpu_check.py", "gpu_check.py"),
    "podman system service": ("tests/podman/test_podman_spawner.py", "system service"),
    "install -d -m 0755 /etc/jax_nbmem": ("tests/podman/test_podman_spawner.py", "podman-passwd"),
    "printf 'root:x:0:0": ("tests/podman/test_podman_spawner.py", "podman-passwd"),
    "chmod 0644 /etc/jax_nbmem/passwd": ("tests/podman/test_podman_spawner.py", "podman-passwd"),
    "python3 -m venv /opt/jax_nbmem": ("tests/test_release.py", '"venv"'),
    "cp deploy/jax-nbmem-exporter.service": (
        "tests/deploy/test_systemd.py",
        "jax-nbmem-exporter.service",
    ),
    "cp deploy/jax-nbmem-exporter.tmpfiles": (
        "tests/deploy/test_systemd.py",
        "jax-nbmem-exporter.tmpfiles",
    ),
    "cp deploy/jax-nbmem-exporter.env": ("tests/deploy/test_systemd.py", "jax-nbmem-exporter.env"),
    "install -d -m 1777 /var/tmp/jax_nbmem": (
        "tests/node/test_share_dir.py",
        "install -d -m 1777",
    ),
    "sudo install -d -m 1777 /var/tmp/jax_nbmem": (
        "tests/node/test_share_dir.py",
        "install -d -m 1777",
    ),
    'printf %s "$(openssl rand -hex 32)"': ("tests/deploy/kubernetes.py", "culler-token"),
    "python3 -m venv .venv": ("tests/test_release.py", '"venv"'),
    "pip install -e": ("tests/test_release.py", '"pip", "install"'),
    "bash scripts/quickstart.sh": ("tests/test_quickstart_script.py", "quickstart.sh"),
    "bash scripts/test.sh": ("tests/test_ci_deps.py", "scripts/test.sh"),
    "python -m build": ("tests/test_release.py", '"build"'),
    "install -d -m 0700 /etc/jupyterhub/jax-nbmem": ("tests/hub/test_admin_token.py", "bash"),
    "(umask 077": ("tests/hub/test_admin_token.py", "bash"),
    "curl -s -H": ("tests/hub/test_admin_token.py", "curl"),
    "mkdir -p ~/.jupyter/jupyter_server_config.d": (
        "tests/server/test_extension_toggle.py",
        "jupyter_server_config.d",
    ),
    'echo \'{"ServerApp"': ("tests/server/test_extension_toggle.py", "jpserver_extensions"),
    "/opt/jax_nbmem/bin/pip install": ("tests/test_release.py", '"pip", "install"'),
    "/opt/jax_nbmem/bin/python -c": ("tests/cli/test_webconfig_hash_doc.py", "bcrypt"),
}
# What no test here can run, and why; checked for its words only.
ON_PAPER = {
    "helm upgrade --install jhub jupyterhub/jupyterhub": "no cluster in CI (docs/versions.md)",
    # The overlay it applies is rendered by `kubectl kustomize` and validated: tests/deploy/.
    "kubectl apply -k deploy/kubernetes/overlays/z2jh": "no cluster in CI (docs/versions.md)",
}


def _blocks() -> list[tuple[str, str]]:
    """(page, text) of every bash block of the pages."""
    parser = markdown_it.MarkdownIt()
    found = []
    for page in PAGES:
        for token in parser.parse(page.read_text(encoding="utf-8")):
            if token.type == "fence" and token.info.strip() == "bash":
                found.append((page.relative_to(REPO_ROOT).as_posix(), token.content))
    return found


def _commands(block: str) -> list[str]:
    """The block's command lines: continuation lines joined, comments and blanks left out."""
    lines = block.replace("\\\n", " ").splitlines()
    kept = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [line.split(" # ")[0].strip() for line in kept]


def _jax_nbmem_words(command: str) -> list[str] | None:
    """The arguments of a ``jax-nbmem`` command line (after ``VAR=…`` and sudo), else None."""
    words = shlex.split(re.sub(r"\$\([^)]*\)", "X", command).replace("...", "X"), comments=True)
    while words and (re.match(r"[A-Z_]+=", words[0]) or words[0] == "sudo"):
        words.pop(0)
    return words[1:] if words and words[0] == "jax-nbmem" else None


def _options(parser: argparse.ArgumentParser, words: list[str]) -> set[str]:
    """The options of the (sub)command ``words`` names."""
    for word in words:
        sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if sub and word in sub[0].choices:
            parser = sub[0].choices[word]
    return {option for action in parser._actions for option in action.option_strings}


def _parses(words: list[str]) -> str | None:
    """None when the real parser accepts ``words`` (``--version`` and ``--help`` too), else why."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            _parser().parse_args(words)
    except SystemExit as done:
        return None if done.code == 0 else said.getvalue().strip()
    return None


def _inline_jax_nbmem() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for span in re.findall(r"`(jax-nbmem [^`]+)`", page.read_text(encoding="utf-8")):
            if not span.split()[1].endswith(":"):  # "jax-nbmem cull: …" is a message, no command
                found.append((page.name, span))
    return found


def test_every_jax_nbmem_command_line_of_the_pages_parses_with_the_real_parser():
    lines = [(page, c, True) for page, block in _blocks() for c in _commands(block)]
    lines += [(page, span, False) for page, span in _inline_jax_nbmem()]
    checked, wrong = 0, []
    for page, command, whole in lines:
        words = _jax_nbmem_words(command)
        if words is None:
            continue
        checked += 1
        if not whole or "[" in command or "…" in command or "|" in command:
            named = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w.-]*)", command))
            unknown = named - _options(_parser(), words)
            if unknown:
                wrong.append(f"{page}: {command}: no such option {sorted(unknown)}")
        elif said := _parses(words):
            wrong.append(f"{page}: {command}: {said}")
    assert checked >= 25
    assert wrong == []


def test_the_checks_refuse_an_option_the_command_lacks_and_a_command_no_test_runs():
    assert _parses(["status", "--json"]) is None
    assert "unrecognized" in _parses(["status", "--no-such-option"])
    assert "--no-such" not in _options(_parser(), ["exporter"])
    assert "--web.config.file" in _options(_parser(), ["exporter"])
    assert _unaccounted("x.md", "rm -r /var/tmp/jax_nbmem") == (
        "x.md: rm -r /var/tmp/jax_nbmem: no test named in RUN_BY"
    )
    assert _unaccounted("x.md", "systemctl enable --now no-such-unit") is not None


def _unit_is_there(command: str) -> bool:
    """Whether the unit a ``systemctl`` line names ships with its program or in deploy/."""
    unit = command.split()[-1]
    unit = unit if "." in unit else unit + ".service"
    places = [REPO_ROOT / "deploy", Path("/lib/systemd/system"), Path("/usr/lib/systemd/system")]
    return unit == "jax-nbmem-exporter.service" or any((p / unit).exists() for p in places)


def _unaccounted(page: str, command: str) -> str | None:
    """Why no test is known to run ``command`` (not a ``jax-nbmem`` one), or None."""
    if command.startswith("systemctl "):
        return None if _unit_is_there(command) else f"{page}: {command}: no such unit"
    if command.startswith(tuple(ON_PAPER)) or "jax_nbmem.simgpu " in command:
        return None  # the simulated GPU's commands: the test below
    runner = [v for k, v in RUN_BY.items() if command.startswith(k)]
    if not runner:
        return f"{page}: {command}: no test named in RUN_BY"
    test, words = runner[0]
    if words not in (REPO_ROOT / test).read_text(encoding="utf-8"):
        return f"{page}: {command}: {test} does not hold {words!r}"
    return None


def test_every_other_command_of_the_pages_is_run_by_a_named_test():
    said = [
        _unaccounted(page, command)
        for page, block in _blocks()
        for command in _commands(block)
        if _jax_nbmem_words(command) is None
    ]
    assert [s for s in said if s] == []


def test_the_simulated_gpu_s_commands_name_options_it_has():
    lines = [c for _, block in _blocks() for c in _commands(block) if "jax_nbmem.simgpu" in c]
    assert len(lines) >= 3
    for command in lines:
        words = command.split("jax_nbmem.simgpu", 1)[1].split()
        helped = subprocess.run(
            ["python", "-m", "jax_nbmem.simgpu", words[0], "--help"],
            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
        )  # fmt: skip
        assert helped.returncode == 0, helped.stderr
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command):
            assert option in helped.stdout, f"{command}: {option}"


@pytest.mark.parametrize("page,block", _blocks(), ids=lambda v: v if v.endswith(".md") else "")
def test_every_bash_block_is_valid_bash(page, block):
    checked = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert checked.returncode == 0, f"{page}: {checked.stderr}"


def test_the_magics_page_s_kernelspec_block_runs_as_written(tmp_path):
    """Its four lines, as bash runs them, in a Python environment and a home of their own."""
    (block,) = [b for page, b in _blocks() if page == "docs/magics.md" and "kernel install" in b]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                   check=True, timeout=120)  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "jax-nbmem"
    shim.write_text(f'#!/bin/sh\nexec {venv}/bin/python -m jax_nbmem.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    done = subprocess.run(["bash", "-euc", block], env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "jax-nbmem-off" in done.stdout and "jax-30" in done.stdout  # the list, before remove
    assert (venv / "share" / "jupyter" / "kernels" / "jax-30" / "kernel.json").is_file()
    assert not (tmp_path / "data" / "kernels" / "jax-nbmem-off").exists()  # removed


def _fenced(info: str) -> list[tuple[str, str]]:
    """(page, text) of every block of the pages fenced as ``info``."""
    parser = markdown_it.MarkdownIt()
    return [
        (page.relative_to(REPO_ROOT).as_posix(), token.content)
        for page in PAGES
        for token in parser.parse(page.read_text(encoding="utf-8"))
        if token.type == "fence" and token.info.strip() == info
    ]


def _configured_commands() -> list[tuple[str, list[str]]]:
    """The jax-nbmem command lines the pages' configs and the shipped units give, as words.

    A hub config's service command is a Python list: each word that is not a literal (a
    variable such as ``HUB_URL``) stands as ``X``. A unit's ``ExecStart=`` and the exporter's
    environment file are read as systemd would split them.
    """
    found = []
    for page, code in _fenced("python"):
        if code.lstrip().startswith("%"):
            continue  # a notebook's cell, with magics: no config
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.List) and any(
                isinstance(e, ast.Constant) and e.value == "jax_nbmem.cli" for e in node.elts
            ):
                words = [e.value if isinstance(e, ast.Constant) else "X" for e in node.elts]
                found.append((page, _stand_ins(words[words.index("jax_nbmem.cli") + 1 :])))
    units = [(page, text) for page, text in _fenced("ini")]
    units.append(("deploy/jax-nbmem-exporter.service",
                  (REPO_ROOT / "deploy" / "jax-nbmem-exporter.service").read_text()))  # fmt: skip
    for page, text in units:
        for line in text.replace("\\\n", " ").splitlines():
            start = re.match(r"ExecStart=\S*(?:jax-nbmem|python -m jax_nbmem\.cli) (.*)", line)
            if start:
                found.append((page, shlex.split(start[1].replace("$JAX_NBMEM_EXPORTER_ARGS", ""))))
    env = (REPO_ROOT / "deploy" / "jax-nbmem-exporter.env").read_text()
    (args,) = re.findall(r'^JAX_NBMEM_EXPORTER_ARGS="(.*)"$', env, re.M)
    found.append(("deploy/jax-nbmem-exporter.env", ["exporter", *shlex.split(args)]))
    return found


# A variable in a config's command stands as a value of the kind its option checks.
_STAND_INS = {"--hub-url": "http://127.0.0.1:8000"}


def _stand_ins(words: list[str]) -> list[str]:
    return [
        _STAND_INS.get(words[i - 1], word) if word == "X" and i else word
        for i, word in enumerate(words)
    ]


def test_the_configs_and_units_give_jax_nbmem_command_lines_its_parser_accepts():
    found = _configured_commands()
    pages = {page for page, _ in found}
    assert {"docs/jupyterhub.md", "deploy/jax-nbmem-exporter.env"} <= pages, pages
    assert any(words[0] == "cull" for _, words in found)
    wrong = [f"{page}: {words}: {said}" for page, words in found if (said := _parses(words))]
    assert wrong == []
