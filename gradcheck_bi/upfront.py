"""What a run settles over its whole grid before the first point is measured.

* :func:`check_memory` — a finite-difference check that cannot fit in its memory budget
  refuses the run (exit 2, with the estimate), before any point runs, so every shard of
  the grid refuses alike;
* :func:`preload_cpu_sums` — the compiled CPU sums are loaded before the workers fork:
  the C pass for any CPU finite differences, numba when the run's checks together repay
  its start (:func:`gradcheck_bi.fd.reduce.preload`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi import fd
from gradcheck_bi.fd.coloured import check_input_budget
from gradcheck_bi.ops import ROWS
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import DTYPES, HALF_DTYPES, Config, KernelSpec


def check_memory(points: list[tuple[KernelSpec, Config, Sweep]]) -> None:
    """Refuse up front (``fd.MemoryBudgetError``, with the estimate) a run one of whose
    finite-difference checks cannot fit in its memory budget: an RMSNorm's dx and dw and a
    parameter check of another row op by :func:`fd.check_budget`, an input check of a row op
    (one perturbed column of every row per call) by :func:`fd.coloured.check_input_budget`."""
    seen: set[tuple[Any, ...]] = set()
    for _, cfg, _ in points:
        key = (cfg.op, cfg.check, cfg.shape, cfg.dtype, cfg.mode, cfg.directions, cfg.stencil,
               cfg.max_memory)
        if cfg.op not in ROWS:  # an op of any shape holds one perturbed copy at a time
            continue
        name = ROWS[cfg.op].gradient_checks.get(cfg.check)
        if name is None or key in seen:
            continue
        seen.add(key)
        # bf16/fp16 gradients are differenced in a lifted dtype, fp64 at most.
        fd_dtype = torch.float64 if cfg.dtype in HALF_DTYPES else DTYPES[cfg.dtype]
        shape = tuple(cfg.shape)
        if cfg.mode == "directional" and name in ROWS[cfg.op].inputs:  # a row per direction
            shape = (cfg.directions, *shape)
        elif name in ROWS[cfg.op].inputs:
            check_input_budget(shape, fd_dtype, cfg.max_memory)
            continue
        fd.check_budget(shape, fd.STENCILS[cfg.stencil], fd_dtype, cfg.max_memory)


def preload_cpu_sums(points: list[tuple[KernelSpec, Config, Sweep]]) -> None:
    """Load the compiled CPU sums up front (``fd.reduce.preload``): the C pass for any
    full input-gradient check on CPU, numba where this run's together reduce enough
    perturbed elements to repay its start — every level of every column of every row, each
    reaching the row of every output. The workers forked after this inherit them loaded."""
    work: dict[torch.dtype, int] = {}
    for _, cfg, _ in points:
        if cfg.op not in ROWS:
            continue
        op = ROWS[cfg.op]
        if (cfg.device != "cpu" or cfg.mode != "full"
                or op.gradient_checks.get(cfg.check) not in op.inputs):
            continue
        dtype = DTYPES.get(cfg.dtype)
        if dtype is not None:
            d = cfg.shape[-1]
            rows = math.prod(cfg.shape[:-1])
            levels = 2 * len(fd.LEVELS)
            work[dtype] = work.get(dtype, 0) + levels * d * rows * d * len(op.outputs)
    fd.reduce.preload(work)
