"""The inputs of one point: ``x``, the stored weight for its γ control, and the upstream ``g``.

Controls are defined on the effective weight γ: under ``zero_centered_gamma`` the stored
parameter is ``γ - 1``, so γ = ones stays the blind control in both modes. Everything is
drawn in fp64 from the point's seed and only then cast, so the draw depends only on seed,
shape and scales — never on kernel, check, zcg or device — and every kernel and control
sees the same ``x`` and ``g``.

>>> from gradcheck_bi.vocab import Config
>>> x, w, g = make_inputs(Config(check="dx", shape=(2, 4), control="ones",
...                              zero_centered_gamma=True))
>>> w.tolist()
[0.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import torch

from gradcheck_bi.vocab import Config


def effective_gamma(cfg: Config, d: int, gen: torch.Generator) -> torch.Tensor:
    """γ for the point's control, fp64; ``randn`` draws from ``gen`` (after x and g)."""
    gamma_randn = torch.randn(d, generator=gen, dtype=torch.float64) * cfg.weight_scale
    return {
        "randn": gamma_randn,
        "ones": torch.ones(d, dtype=torch.float64),
        "zeros": torch.zeros(d, dtype=torch.float64),
    }[cfg.control]


def make_inputs(cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, stored weight, upstream grad g)`` for a config, in its dtype and on its device."""
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.shape, generator=gen, dtype=torch.float64) * cfg.input_scale
    g = torch.randn(cfg.shape, generator=gen, dtype=torch.float64)
    gamma = effective_gamma(cfg, cfg.shape[-1], gen)
    w = gamma - 1 if cfg.zero_centered_gamma else gamma
    dt, dev = cfg.torch_dtype, torch.device(cfg.device)
    return x.to(dev, dt), w.to(dev, dt), g.to(dev, dt)
