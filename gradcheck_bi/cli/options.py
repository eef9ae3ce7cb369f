"""What the commands share: option choices, the help panels, parsers, output writing.

Choices are plain strings checked here rather than Enums checked by Typer, so that every
list option takes repeated flags *and* comma lists (``--check dx,dw`` = ``--check dx
--check dw``) and a bad value gets the same one line on every Typer version. Parsers raise
:class:`UsageError`, which ``main`` turns into one line on stderr and exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from gradcheck_bi._atomic import write_atomically
from gradcheck_bi.cli.early import UsageError, check_paths, check_writable
from gradcheck_bi.fd import parse_bytes
from gradcheck_bi.vocab import CHECKS, CONTROLS, DTYPES, did_you_mean

__all__ = ["CHECKS", "CONTROLS", "UsageError", "check_paths", "check_writable"]

# The help's panels, in the order a first-time user needs them.
WHAT = "What to check"
WHERE = "Where it runs"
JUDGE = "How to judge"
OUTPUT = "Output"

DEVICES = ("cpu", "cuda")
DTYPE_NAMES = tuple(DTYPES)
ZCG = {"off": [False], "on": [True], "both": [False, True]}
FORMATS = ("table", "text", "markdown", "json", "junit", "github")
MODES = ("full", "directional")
EXPECTS = ("pass", "fail")
# Finite differences of an fp16/bf16 forward sit on a noise floor near 1e-1: no V to see.
PLOT_DTYPES = ("fp64", "fp32")
PLOT_STENCILS = ("central-4", "central-2")
PLOT_FORMATS = ("png", "terminal", "json")


def choices(options: Sequence[str], many: bool = False) -> str:
    """The metavar that names the choices: ``cpu|cuda``, ``dx|dw,…`` for a list."""
    return "|".join(options) + (",…" if many else "")


def one_of(option: str, value: str | None, allowed: Sequence[str]) -> str | None:
    """``value`` if it is one of ``allowed`` (``None`` stays ``None``)."""
    if value is not None and value not in allowed:
        raise UsageError(f"{option} {value!r}: expected one of {', '.join(allowed)}"
                         f"{did_you_mean(value, allowed)}")
    return value


def many_of(option: str, values: Sequence[str] | None,
            allowed: Sequence[str] | None = None) -> list[str] | None:
    """Repeated flags and comma lists, flattened in order without repeats; ``None`` if none.

    >>> many_of("--check", ["dx,dw", "dx", "forward"], ("forward", "dx", "dw"))
    ['dx', 'dw', 'forward']
    """
    if not values:
        return None
    items = [part.strip() for v in values for part in v.split(",")]
    if any(not item for item in items):
        raise UsageError(f"{option} {','.join(values)!r}: empty item in a comma list")
    for item in items:
        if allowed is not None:
            one_of(option, item, allowed)
    return list(dict.fromkeys(items))


def parse_shape(text: str) -> tuple[int, ...]:
    """``"2,8,256"`` → ``(2, 8, 256)``; every dim a positive integer."""
    try:
        dims = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise UsageError(
            f"--shape {text!r}: expected comma-separated integers, e.g. 2,8,256") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"--shape {text!r}: every dimension must be a positive integer")
    return dims


def parse_group_sizes(values: Sequence[str] | None) -> list[int | None] | None:
    """``--group-size 8,D``: integers >= 1, ``D`` for one group per row (None)."""
    if not values:
        return None
    out: list[int | None] = []
    for text in (v.strip() for value in values for v in value.split(",")):
        if text == "D":
            out.append(None)
        elif text.isdigit() and int(text) >= 1:
            out.append(int(text))
        else:
            raise UsageError(f"--group-size {text!r}: an integer >= 1, or D (one group per "
                             "row)")
    return out


def parse_kernel_arg(text: str) -> tuple[str, Any]:
    """``"casting_mode=gemma"`` → ``("casting_mode", "gemma")``; the value is read as a TOML
    value when it is one (``true``, ``1e-5``, ``[1, 2]``), else kept as a string."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise UsageError(f"--kernel-arg {text!r}: expected name=value, e.g. casting_mode=gemma")
    try:
        return name, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return name, value


def parse_memory(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1048576"`` → bytes."""
    try:
        return parse_bytes(text)
    except ValueError:
        raise UsageError(f"--max-memory {text!r}: expected bytes, e.g. 512M or 2G") from None


def write_output(path: Path, text: str, option: str = "--output") -> None:
    """Write the report to ``--output`` whole or not at all (checked before the run too)."""
    check_writable(path, option)
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise UsageError(f"{option} {path}: could not write ({exc.strerror or exc})") from None
