"""The inputs of a point: shared across kernels and controls, γ defined on the effective weight."""

from __future__ import annotations

import torch

from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.vocab import Config


def test_inputs_are_shared_across_kernels_and_controls() -> None:
    x1, _, g1 = make_inputs(Config(check="dx", control="randn"))
    x2, w2, g2 = make_inputs(Config(check="forward", control="ones", zero_centered_gamma=True))
    assert x1.equal(x2) and g1.equal(g2)
    assert (w2 == 0).all()  # zcg stores γ − 1: the ones control is still γ = 1


def test_inputs_follow_seed_dtype_and_scales() -> None:
    a = make_inputs(Config(check="dx", seed=3, dtype="fp32", input_scale=1e-3))
    b = make_inputs(Config(check="dx", seed=4, dtype="fp32", input_scale=1e-3))
    assert all(t.dtype == torch.float32 for t in a)
    assert not a[0].equal(b[0]), "a new seed draws new x"
    assert float(a[0].abs().max()) < 1e-2
    assert float(make_inputs(Config(check="dx", control="zeros"))[1].abs().max()) == 0.0
