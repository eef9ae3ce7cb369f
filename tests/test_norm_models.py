"""The norms' hand-written rounding models, cross-checked against the derived one.

The four norm ops keep hand-written models (gradcheck_bi/tolerance/, the ops' ``input_rounding``)
where every other op's rounding is derived from its fp64 reference (gradcheck_bi/errors/).
tests/independent/hand_vs_derived.py puts the two side by side per element, in units of u:
forward, the hand tolerance against ``K_SIGMA·σ_derived``; gradients, σ against σ (both
checks multiply theirs by ``K_SIGMA``). benchmarks/norm_models.py sweeps it
(docs/summation_orders.md has the table); these are the relations that table shows, each
with the structure that makes it hold. Input scale 1 (eps ≪ mean square: the hand forward
bound ignores eps's damping of r's error, the derived one does not).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "independent"))

from hand_vs_derived import compare, compare_at

from gradcheck_bi.checks import run_check
from gradcheck_bi.checks.rows import forward as forward_check
from gradcheck_bi.checks.rows import make_point, reference
from gradcheck_bi.checks.rows.point import OpPoint
from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops.fused_add_rms_norm import OPS_ADD
from gradcheck_bi.tolerance.noise import K_SIGMA
from gradcheck_bi.tolerance.summation import OPS_TERM
from gradcheck_bi.vocab import Config

REPO = Path(__file__).resolve().parents[1]
SHAPES = ((5, 7), (4, 96), (2, 1024))
GATED = {"op": "rms_norm_gated", "norm_before_gate": False}
POINTS = [  # (op options, γ control, zcg): a few per op, every shape each
    ({"op": "rms_norm"}, "randn", False),
    ({"op": "rms_norm", "bias": "randn"}, "ones", True),
    ({"op": "fused_add_rms_norm"}, "randn", True),
    ({"op": "layer_norm", "bias": "randn"}, "ones", False),
    ({**GATED, "group_size": None}, "randn", False),
    ({**GATED, "group_size": None, "variant": (("activation", "sigmoid"),)}, "randn", True),
    ({"op": "rms_norm_gated", "norm_before_gate": True}, "ones", False),
]


def _at(opts: dict, gamma: str, zcg: bool, shape: tuple[int, ...], seed: int = 11) -> dict:
    return compare(Config("forward", shape=shape, control=gamma, zero_centered_gamma=zcg,
                          seed=seed, **opts))


def _where(got: dict, q: str, ratio: torch.Tensor, bad: torch.Tensor) -> str:
    i = int(bad.nonzero()[0])
    return (f"{q}: hand/derived {float(ratio[i]):.4g} at element {i} (hand "
            f"{float(got[q].hand.reshape(-1)[i]):.4g} u, derived "
            f"{float(got[q].derived.reshape(-1)[i]):.4g} u)")


def _ratio(got: dict, q: str) -> torch.Tensor:
    return got[q].ratio().reshape(-1)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"D{s[-1]}")
@pytest.mark.parametrize(("opts", "gamma", "zcg"), POINTS,
                         ids=lambda v: v["op"] if isinstance(v, dict) else str(v))
def test_bounds_between_derived_sigma_and_its_tolerance(opts: dict, gamma: str, zcg: bool,
                                                        shape: tuple[int, ...]) -> None:
    got = _at(opts, gamma, zcg, shape)
    for q in got:
        if q in ("y (judged)", "dbias", "residual_out"):
            continue  # the one max-scaled number; β's sum and the add: their own tests
        r = _ratio(got, q)
        # Never below the derived σ: the hand forward is K_SIGMA·sqrt(its variance) (or, at
        # D ≤ ~40, the worst case D/2 + 4 roundings) over the same roundings; a gradient's σ
        # counts the same sums, r's error and products. Its dw is the exception it declares:
        # r's error is the forward's, which the finite difference in w sees (summation.py),
        # while the derived one carries it into dw — asserted only from above.
        if q != "dw" and not (q == "dz" and opts.get("norm_before_gate")):
            low = r < 1 / K_SIGMA
            assert not low.any(), _where(got, q, r, low)
        # Never looser than the derived model, except where the hand model is shared:
        # - the derived one counts each addition of a sum at RMS u with Σ E s_k² over-counted
        #   as n/3 S² + n/2 Q (the exact (n+1)(Q/6 + S²/3) − Q/n is the hand's), the
        #   mean square's drift at u where the hand's ONE_SIGN is u/√3, and rsqrt at 4 u
        #   where the hand's OPS_RSQRT is 2: the hand is tighter wherever those decide;
        # - the fused add's dx, dresidual: the hand charges OPS_ADD roundings of |d_s| to the
        #   residual_out cotangent's add, the derived one the add's own and its terms':
        #   at most sqrt(OPS_ADD) where that add decides;
        # - a layer norm's forward: its mean's error is one shift per point, K_SIGMA·max|γ|·
        #   max over rows (Op.shift), on every element — looser where |γ_i| < max|γ|;
        # - a sigmoid gate's dz: the hand model rounds σ'(z) = σ (1 − σ) as one op at its
        #   terms' size, the derived one propagates σ's rounding through 1 − σ (up to 8 %
        #   apart at these points); the bound from below still holds.
        sigmoid = dict(opts.get("variant", ())).get("activation") == "sigmoid"
        if (opts["op"] == "layer_norm" and q == "y") or (q == "dz" and sigmoid):
            continue
        top = math.sqrt(OPS_ADD) if opts["op"] == "fused_add_rms_norm" and q != "y" else 1.0
        high = r > top
        assert not high.any(), _where(got, q, r, high)


@pytest.mark.parametrize("rows", [3, 8])
def test_dbias_is_the_sum_model_with_two_roundings_per_term(rows: int) -> None:
    """dbias sums g over the rows: the hand ``OPS_TERM Σ g² + V(g)`` charges forming each
    term (exact here: ∂y/∂β = 1), the derived ``n/3 S² + n/2 Q`` does not — so their ratio is
    that formula's, exactly: above 1 at a few rows, below it at many."""
    cfg = Config("forward", shape=(rows, 33), seed=11, op="rms_norm", bias="randn")
    got = compare(cfg)
    cot = make_point(cfg).cotangents["y"].to(torch.float64)
    n, q, s = rows, (cot * cot).sum(0), cot.sum(0)
    hand = OPS_TERM * q + (n + 1) * (q / 6 + s * s / 3) - q / n
    derived = n / 3 * s * s + n / 2 * q
    want = (hand / derived).sqrt()
    torch.testing.assert_close(_ratio(got, "dbias"), want, rtol=1e-9, atol=0)


