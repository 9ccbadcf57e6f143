"""Where jax_nbmem's documentation is, so that a message points to a page its reader has.

The documentation's pages come with the package: a wheel carries them in ``jax_nbmem/docs/``
(the source's ``docs/``, put there when the wheel is built), and a checkout, an editable
install included, has them in ``docs/`` beside the package. A message names the page's path
on this machine and its section, never an address on the web (the project has none yet).

``python -m jax_nbmem.guide [PAGE]`` prints where the pages are, or one page's path.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["folder", "page"]

_IN_PACKAGE = Path(__file__).with_name("docs")  # a wheel's
_IN_CHECKOUT = Path(__file__).resolve().parents[1] / "docs"  # a checkout's, editable or not


def folder() -> Path | None:
    """The folder of the documentation's pages here; None when this install has none."""
    for candidate in (_IN_PACKAGE, _IN_CHECKOUT):
        if (candidate / "index.md").is_file():
            return candidate
    return None


def page(name: str, section: str | None = None) -> str:
    """Where page ``name`` (``metrics.md``) is, and its section, said for a message.

    The path of the page on this machine; when this install has no pages (a copy of the
    package without them), the page's name in the documentation of the source distribution.
    """
    where = folder()
    found = where / name if where is not None and (where / name).is_file() else None
    said = str(found) if found else f"{name} in the docs/ folder of jax_nbmem's source"
    return f'{said}, "{section}"' if section else said


def main(argv: list[str] | None = None) -> int:
    """``python -m jax_nbmem.guide [PAGE]``: print the pages' folder and names, or one's path."""
    args = sys.argv[1:] if argv is None else argv
    where = folder()
    if where is None:
        print("This install of jax_nbmem has no documentation pages; the docs/ folder of its "
              "source distribution has them.", file=sys.stderr)  # fmt: skip
        return 1
    if args:
        wanted = args[0] if args[0].endswith(".md") else f"{args[0]}.md"
        if not (where / wanted).is_file():
            names = ", ".join(sorted(p.stem for p in where.glob("*.md")))
            print(f"no page {args[0]!r} in {where}; the pages: {names}", file=sys.stderr)
            return 2
        print(where / wanted)
        return 0
    print(f"jax_nbmem's documentation: {where}")
    for path in sorted(where.glob("*.md")):
        print(f"  {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
