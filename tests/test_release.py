"""A newcomer's path from the built artefacts, away from the repository.

``python -m build`` makes the sdist and the wheel a release uploads; ``twine check`` passes on
both; they hold the license and the JupyterLab extension once. The wheel, installed (not
editable) into a fresh virtual environment of its own, lists its JupyterLab and server
extensions, runs the CLI, and runs the sdist's quickstart notebook on the simulated GPU next to
a preallocated neighbour: the notebook warns that it blocks the GPU and names it, and the
executed notebook stays small.

Marked ``release`` (``pytest -m release`` runs only these; ``-m "not release"`` leaves them
out). The virtual environment's packages come from the package index through pip, as a
newcomer's do, at the versions of the environment running the suite (about a minute with
pip's cache warm).
"""

import email
import importlib.metadata
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import nbformat
import pytest

from tests.markdown_links import is_external, markdown_links

pytest.importorskip("build", reason="the test extras: pip install -e '.[test]'")
pytest.importorskip("twine", reason="the test extras: pip install -e '.[test]'")
pytest.importorskip("markdown_it", reason="the docs extra: pip install -e '.[docs]'")

pytestmark = [pytest.mark.release, pytest.mark.kernel, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "jax_nbmem/_version.py").read_text())[1]
SHARE = "share/jupyter/labextensions/jax_nbmem"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What the executed quickstart may weigh: its outputs and the panel's state, not plotly.js.
MAX_EXECUTED_BYTES = 300 * 1024


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("timeout", 300)
    done = subprocess.run(
        [str(part) for part in cmd], capture_output=True, text=True, check=False, **kwargs
    )
    return done


