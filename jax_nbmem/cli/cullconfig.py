"""``jax-nbmem cull``'s flags, and its config file in the same words.

Every flag is declared once here (:data:`OPTIONS`): its default, its help, and the
validator argparse applies (``type=``), which the config file's values go through too. The
file (``--generate-config`` writes one with every flag and its default, commented) holds
one ``NAME = VALUE`` per line, NAME a flag without its dashes (``idle = 1h``, ``hub-url =
http://127.0.0.1:8000``, ``dry-run = true``; ``exempt`` once per user); ``#`` starts a
comment line. What is given on the command line wins over the file (``--exempt`` given there
replaces the file's list; ``--no-dry-run`` undoes a file's ``dry-run = true``).

A bad file is refused whole, naming the file, the line, the setting and the fix: nothing
runs with half a configuration.
"""

from __future__ import annotations

import argparse
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jax_nbmem.text import parse_number, printable

__all__ = ["OPTIONS", "ConfigError", "add_options", "generate_config", "settle"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_MAX_S = 366 * 86400


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, line and fix."""


def _duration(flag: str, *, zero: bool) -> Callable[[str], float]:
    """A validator of seconds (``90``, ``1.5``) or a duration (``10m``, ``1h``, ``2d``)."""

    def parse(text: str) -> float:
        found = _DURATION.fullmatch(text.strip())
        if not found:
            raise argparse.ArgumentTypeError(
                f"{flag} takes seconds like 3600, or 10m, 1h, 2d; got '{printable(text)}'"
            )
        value = float(found.group(1)) * _UNITS[found.group(2) or "s"]
        if value > _MAX_S or (value == 0 and not zero):
            least = ">= 0" if zero else "> 0"
            raise argparse.ArgumentTypeError(f"{flag} must be {least} and at most a year")
        return value

    return parse


def _share(text: str) -> float:
    try:
        return parse_number(text, "--share", low=0, high=1)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _name(flag: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        word = text.strip()
        if not word or any(c.isspace() or not c.isprintable() for c in word):
            raise argparse.ArgumentTypeError(f"{flag} takes one name, got '{printable(text)}'")
        return word

    return parse


def _url(text: str) -> str:
    word = text.strip()
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", word):
        raise argparse.ArgumentTypeError(
            f"--hub-url takes the hub's http(s) address like http://127.0.0.1:8000, got "
            f"'{printable(text)}'"
        )
    return word


def _path(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a path, not an empty word")
    return text.strip()


@dataclass(frozen=True)
class Option:
    """One flag of ``jax-nbmem cull`` (``parse`` None: a switch, true or false)."""

    flag: str
    default: object
    help: str
    parse: Callable[[str], object] | None = None
    metavar: str | None = None
    many: bool = False
    example: str = ""  # shown, commented, where the default is "not set"

    @property
    def name(self) -> str:
        """Its name in the config file (the flag without its dashes) and argparse's dest."""
        return self.flag.removeprefix("--")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--idle", 3600.0, "a kernel idle longer than this may be culled: seconds, or 10m, "
           "1h, 2d (default 1h)", _duration("--idle", zero=False), "S"),
    Option("--warn", 600.0, "time from the warning to the stop (default 10m); 0 stops at the "
           "first round past the limit", _duration("--warn", zero=True), "S"),
    Option("--every", 60.0, "time between rounds (default 60 s)",
           _duration("--every", zero=False), "S"),
    Option("--share", None, "also kernels holding more than F (0-1) of a GPU without a pool "
           "(default: pools only)", _share, "F", example="0.5"),
    Option("--exempt", [], "a user (hub or Unix name) never culled; repeat for more",
           _name("--exempt"), "USER", many=True, example="alice"),
    Option("--dry-run", False, "check the hub and the token, then only say what it would do "
           "(--no-dry-run undoes a config file's dry-run = true)"),
    Option("--once", False, "one round, then exit"),
    Option("--hub-url", None, "the hub's public address (default: $JAX_NBMEM_HUB_URL)", _url,
           "URL", example="http://127.0.0.1:8000"),
    Option("--share-dir", None, "the shared beacon directory (default: $JAX_NBMEM_SHARE_DIR, "
           "else /var/tmp/jax_nbmem)", _path, "DIR", example="/var/tmp/jax_nbmem"),
    Option("--log", None, "the administrators' log (default: $JAX_NBMEM_ADMIN_LOG, else "
           "/var/log/jax_nbmem/admin.log for root)", _path, "FILE",
           example="/var/log/jax_nbmem/admin.log"),
    Option("--listen", None, "also serve jax_nbmem_culled_kernels_total at /metrics here, on "
           "loopback only (the node exporter serves it from the shared directory: scrape one "
           "of them)", _path, "HOST:PORT", example="127.0.0.1:9841"),
)  # fmt: skip
_BY_NAME = {o.name: o for o in OPTIONS}


