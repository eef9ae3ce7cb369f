"""Choices shared by the `run` and `plot` commands (Typer needs them as Enums)."""

from __future__ import annotations

from enum import Enum

from gradcheck_bi.checks import DTYPES
from gradcheck_bi.kernels.registry import CHECKS, WEIGHTS


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
Weight = Enum("Weight", {k: k for k in WEIGHTS}, type=str)  # type: ignore[misc]
