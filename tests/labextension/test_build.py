"""The built JupyterLab extension checked into git is the one its TypeScript sources make."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def stamp_module(root: Path):
    spec = importlib.util.spec_from_file_location("stamp", root / "scripts/labextension_stamp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_built_files_match_the_sources_they_were_built_from():
    problems = stamp_module(ROOT).problems()
    assert problems == [], "\n".join(problems)


@pytest.fixture
def copy(tmp_path):
    """A copy of the sources, the built extension and the stamp script, to change freely."""
    for part in ("labextension/src", "labextension/style", "jax_nbmem/labextension"):
        shutil.copytree(ROOT / part, tmp_path / part)
    for part in ("package.json", "package-lock.json", "tsconfig.json", "build-stamp.json"):
        shutil.copyfile(ROOT / "labextension" / part, tmp_path / "labextension" / part)
    (tmp_path / "scripts").mkdir()
    shutil.copyfile(ROOT / "scripts/labextension_stamp.py", tmp_path / "scripts/x.py")
    (tmp_path / "scripts/x.py").rename(tmp_path / "scripts/labextension_stamp.py")
    return tmp_path


def test_a_source_changed_without_a_rebuild_is_caught(copy):
    assert stamp_module(copy).problems() == []
    source = copy / "labextension/src/status.ts"
    source.write_text(source.read_text() + "\n// changed\n")
    assert stamp_module(copy).problems() == [
        "labextension/ changed since the last build: rebuild it"
    ]


def test_a_built_file_edited_by_hand_is_caught(copy):
    built = next((copy / "jax_nbmem/labextension/static").glob("remoteEntry.*.js"))
    built.write_text(built.read_text() + ";")
    assert len(stamp_module(copy).problems()) == 1


def test_the_wheel_installs_the_built_extension_where_jupyterlab_looks():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    shared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
        "targets"
    ]["wheel"]["shared-data"]
    assert shared["jax_nbmem/labextension"] == "share/jupyter/labextensions/jax_nbmem"
    install = json.loads((ROOT / "labextension/install.json").read_text())
    assert install["packageName"] == "jax_nbmem"
    built = json.loads((ROOT / "jax_nbmem/labextension/package.json").read_text())
    assert built["name"] == "jax_nbmem"
    assert (ROOT / "jax_nbmem/labextension" / built["jupyterlab"]["_build"]["load"]).is_file()
