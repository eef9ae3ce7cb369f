"""Fixed-order row reductions: a row's bits never depend on how many rows are launched.

``row_sum(t)`` returns ``t.sum(-1)`` computed in a fixed order that depends only on the
last dimension ``D``: the row is cut into blocks of ``BLOCK_D = min(1024, next_pow2(D))``
columns, the blocks are added one after another into a ``BLOCK_D``-wide accumulator, and
the accumulator is folded to one number. Nothing in that order depends on the number of
rows, so the result for a row is bitwise the same alone or inside any batch.

Three paths run it:

* ``triton``  — a Triton kernel; compiled on CUDA, run by Triton's interpreter on CPU;
* ``torch``   — the same blocking written with torch ops (fast on CPU);

``backend=None`` picks ``triton`` for CUDA tensors and ``torch`` for CPU tensors; the
environment variable ``GRADCHECK_BI_BACKEND`` (``triton`` | ``torch``) or
:func:`use_backend` overrides it. The accumulator is created in the tensor's own dtype,
so fp64 stays fp64 (a Python ``0.0`` start value would be fp32).

>>> import torch
>>> row_sum(torch.ones(3, 5, dtype=torch.float64)).tolist()
[5.0, 5.0, 5.0]
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterator

import torch

from gradcheck_bi.sums.blocking import block_d

BACKENDS = ("torch", "triton")
_forced_backend: str | None = None


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Force a reduction backend inside a ``with`` block (``None`` restores automatic)."""
    global _forced_backend
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown reduction backend {name!r}; expected one of {BACKENDS}")
    previous, _forced_backend = _forced_backend, name
    try:
        yield
    finally:
        _forced_backend = previous


def chosen_backend() -> str | None:
    """The backend :func:`use_backend` or ``GRADCHECK_BI_BACKEND`` chose (``None``:
    automatic, by device)."""
    return _forced_backend or os.environ.get("GRADCHECK_BI_BACKEND") or None


def resolve_backend(t: torch.Tensor, backend: str | None = None) -> str:
    """The backend that ``row_sum`` uses for ``t``: explicit, forced, environment, automatic."""
    name = backend or chosen_backend()
    if name is None:
        return "triton" if t.is_cuda else "torch"
    if name not in BACKENDS:
        raise ValueError(f"unknown reduction backend {name!r}; expected one of {BACKENDS}")
    return name


def row_sum(t: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Fixed-order sum over the last dim; returns shape ``t.shape[:-1]`` in ``t.dtype``."""
    if t.shape[-1] == 0:
        raise ValueError("row_sum needs a non-empty last dimension")
    if resolve_backend(t, backend) == "triton":
        return _row_sum_triton(t)
    return _row_sum_torch(t)


def _row_sum_torch(t: torch.Tensor) -> torch.Tensor:
    n_cols = t.shape[-1]
    width = block_d(n_cols)
    rows = t.reshape(-1, n_cols)
    n_blocks = -(-n_cols // width)
    if n_blocks * width != n_cols:
        rows = torch.nn.functional.pad(rows, (0, n_blocks * width - n_cols))
    # The first addition of each stage is out of place, so the input is never copied:
    # the same additions in the same order as clone-then-add, with one pass fewer.
    if n_blocks > 1:
        acc = rows[:, :width] + rows[:, width : 2 * width]
        for b in range(2, n_blocks):
            acc.add_(rows[:, b * width : (b + 1) * width])
    elif width > 1:
        width //= 2
        acc = rows[:, :width] + rows[:, width : 2 * width]
    else:
        acc = rows[:, :1].clone()
    # Fold the accumulator in halves: element j meets element j + half, a fixed tree.
    # (``add_`` on the view: ``acc[:, :w] += …`` would also dispatch a copy back into it.)
    while width > 1:
        width //= 2
        acc[:, :width].add_(acc[:, width : 2 * width])
    return acc[:, 0].reshape(t.shape[:-1])


def _row_sum_triton(t: torch.Tensor) -> torch.Tensor:
    from gradcheck_bi.sums import _triton  # triton is imported only when used

    n_cols = t.shape[-1]
    rows = t.reshape(-1, n_cols).contiguous()
    out = torch.empty(rows.shape[0], dtype=t.dtype, device=t.device)
    if rows.shape[0] > 0:
        _triton.launch(rows, out, block_d(n_cols))
    return out.reshape(t.shape[:-1])


def triton_available() -> bool:
    """True when triton imports here (its interpreter then runs on CPU)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_version() -> str | None:
    """The installed triton's version, for the report, or ``None`` without one. Read from
    the loaded module, else from the package's metadata: a CPU run that never uses triton
    does not pay its import (0.25–0.35 s, docs/benchmarks.md)."""
    loaded = sys.modules.get("triton")
    if loaded is not None:
        return str(loaded.__version__)
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:  # importable, not installed as a package
        return str(importlib.import_module("triton").__version__)
