"""The stamp that ties the checked-in JupyterLab extension to its TypeScript sources.

``python scripts/labextension_stamp.py write`` (run by scripts/build-labextension.sh) records
the SHA-256 of the sources (``labextension/``: package.json, package-lock.json, tsconfig.json,
src/, style/) and of the built files (``jax_nbmem/labextension/``) in
``labextension/build-stamp.json``; ``check`` says what no longer matches (exit status 1).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "labextension"
BUILT = ROOT / "jax_nbmem" / "labextension"
STAMP = SOURCES / "build-stamp.json"
_SOURCE_FILES = ("package.json", "package-lock.json", "tsconfig.json")
_SOURCE_DIRS = ("src", "style")


def _digest(base: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def sources_hash() -> str:
    """The hash of every file the build reads from labextension/."""
    files = [SOURCES / name for name in _SOURCE_FILES]
    for folder in _SOURCE_DIRS:
        files += [p for p in (SOURCES / folder).rglob("*") if p.is_file()]
    return _digest(SOURCES, files)


def built_hash() -> str:
    """The hash of the prebuilt extension in jax_nbmem/labextension/."""
    return _digest(BUILT, [p for p in BUILT.rglob("*") if p.is_file()])


def problems() -> list[str]:
    """What does not match the stamp; empty when the built files are those of the sources."""
    if not STAMP.is_file():
        return [f"no {STAMP.relative_to(ROOT)}: run scripts/build-labextension.sh"]
    if not BUILT.is_dir():
        return [f"no {BUILT.relative_to(ROOT)}: run scripts/build-labextension.sh"]
    stamp = json.loads(STAMP.read_text())
    found = []
    if stamp.get("sources") != sources_hash():
        found.append("labextension/ changed since the last build: rebuild it")
    if stamp.get("built") != built_hash():
        found.append("jax_nbmem/labextension/ is not what the last build wrote: rebuild it")
    return found


def main(argv: list[str]) -> int:
    """``write`` or ``check``."""
    if argv == ["write"]:
        stamp = {"sources": sources_hash(), "built": built_hash()}
        STAMP.write_text(json.dumps(stamp, indent=2) + "\n")
        return 0
    if argv == ["check"]:
        found = problems()
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    print("usage: labextension_stamp.py write|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