def ok(cmd, **kwargs) -> str:
    """stdout and stderr of a command that must succeed (without colours)."""
    done = run(cmd, **kwargs)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return ANSI.sub("", done.stdout + done.stderr)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist, then the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    ok([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=out)
    (wheel,) = out.glob("jax_nbmem-*.whl")
    (sdist,) = out.glob("jax_nbmem-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_twine_check_passes(dist):
    shown = ok([sys.executable, "-m", "twine", "check", "--strict", *dist.values()])
    assert shown.count("PASSED") == 2, shown


def test_the_wheel_holds_the_license_and_the_labextension_once(dist):
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    info = f"jax_nbmem-{VERSION}.dist-info"
    license_text = zipfile.ZipFile(dist["wheel"]).read(f"{info}/licenses/LICENSE").decode()
    assert "Copyright (c) 2026, the jax_nbmem developers" in license_text
    assert "BSD 3-Clause License" in license_text
    built = sorted(
        path.relative_to(ROOT / "jax_nbmem/labextension").as_posix()
        for path in (ROOT / "jax_nbmem/labextension").rglob("*")
        if path.is_file()
    )
    assert built and "package.json" in built
    for relative in [*built, "install.json"]:
        copies = [name for name in names if name.endswith(f"/{relative}") and SHARE in name]
        assert copies == [f"jax_nbmem-{VERSION}.data/data/{SHARE}/{relative}"], relative
    assert not [name for name in names if name.startswith("jax_nbmem/labextension/")]
    # PYPI.md: the docs come with the wheel; deploy/ and scripts/ are the repository's only.
    assert "jax_nbmem/docs/index.md" in names
    assert not [name for name in names if "/deploy/" in name or "/scripts/" in name]
    # Everything the JupyterLab extension ships, and nothing of it twice anywhere.
    remote = [name for name in names if "remoteEntry." in name]
    assert len(remote) == 1, remote
    config = "etc/jupyter/jupyter_server_config.d/jax_nbmem.json"
    assert f"jax_nbmem-{VERSION}.data/data/{config}" in names


def test_the_sdist_holds_the_license_the_docs_and_the_notebooks(dist):
    names = set(tarfile.open(dist["sdist"]).getnames())
    top = f"jax_nbmem-{VERSION}"
    for needed in (
        "LICENSE",
        "CHANGELOG.md",
        "PYPI.md",
        "README.md",
        "docs/conf.py",
        "docs/index.md",
        "notebooks/quickstart.ipynb",
        "jax_nbmem/labextension/package.json",
        # What PYPI.md says the source distribution has and the wheel lacks.
        "scripts/quickstart.sh",
        "deploy/jax-nbmem-exporter.service",
        "deploy/prometheus/jax_nbmem.rules.yml",
        "deploy/kubernetes/base/daemonset.yaml",
    ):
        assert f"{top}/{needed}" in names, needed


def test_the_docs_build_strictly_from_the_sdist_alone(dist, tmp_path):
    pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
    with tarfile.open(dist["sdist"]) as sdist:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.10.12+
        sdist.extractall(tmp_path, **safe)
    source = tmp_path / f"jax_nbmem-{VERSION}" / "docs"
    ok([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", source,
        tmp_path / "site"], cwd=tmp_path)  # fmt: skip
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_index_gets_authors_classifiers_and_a_description_it_can_show(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        metadata = email.message_from_bytes(wheel.read(f"jax_nbmem-{VERSION}.dist-info/METADATA"))
    assert metadata["Version"] == VERSION
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata["License-File"] == "LICENSE"
    assert metadata["Author"] == "the jax_nbmem developers"
    classifiers = metadata.get_all("Classifier")
    assert "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in classifiers
    assert not metadata.get_all("Project-URL"), "the project has no public address yet"
    assert metadata["Description-Content-Type"] == "text/markdown"
    description = metadata.get_payload()
    assert "%jaxalloc off" in description and "pip install" in description
    relative = [link for link in markdown_links(description) if not is_external(link)]
    assert relative == [], "an index cannot follow links relative to the repository"


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> dict:
    """A fresh virtual environment (not --system-site-packages) with the wheel and its extras."""
    base = tmp_path_factory.mktemp("newcomer")
    folder = base / "venv"
    ok([sys.executable, "-m", "venv", folder])
    python = folder / "bin" / "python"
    # The package index serves the dependencies, as it does a newcomer's (pip's cache helps),
    # at the versions this environment runs the suite with: the venv differs from it only in
    # how jax_nbmem got there, and a dependency's new release cannot fail this test alone.
    pins = {}
    for found in importlib.metadata.distributions():  # the first of a name is the one imported
        name = re.sub(r"[-_.]+", "-", found.metadata["Name"] or "").lower()
        if name and name != "jax-nbmem":
            pins.setdefault(name, f"{name}=={found.version}\n")
    constraints = base / "constraints.txt"
    constraints.write_text("".join(pins.values()))
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ok(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
         "--constraint", constraints, f"{dist['wheel']}[lab,server]"],
        env=pip_env,
        cwd=base,
        timeout=600,
    )  # fmt: skip
    home = base / "home"
    home.mkdir()
    # Away from the repository and this test's settings: the venv's own jupyter and kernel.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JUPYTER", "JAX_NBMEM", "XLA_", "IPYTHON", "JPY_"))
        and k not in {"PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "JAX_PLATFORMS"}
    }
    env.update(HOME=str(home), PATH=f"{folder / 'bin'}:{env.get('PATH', '')}")
    work = base / "work"
    work.mkdir()
    return {"bin": folder / "bin", "env": env, "cwd": work}


def in_venv(venv, *cmd, **kwargs) -> str:
    kwargs.setdefault("env", venv["env"])
    return ok([venv["bin"] / cmd[0], *cmd[1:]], cwd=venv["cwd"], **kwargs)


def test_the_package_comes_from_the_wheel_not_the_repository(venv):
    where = in_venv(venv, "python", "-c", "import jax_nbmem; print(jax_nbmem.__file__)")
    assert where.strip().startswith(str(venv["bin"].parent)), where
    shown = in_venv(venv, "python", "-m", "pip", "show", "--files", "jax_nbmem")
    assert "Editable project location" not in shown
    assert f"Version: {VERSION}" in shown


def test_messages_point_to_documentation_the_install_has(venv):
    """A pip user has no docs/: the pages come with the package, where messages point."""
    pages = Path(in_venv(venv, "python", "-m", "jax_nbmem.guide", "metrics").strip())
    assert pages.is_relative_to(venv["bin"].parent) and pages.name == "metrics.md", pages
    assert pages.read_text() == (ROOT / "docs" / "metrics.md").read_text()
    said = in_venv(venv, "python", "-c", "from jax_nbmem import guide; "
                   "print(guide.page('metrics.md', 'Exposure'))")  # fmt: skip
    assert said.strip() == f'{pages}, "Exposure"'


def test_jupyterlab_lists_the_extension_enabled(venv):
    shown = in_venv(venv, "jupyter", "labextension", "list")
    section = shown.split(f"{venv['bin'].parent}/{SHARE.rsplit('/', 1)[0]}", 1)
    assert len(section) == 2, shown  # the venv's own labextensions folder
    assert re.search(rf"jax_nbmem v{re.escape(VERSION)} enabled\s+OK", section[1]), shown


def test_the_server_extension_is_listed_with_its_version(venv):
    shown = in_venv(venv, "jupyter", "server", "extension", "list")
    assert "jax_nbmem.server enabled" in shown, shown
    assert re.search(rf"jax_nbmem\.server {re.escape(VERSION)} OK", shown), shown


def test_the_cli_answers_without_a_gpu(venv):
    help_text = in_venv(venv, "jax-nbmem", "--help")
    for command in ("status", "exporter", "shutdown", "cull", "kernel"):
        assert command in help_text
    status = in_venv(venv, "jax-nbmem", "status")
    assert "NVML unavailable" in status and "no NVIDIA driver" in status
    assert in_venv(venv, "jax-nbmem", "--version").strip() == f"jax-nbmem {VERSION}"


def test_the_systemd_unit_runs_what_the_documented_install_makes(venv):
    """Issue 51 item 2: docs/containers.md's steps make the unit's ExecStart and its pages.

    The documented environment is a plain venv at /opt/jax_nbmem with ``.[server]``; this
    venv was made the same way (from the wheel), so the unit with /opt/jax_nbmem read as this
    venv's folder must name a command that exists, pages that exist, and verify clean.
    """
    unit = (ROOT / "deploy" / "jax-nbmem-exporter.service").read_text()
    steps = (ROOT / "docs" / "containers.md").read_text()
    assert 'python3 -m venv /opt/jax_nbmem && /opt/jax_nbmem/bin/pip install ".[server]"' in steps
    (start,) = re.findall(r"^ExecStart=(\S+) exporter ", unit, re.M)
    assert start == "/opt/jax_nbmem/bin/jax-nbmem"
    prefix = str(venv["bin"].parent)
    assert Path(start.replace("/opt/jax_nbmem", prefix)).is_file()
    (documentation,) = re.findall(r"^Documentation=(.*)$", unit, re.M)
    for uri in documentation.split():
        assert uri.startswith("file:/opt/jax_nbmem/"), uri
        page = Path(uri.removeprefix("file:").replace("/opt/jax_nbmem", prefix))
        assert page.read_text() == (ROOT / "docs" / page.name).read_text(), uri
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing (the unit's paths were checked)")
    here = venv["cwd"] / "jax-nbmem-exporter.service"
    here.write_text(unit.replace("/opt/jax_nbmem", prefix))
    done = subprocess.run(["systemd-analyze", "verify", str(here)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


@pytest.fixture(scope="module")
def quickstart(venv, dist) -> dict:
    """The sdist's quickstart notebook, executed as a newcomer would on the simulated GPU.

    Set up as ``scripts/quickstart.sh --simulated-gpu`` does (``shell-env --kernels``, then
    ``tenant``: the preallocated neighbour), then ``jupyter nbconvert --execute`` in the venv.
    """
    work = venv["cwd"]
    with tarfile.open(dist["sdist"]) as sdist:
        member = sdist.getmember(f"jax_nbmem-{VERSION}/notebooks/quickstart.ipynb")
        (work / "quickstart.ipynb").write_bytes(sdist.extractfile(member).read())
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler to build the simulated GPU library")
    exports = in_venv(venv, "python", "-m", "jax_nbmem.simgpu", "shell-env", work / "sim",
                      "--kernels")  # fmt: skip
    env = dict(venv["env"])
    for name, value in re.findall(r"^export (\w+)=(.*)$", exports, re.MULTILINE):
        env[name] = shlex.split(value)[0]
    # The neighbour as the script starts it; it ends with this process at the latest.
    started = in_venv(venv, "python", "-m", "jax_nbmem.simgpu", "tenant", "--notebook",
                      "neighbour.ipynb", "--stop-with", os.getpid(), env=env)  # fmt: skip
    pid = int(re.search(r"kernel PID (\d+)", started)[1])
    try:
        in_venv(
            venv, "jupyter", "nbconvert", "--to", "notebook", "--execute", "quickstart.ipynb",
            "--output", "executed.ipynb", env=env,
        )  # fmt: skip
    finally:
        os.kill(pid, signal.SIGTERM)
    path = work / "executed.ipynb"
    return {"path": path, "notebook": nbformat.read(path, as_version=4)}


def outputs_text(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
            parts.append(output.get("ename", ""))
    return "\n".join(parts)


def test_the_quickstart_warns_of_the_blocking_neighbour_and_names_it(quickstart):
    notebook = quickstart["notebook"]
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    text = outputs_text(notebook)
    assert "NVIDIA H200 (simulated)" in text
    assert "WARNING [blocking-preallocation]" in text
    assert "neighbour.ipynb" in text and "%jaxmem shutdown" in text


def test_the_executed_quickstart_stays_small(quickstart):
    size = quickstart["path"].stat().st_size
    assert size < MAX_EXECUTED_BYTES, f"the executed quickstart weighs {size:,} bytes"


def test_the_html_export_shows_the_panels_snapshot_without_scripts(quickstart, venv):
    """An export (nbconvert's HTML) carries the static snapshot, readable offline and small."""
    work = quickstart["path"].parent
    empty = nbformat.v4.new_notebook()
    nbformat.write(empty, work / "empty.ipynb")
    for name in ("executed", "empty"):
        in_venv(venv, "jupyter", "nbconvert", "--to", "html", f"{name}.ipynb")
    page = (work / "executed.html").read_text(encoding="utf-8")
    outside_scripts = re.sub(r"<script\b.*?</script>", "", page, flags=re.DOTALL)
    snapshot = re.split(r"class=[\"']jax-nbmem-snapshot[\"']", outside_scripts, maxsplit=1)
    assert len(snapshot) == 2, "no static snapshot of the panel in the export"
    assert "NVIDIA H200 (simulated)" in snapshot[1] and "blocking-preallocation" in snapshot[1]
    extra = len(page.encode()) - (work / "empty.html").stat().st_size
    assert extra < MAX_EXECUTED_BYTES, f"the export weighs {extra:,} bytes over an empty one"


def test_pip_uninstall_removes_what_the_wheel_put_in_the_environment(venv):
    """docs/upgrade.md: the command, both extensions' files and the pages go with the package.

    Last in this module: the environment has no jax_nbmem after it.
    """
    prefix = venv["bin"].parent
    left = [
        venv["bin"] / "jax-nbmem",
        prefix / "etc/jupyter/jupyter_server_config.d/jax_nbmem.json",
        prefix / SHARE / "package.json",
        prefix / "share/doc/jax_nbmem/upgrade.md",
    ]
    assert all(path.exists() for path in left), [str(p) for p in left if not p.exists()]
    page = (ROOT / "docs" / "upgrade.md").read_text()
    assert "`pip uninstall jax_nbmem`" in page
    in_venv(venv, "python", "-m", "pip", "uninstall", "--yes", "jax_nbmem")
    assert [str(path) for path in left if path.exists()] == []
