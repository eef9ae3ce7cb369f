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
from gradcheck_bi.point import AXIS, Axis, BadValue, boolean
from gradcheck_bi.vocab import did_you_mean

__all__ = ["UsageError", "check_paths", "check_writable"]

# The help's panels, in the order a first-time user needs them.
WHAT = "What to check"
WHERE = "Where it runs"
JUDGE = "How to judge"
OUTPUT = "Output"

ZCG = {"off": [False], "on": [True], "both": [False, True]}
FORMATS = ("table", "text", "markdown", "json", "junit", "github")
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
    return tuple(read(AXIS["shape"], text)[0])


def read(axis: Axis, raw: Any) -> Any:
    """A ``run`` option's value → the value of the axis's case key, by the axis's own rule
    (:mod:`gradcheck_bi.point`); ``None`` when the option was not given.

    A crossed axis's list option takes repeated flags and comma lists (a shape: one per
    flag), its single option a list of one; a boolean axis takes off, on or both.

    >>> read(AXIS["control"], ["ones,randn"]), read(AXIS["eps"], 1e-5), read(AXIS["mode"], None)
    (['ones', 'randn'], [1e-05], None)
    """
    option = axis.cli or axis.public
    if raw is None or raw == []:
        return None
    if axis.value is boolean:
        return ZCG[one_of(option, raw, tuple(ZCG)) or "off"]
    if axis.choices:
        return many_of(option, raw, axis.choices) if isinstance(raw, list) else one_of(
            option, raw, axis.choices)
    if isinstance(raw, list):
        return [_value(axis, option, w) for w in (raw if axis.whole else many_of(option, raw)
                                                  or [])]
    value = _value(axis, option, raw)
    return [value] if axis.plural else value


def _value(axis: Axis, option: str, raw: Any) -> Any:
    try:
        return axis.value(axis.word(raw) if axis.word is not None else raw)
    except BadValue as exc:
        raise UsageError(f"{option} {raw!r}: expected {exc}{exc.hint}") from None


def parse_kernel_arg(text: str) -> tuple[str, Any]:
    """``"casting_mode=gemma"`` → ``("casting_mode", "gemma")``; the value is read as a TOML
    value when it is one (``true``, ``1e-5``, ``[1, 2]``), else kept as a string."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise UsageError(f"--kernel-arg {text!r}: expected name=value, e.g. casting_mode=gemma")
    python = {"True": True, "False": False, "None": None}  # as a Python user types them
    if value.strip() in python:
        return name, python[value.strip()]
    try:
        return name, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return name, value


def write_output(path: Path, text: str, option: str = "--output") -> None:
    """Write the report to ``--output`` whole or not at all (checked before the run too)."""
    check_writable(path, option)
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise UsageError(f"{option} {path}: could not write ({exc.strerror or exc})") from None
