"""Finite differences of a kernel's own forward: stencils, steps, noise floor, memory budget.

* :mod:`~gradcheck_bi.fd.stencil` — the central stencils and how their sums combine;
* :mod:`~gradcheck_bi.fd.step` — step sizes, per row for x and one for w;
* :mod:`~gradcheck_bi.fd.budget` — memory: the default budget, chunk sizes, the refusal;
* :mod:`~gradcheck_bi.fd.threads` — CPU threads for the chunk loop, by chunk size;
* :mod:`~gradcheck_bi.fd.reduce` — the per-(row, column) level sums of a chunk (fused on CUDA,
  compiled on CPU for large checks);
* :mod:`~gradcheck_bi.fd.chunks` — padding a batched call to a ladder step; spawning worker
  processes without the caller's script;
* :mod:`~gradcheck_bi.fd.coloured` — every element of an input's gradient, row-coloured,
  for a forward with several outputs;
* :mod:`~gradcheck_bi.fd.estimate` — the estimate record, random directions of an input's
  gradient, every element of a weight's gradient;
* :mod:`~gradcheck_bi.fd.refine` — a second, finer step at chosen elements (kinks);
* :mod:`~gradcheck_bi.fd.weight` — how the output depends on a weight (linear, elementwise),
  and the weight estimate one element at a time.
"""

from gradcheck_bi.fd import reduce, threads
from gradcheck_bi.fd.budget import (
    BYTES_PER_ELEMENT,
    FIXED_BYTES_PER_ELEMENT,
    MemoryBudgetError,
    batch_rows,
    check_budget,
    chunk_shape,
    default_max_memory,
    memory_estimate,
    parse_bytes,
)
from gradcheck_bi.fd.estimate import (
    DirectionalEstimate,
    FDEstimate,
    directional_input_grad,
    weight_grad,
)
from gradcheck_bi.fd.stencil import CENTRAL2, CENTRAL4, LEVELS, STENCILS, Stencil
from gradcheck_bi.fd.step import STEP_REL, row_steps

__all__ = [
    "BYTES_PER_ELEMENT",
    "CENTRAL2",
    "CENTRAL4",
    "FIXED_BYTES_PER_ELEMENT",
    "LEVELS",
    "STENCILS",
    "STEP_REL",
    "DirectionalEstimate",
    "FDEstimate",
    "MemoryBudgetError",
    "Stencil",
    "batch_rows",
    "check_budget",
    "chunk_shape",
    "default_max_memory",
    "directional_input_grad",
    "memory_estimate",
    "parse_bytes",
    "reduce",
    "row_steps",
    "threads",
    "weight_grad",
]
