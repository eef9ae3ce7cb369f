"""An input's relative finite-difference step as a check chooses it (the verdict itself, element
by element: :mod:`gradcheck_bi.checks.fd_judge`)."""

from __future__ import annotations

from gradcheck_bi.fd.step import input_step_rel
from gradcheck_bi.vocab import DTYPES, Config


def step_rel_of(cfg: Config) -> float | None:
    """An input's relative FD step: the config's; else, for a kernel computing coarser
    inside than its dtype, its working precision's best step (a step fit for fp64 drowns
    an fp32 forward's differences in its rounding); ``None``: the dtype's."""
    if cfg.step_rel is not None or cfg.working_precision is None:
        return cfg.step_rel
    return input_step_rel(DTYPES[cfg.working_precision])
