"""Shared helpers: fresh random data per test, and failures that say where they differ."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

# Test kernel files import their siblings as ``tests.kernels.NAME`` (the CLI runs them from
# the repository root, which is on the path there): so does any single test file run alone.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every worker process a run starts: (its device kind, ``fork`` or ``spawn``, or
    ``kept``: a kernel's recording child handed over, :mod:`gradcheck_bi.workers`)."""
    from gradcheck_bi import workers

    seen: list[tuple[str, str]] = []
    original = workers._Worker.__init__

    def init(self: Any, lane: Any, device: Any, points: Any, tasks: Any,
             kept: Any = None) -> None:
        seen.append((lane.kind, "kept" if kept is not None else lane.start))
        original(self, lane, device, points, tasks, kept)

    monkeypatch.setattr(workers._Worker, "__init__", init)
    return seen


def load_benchmark(stem: str, name: str | None = None) -> ModuleType:
    """``benchmarks/STEM.py`` as the module ``name`` (``stem`` unless a test module of that
    name exists), registered in ``sys.modules`` (a dataclass in it needs that)."""
    name = name or stem
    spec = importlib.util.spec_from_file_location(name, Path(ROOT) / "benchmarks" / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def rand(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 0,
         scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).mul(scale).to(dtype)


def where_differs(a: torch.Tensor, b: torch.Tensor) -> str:
    """'max |a-b| = … at index …, k of n elements differ' for assertion messages."""
    diff = (a.double() - b.double()).abs()
    n = int((diff != 0).sum())
    if n == 0:
        return "identical"
    idx = [int(i) for i in torch.unravel_index(torch.argmax(diff), diff.shape)]
    return f"max |a-b| = {float(diff.max()):.3e} at {idx}; {n} of {diff.numel()} elements differ"
