"""Sphinx configuration of jax_nbmem's documentation site (see how-it-is-built.md, "Docs").

Build it with ``sphinx-build -W --keep-going -b html docs OUT`` (``pip install -e ".[docs]"``);
tests/test_docs.py builds it so, and checks every link within it.
"""

import re
from pathlib import Path

_VERSION_FILE = Path(__file__).resolve().parents[1] / "jax_nbmem" / "_version.py"

project = "jax_nbmem"
author = "the jax_nbmem developers"
copyright = "2026, the jax_nbmem developers"
# Read, not imported: the site builds without the package (or JAX) installed.
release = re.search(r'__version__ = "([^"]+)"', _VERSION_FILE.read_text()).group(1)
version = release

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# Every page's headings get the anchors GitHub gives them, so `page.md#a-heading` links work
# both on the site and when the Markdown is read in a repository browser.
myst_heading_anchors = 3
# Pages are the *.md files only. jupyterhub_config.py is a file the hub tests run, shown inline
# by jupyterhub.md; the images are referenced by the pages that show them.
exclude_patterns = ["_build", "jupyterhub_config.py", "**/.ipynb_checkpoints"]
# A block without a language (a tree, a state file, a terminal's output) is shown as it is.
highlight_language = "none"

html_theme = "alabaster"
html_title = f"jax_nbmem {release}"
html_sidebars = {"**": ["about.html", "navigation.html", "searchbox.html"]}
html_theme_options = {
    "description": "See and control JAX's GPU memory from inside a Jupyter notebook",
    "fixed_sidebar": True,
    "page_width": "1200px",  # the pages' tables and commands are wide
    "sidebar_width": "260px",
}
html_show_sourcelink = False
