"""The documentation site builds with warnings as errors, and every link within it resolves.

Built as docs/how-it-is-built.md says: ``sphinx-build -W --keep-going -b html docs OUT``. The
links checked are the relative ones — between pages, to a heading's anchor, to an image — in
the built site and in README.md (which links into docs/); external links are left alone (no
network here).
"""

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.markdown_links import is_external, markdown_links

pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("myst_parser", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("markdown_it")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def build(source: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", source, out],
        capture_output=True,
        text=True,
        timeout=240,
    )


class _Page(HTMLParser):
    """A built page's element ids and the href/src of its links and images."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            elif value is not None and (name, tag) in {("href", "a"), ("src", "img")}:
                self.links.append(value)


def parse(page: Path) -> _Page:
    parsed = _Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    return parsed


def broken_links_in_site(site: Path) -> list[str]:
    """Each relative link of the built site whose file or anchor is not there, one line each."""
    pages: dict[Path, _Page] = {}

    def page(path: Path) -> _Page:
        if path not in pages:
            pages[path] = parse(path)
        return pages[path]

    broken = []
    for source in sorted(site.glob("*.html")):
        for link in page(source).links:
            if is_external(link):
                continue
            parts = urlsplit(link)
            target = (source.parent / unquote(parts.path)).resolve() if parts.path else source
            where = f"{source.name}: {link}"
            if not target.exists():
                broken.append(f"{where}: no such file")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in page(target).ids:
                    broken.append(f"{where}: no such anchor in {target.name}")
    return broken


def broken_links_in_readme(readme: Path, docs: Path, site: Path) -> list[str]:
    """README.md's relative links: files that exist; into docs/, pages and anchors of the site."""
    broken = []
    for link in markdown_links(readme.read_text(encoding="utf-8")):
        if is_external(link):
            continue
        parts = urlsplit(link)
        target = (readme.parent / unquote(parts.path)).resolve()
        if not target.exists():
            broken.append(f"README.md: {link}: no such file")
            continue
        if target.suffix == ".md" and target.is_relative_to(docs.resolve()):
            built = site / target.relative_to(docs.resolve()).with_suffix(".html")
            if not built.exists():
                broken.append(f"README.md: {link}: not a page of the site")
            elif parts.fragment and unquote(parts.fragment) not in parse(built).ids:
                broken.append(f"README.md: {link}: no such anchor in {built.name}")
        elif parts.fragment:
            broken.append(f"README.md: {link}: an anchor outside the site is not checked")
    return broken


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(DOCS, out)
    assert done.returncode == 0, f"the docs do not build cleanly:\n{done.stderr}"
    return out


def test_the_site_builds_with_warnings_as_errors_and_has_every_page(site):
    pages = {path.stem for path in DOCS.glob("*.md")}
    built = {path.stem for path in site.glob("*.html")}
    assert pages <= built, f"pages missing from the site: {sorted(pages - built)}"
    assert (site / "_images" / "panel.png").is_file()  # the picture on the front page


def test_every_link_within_the_site_resolves(site):
    assert broken_links_in_site(site) == []


def test_every_relative_link_of_the_readme_resolves(site):
    assert broken_links_in_readme(ROOT / "README.md", DOCS, site) == []


def test_the_readme_stays_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the reference to docs/"


@pytest.fixture
def docs_copy(tmp_path) -> Path:
    copy = tmp_path / "docs"
    copy.mkdir()
    for path in DOCS.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    (tmp_path / "jax_nbmem").mkdir()
    (tmp_path / "jax_nbmem" / "_version.py").write_bytes(
        (ROOT / "jax_nbmem" / "_version.py").read_bytes()
    )
    (tmp_path / "CHANGELOG.md").write_bytes((ROOT / "CHANGELOG.md").read_bytes())
    return copy


def test_a_link_to_a_missing_anchor_fails_the_build(docs_copy, tmp_path):
    page = docs_copy / "cli.md"
    page.write_text(page.read_text() + "\nSee [nowhere](magics.md#no-such-heading).\n")
    done = build(docs_copy, tmp_path / "out")
    assert done.returncode != 0 and "no-such-heading" in done.stderr


def test_a_broken_link_is_found_in_the_site_and_in_the_readme(site, tmp_path):
    page = tmp_path / "page.html"
    page.write_text(
        '<h1 id="top">x</h1><a href="#top">ok</a><a href="https://example.org/x">out</a>'
        '<a href="gone.html">gone</a><a href="page.html#nowhere">anchor</a><img src="x.png">'
    )
    assert broken_links_in_site(tmp_path) == [
        "page.html: gone.html: no such file",
        "page.html: page.html#nowhere: no such anchor in page.html",
        "page.html: x.png: no such file",
    ]
    readme = tmp_path / "README.md"
    readme.write_text(
        "[a](docs/cli.md#no-such) [b](docs/missing.md) `[c](docs/nothing.md)`\n"
        "![d](docs/panel.png) [e](https://example.org)\n\n    [f](docs/indented.md)\n"
    )
    (tmp_path / "docs").symlink_to(DOCS)
    assert broken_links_in_readme(readme, tmp_path / "docs", site) == [
        "README.md: docs/cli.md#no-such: no such anchor in cli.html",
        "README.md: docs/missing.md: no such file",
    ]
