"""What the commands share: option choices (Typer needs Enums), parsers, output writing.

Parsers raise :class:`UsageError`, which ``main`` turns into one line on stderr and exit 2.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from gradcheck_bi._atomic import write_atomically
from gradcheck_bi.cli.early import UsageError, check_paths, check_writable
from gradcheck_bi.fd import parse_bytes
from gradcheck_bi.vocab import CHECKS, CONTROLS, DTYPES

__all__ = ["UsageError", "check_paths", "check_writable"]


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Zcg(str, Enum):
    off = "off"
    on = "on"
    both = "both"

    @property
    def settings(self) -> list[bool]:
        return {"off": [False], "on": [True], "both": [False, True]}[self.value]


DType = Enum("DType", {k: k for k in DTYPES}, type=str)  # type: ignore[misc]
Check = Enum("Check", {k: k for k in CHECKS}, type=str)  # type: ignore[misc]
Control = Enum("Control", {k: k for k in CONTROLS}, type=str)  # type: ignore[misc]


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"
    junit = "junit"


class Mode(str, Enum):
    full = "full"
    directional = "directional"


class Expect(str, Enum):
    pass_ = "pass"
    fail = "fail"


class PlotDType(str, Enum):
    # Finite differences of an fp16/bf16 forward sit on a noise floor near 1e-1: no V to see.
    fp64 = "fp64"
    fp32 = "fp32"


class PlotStencil(str, Enum):
    central4 = "central-4"
    central2 = "central-2"


class PlotFormat(str, Enum):
    png = "png"
    terminal = "terminal"
    json = "json"


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