def add_options(parser: argparse.ArgumentParser) -> None:
    """Every flag, with no argparse default: :func:`settle` tells given from not given."""
    for option in OPTIONS:
        if option.parse is None:
            parser.add_argument(option.flag, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=option.help)  # fmt: skip
        else:
            parser.add_argument(
                option.flag, type=option.parse, metavar=option.metavar, help=option.help,
                action="append" if option.many else "store", default=argparse.SUPPRESS,
            )  # fmt: skip
    parser.add_argument(
        "--config", metavar="FILE", type=Path, default=None,
        help="read these settings from FILE (NAME = VALUE, as --generate-config writes); "
        "flags given here win",
    )  # fmt: skip
    parser.add_argument(
        "--generate-config", metavar="FILE", nargs="?", const="-", default=None,
        help="write a commented config file of every setting and its default to FILE (never "
        "over an existing file), or to stdout without FILE or with -, and exit",
    )  # fmt: skip


def settle(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every setting: the command line's, else the config file's, else default."""
    given = read_config(args.config) if args.config is not None else {}
    for option in OPTIONS:
        if hasattr(args, option.dest):
            continue
        value = given.get(option.name, option.default)
        setattr(args, option.dest, list(value) if option.many else value)
    return args


def read_config(path: Path) -> dict[str, object]:
    """The settings of the config file at ``path``; ConfigError saying where and how to fix."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--config {path}: cannot read it ({error})") from None
    found: dict[str, object] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.strip()
        if not words or words.startswith("#"):
            continue
        where = f"{path} line {number}"
        name, equals, value = (w.strip() for w in words.partition("="))
        if not equals:
            raise ConfigError(f"{where}: '{printable(words)}' is not NAME = VALUE (e.g. idle "
                              "= 1h); write it so, or start it with # as a comment")  # fmt: skip
        option = _BY_NAME.get(name.removeprefix("--"))
        if option is None:
            raise ConfigError(f"{where}: '{printable(name)}' is no setting of jax-nbmem cull "
                              f"(they are: {', '.join(_BY_NAME)}); fix its name or remove "
                              "the line")  # fmt: skip
        if option.name in found and not option.many:
            raise ConfigError(f"{where}: {option.name} is set a second time; keep one")
        found[option.name] = _value(option, value, where, found)
    return found


def _value(option: Option, value: str, where: str, found: dict) -> object:
    if option.parse is None:
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ConfigError(f"{where}: {option.name} is true or false, not '{printable(value)}'")
    try:
        parsed = option.parse(value)
    except argparse.ArgumentTypeError as error:
        raise ConfigError(f"{where}: {option.name}: {error}; fix the value") from None
    return [*found.get(option.name, []), parsed] if option.many else parsed


def generate_config() -> str:
    """The config file of every setting at its default, each with its help as a comment."""
    lines = [
        "# jax-nbmem cull: its settings, read with `jax-nbmem cull --config FILE`.",
        "# One NAME = VALUE per line, NAME a flag of `jax-nbmem cull` without its dashes.",
        "# A flag given on the command line wins over this file. Lines starting with # are",
        "# comments; a setting commented out keeps its default.",
    ]
    for option in OPTIONS:
        lines += ["", *textwrap.wrap(f"{option.flag}: {option.help}", 88, initial_indent="# ",
                                     subsequent_indent="#   ")]  # fmt: skip
        if option.many:
            lines.append(f"# {option.name} = {option.example}   (one line per value)")
        elif option.default is None:
            lines.append(f"# {option.name} = {option.example}")
        elif option.parse is None:
            lines.append(f"{option.name} = {'true' if option.default else 'false'}")
        else:
            lines.append(f"{option.name} = {option.default:g}")
    return "\n".join(lines) + "\n"


def write_config(target: str) -> str:
    """Write :func:`generate_config` to ``target`` (new file) or stdout (``-``); what was done."""
    text = generate_config()
    if target == "-":
        return text
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise ConfigError(f"--generate-config {target}: the file exists and is left as it is; "
                          "name a new file, or move that one away") from None  # fmt: skip
    except OSError as error:
        raise ConfigError(f"--generate-config {target}: cannot create it ({error})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    return ""