def test_residual_out_is_two_roundings_against_one_at_k_sigma() -> None:
    """``residual_out = x + residual``: the hand ``(u_out + u_c)|s|``, the derived one
    rounding, ``K_SIGMA·|s|``."""
    got = _at({"op": "fused_add_rms_norm"}, "randn", False, (4, 96))
    r = _ratio(got, "residual_out")
    torch.testing.assert_close(r, torch.full_like(r, 2 / K_SIGMA), rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [(3, 1), (5, 7), (4, 96)], ids=lambda s: f"D{s[-1]}")
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("gamma", ["zeros", "randn"])
def test_gated_beta_before_the_gate_rounded_by_the_gate(gamma: str, activation: str,
                                                        shape: tuple[int, ...]) -> None:
    """Before the gate β's part of ``y`` is ``β·act(z)``: the gate's roundings act on it as
    on the rest of ``y``. ``compute_bound`` once gave it one rounding (``|β|``, as if added
    last): at γ = 0 the hand bound fell to 0.031 of the derived ``K·σ``, below the derived
    σ itself. It now charges it the op's roundings per element (``forward_factor(0,
    extra)``: the gate's, not the statistic's): never below σ."""
    got = _at({"op": "rms_norm_gated", "norm_before_gate": True, "bias": "randn",
               "variant": (("activation", activation),)}, gamma, False, shape)
    for q in ("y", "y (judged)"):
        r = _ratio(got, q)
        low = r < 1 / K_SIGMA
        assert not low.any(), _where(got, q, r, low)


