"""Messages point to documentation their reader has: the pages' path here, never a web address.

A checkout (this one) has the pages in docs/; the wheel's own copy is tested where the wheel is
installed (tests/test_release.py). The messages that name a page are the CLI's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jax_nbmem import guide
from jax_nbmem.cli.exporter_settings import ExporterSettings

ROOT = Path(__file__).resolve().parents[1]


def test_a_page_is_named_by_its_path_on_this_machine_and_its_section():
    assert guide.folder() == ROOT / "docs"
    assert guide.page("metrics.md", "Exposure") == f'{ROOT / "docs" / "metrics.md"}, "Exposure"'
    assert (
        guide.page("no-such-page.md") == "no-such-page.md in the docs/ folder of jax_nbmem's source"
    )


def test_python_m_guide_prints_the_pages_and_refuses_an_unknown_one():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "jax_nbmem.guide", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    listed = run()
    assert listed.returncode == 0 and "metrics.md" in listed.stdout
    assert run("shared-node").stdout.strip() == str(ROOT / "docs" / "shared-node.md")
    unknown = run("nope")
    assert unknown.returncode == 2 and "no page 'nope'" in unknown.stderr
    assert "metrics" in unknown.stderr  # it lists the pages there are


def test_the_exporters_refusal_names_a_page_that_exists():
    with pytest.raises(ValueError) as refused:
        ExporterSettings(listen="0.0.0.0:0")
    message = str(refused.value)
    path = message.split("--web.config.file (", 1)[1].split(", ", 1)[0]
    assert Path(path).is_absolute() and Path(path).is_file(), message  # not a bare docs/...
    assert path.endswith("metrics.md"), message
