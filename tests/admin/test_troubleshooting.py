"""docs/troubleshooting.md quotes the messages the package writes, each as the code writes it."""

from __future__ import annotations

import pytest

from tests.admin.messages import missing, quoted_messages, source_messages
from tests.jupyterlab import REPO_ROOT

PAGE = (REPO_ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return source_messages(REPO_ROOT / "jax_nbmem")


def test_every_message_the_page_quotes_is_still_in_the_package_s_source(sources):
    quoted = quoted_messages(PAGE)
    assert len(quoted) >= 50, "the page quotes its messages on '> `…`' lines"
    assert missing(quoted, sources) == []


def test_a_message_the_source_does_not_write_is_found_missing(sources):
    written = "--web.config.file …: the password of … is no bcrypt hash"
    reworded = "--web.config.file …: the password of … is not a bcrypt hash"
    assert missing([written, reworded], sources) == [reworded]
    # A value the code formats in is "…" on the page, never a made-up example of it.
    assert missing(["--interval must be positive, not 0"], sources) != []
    # A constant formatted in is its text, which the page may say.
    assert missing(["it needs the scopes read:servers and tokens"], sources) == []


def test_the_page_is_reached_from_the_index_and_the_readme():
    assert "troubleshooting" in (REPO_ROOT / "docs" / "index.md").read_text().split()
    assert "(docs/troubleshooting.md)" in (REPO_ROOT / "README.md").read_text()