CANCELLING = [  # (op, row length where n = ±1 exactly up to eps, a correct kernel)
    ("rms_norm", 1, "tests/kernels/variants.py:rms_norm_bias"),
    ("layer_norm", 2, "tests/kernels/layer_norm.py"),
]


def _cancelling_config(op: str, d: int, dtype: str, seed: int) -> Config:
    return Config("forward", dtype=dtype, shape=(3, d), op=op, bias="randn", control="randn",
                  input_scale=1e3, seed=seed)


def _cancelling(op: str, d: int, dtype: str, seed: int, rel: float = 1e-3) -> OpPoint:
    """Three rows whose ``n γ`` is one row vector (``|x|`` at D = 1; each row sorted at
    D = 2), and β = −(1 + rel)·n γ: ``y = −rel·n γ`` in every element."""
    point = make_point(_cancelling_config(op, d, dtype, seed))
    x = point.inputs["x"]
    point.inputs["x"] = x.abs() if d == 1 else torch.sort(x, dim=-1).values
    point.params["bias"] = torch.zeros_like(point.params["bias"])
    n_gamma = reference(point)["y"]  # eps ≪ x²: rows equal far within rel
    torch.testing.assert_close(n_gamma, n_gamma[:1].expand_as(n_gamma), rtol=rel / 100,
                               atol=0)
    point.params["bias"] = (-(1.0 + rel) * n_gamma[0]).to(x.dtype)
    return point


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize(("op", "d", "kernel"), CANCELLING, ids=[c[0] for c in CANCELLING])
def test_judged_forward_counts_beta_where_it_cancels(op: str, d: int, kernel: str, dtype: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where β cancels ``n γ`` in every element, ``max|y|`` is a thousandth of the terms a
    correct kernel rounds (``n γ``, the add of β). The judged forward tolerance, once
    ``max|y|``-scaled, fell to 1.5e-4 of the derived ``K·σ`` there, and a correct fp32
    RMSNorm with a bias failed its forward at 255 × its tolerance (seed 4); scaled by
    ``max(|y − β| + |β|)`` it stays above the derived σ, and the correct kernels pass with a
    margin. (The layer norm's mean shift kept its tolerance up before: a guard.)"""
    for seed in (3, 4, 5):
        point = _cancelling(op, d, dtype, seed)
        got = compare_at(point)
        r = _ratio(got, "y (judged)")
        low = r < 1 / K_SIGMA
        assert not low.any(), _where(got, "y (judged)", r, low)
        monkeypatch.setattr(forward_check, "make_point", lambda _cfg, p=point: p)
        m = run_check(resolve(str(REPO / kernel)).fn, _cancelling_config(op, d, dtype, seed))
        assert m.passed and m.max_abs_err <= m.tolerance / 2, (
            f"{op} {dtype} seed {seed}: err {m.max_abs_err:.3e}, tol {m.tolerance:.3e}")


def test_derived_dz_rounds_silu_grad_by_its_terms() -> None:
    """``silu'(z) = σ(z) (1 + z (1 − σ(z)))`` cancels to 0 at z ≈ −1.28. The derived model
    once rounded ``silu_backward`` at ``8·|silu'(z)|`` there — K_SIGMA times below the hand
    model's σ, which holds it relative to the size of its terms (``silu_grad_size``: a
    correct bf16 kernel failed dz before that). It now rounds it by its terms too
    (``errors.aten.TERMS``): at most as tight as the hand model, all over the row."""
    got = _at({"op": "rms_norm_gated", "norm_before_gate": True}, "ones", False, (4, 96),
              seed=7)
    assert float(_ratio(got, "dz").max()) <= 1.0
