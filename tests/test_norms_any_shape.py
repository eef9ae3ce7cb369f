"""A norm as an op of any shape: RMSNorm and LayerNorm written as ShapedOps
(tests/kernels/norms_any_shape.py) and checked by the shaped engine — the correct kernels
pass, each mutant the engine catches fails where its defect shows and passes at the control
that hides it (docs/shaped_ops.md, "A norm as an op of any shape")."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradcheck_bi.kernels import resolve
from gradcheck_bi.measure import run_point
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kernels"))
import norms_any_shape as nas  # noqa: E402

RMS, LAYER = "rms_norm_any", "layer_norm_any"
SHAPE = (2, 3, 32)
CORRECT = {RMS: "gradcheck_bi/kernels/bundled/rmsnorm.py:After",
           LAYER: "tests/kernels/layer_norm.py:LayerNorm"}


@pytest.fixture(autouse=True, scope="module")
def _registered() -> Iterator[None]:
    with nas.registered():
        yield


def _status(op: str, ref: str, check: str, dtype: str = "fp64",
            shape: tuple[int, ...] = SHAPE, **axes: object) -> tuple[str, str]:
    spec = resolve(str(ROOT / ref), {"op": op})
    record = nas.ANY[op]
    values = {**dict(record.variants({k: [v] for k, v in spec.fixed})[0].values), **axes}
    cfg = Config(check=check, dtype=dtype, shape=shape, op=op,
                 variant=tuple((a.name, values[a.name]) for a in record.axes))
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    return r.status, r.message


@pytest.mark.parametrize("op,check,axes", [
    (RMS, c, a) for c in ("forward", "dx", "dw", "batch_invariance")
    for a in ({}, {"zero_centered_gamma": True}, {"gamma": "zeros", "zero_centered_gamma": True})
] + [(LAYER, c, a) for c in ("forward", "dx", "dw", "dbias", "batch_invariance")
     for a in ({}, {"gamma": "ones", "beta": "zeros"})])
@pytest.mark.parametrize("dtype", ["fp64", "bf16"])
def test_correct_kernel_passes(op: str, check: str, axes: dict[str, object], dtype: str) -> None:
    status, message = _status(op, CORRECT[op], check, dtype, **axes)
    assert status == "pass", (op, check, axes, dtype, message)


M = "tests/mutants/"
L = "tests/mutants/ops/"
BUNDLED = "gradcheck_bi/kernels/bundled/rmsnorm.py:"
ODD = (2, 3, 200)  # D not a multiple of 128: where tail-dropping sums show
DEFAULT = (2, 8, 256)  # the ops' default shape: 16 rows
# The bf16 forward mutants m31, m32 err by 1.2-1.3x the shaped engine's bf16 bound (one ulp
# plus fp32 rounding) at D = 128 and pass it at D = 32: fewer elements, no ulp boundary hit.
LOWP = (2, 4, 128)
# (op, kernel, check, dtype, shape, axes where it fails, axes where it is blind)
CAUGHT = [
    (RMS, M + "m01_dx_double_weight.py:Mutant", "dx", "fp64", SHAPE, {}, {"gamma": "ones"}),
    (RMS, M + "m02_forward_ignores_zcg.py:Mutant", "forward", "fp64", SHAPE,
     {"zero_centered_gamma": True}, {}),
    (RMS, M + "m04_dx_no_variance_term.py:Mutant", "dx", "fp64", SHAPE, {"gamma": "ones"},
     {"gamma": "zeros"}),
    (RMS, M + "m10_dw_times_gamma.py:Mutant", "dw", "fp64", SHAPE, {}, {"gamma": "ones"}),
    (RMS, M + "m11_backward_ignores_zcg.py:Mutant", "dx", "fp64", SHAPE,
     {"zero_centered_gamma": True}, {}),
    (RMS, M + "m12_s_raw_weight_zcg.py:Mutant", "dx", "fp64", SHAPE,
     {"zero_centered_gamma": True}, {}),
    # eps outside the root: within fp32's rounding in size, but a systematic scale (at 8
    # rows and more the working-precision search tests the bias); γ = 0 leaves y = 0
    (RMS, M + "m15_eps_outside_sqrt.py:Mutant", "forward", "fp64", DEFAULT, {},
     {"gamma": "zeros"}),
    (RMS, M + "m15_eps_outside_sqrt.py:Mutant", "dx", "fp64", DEFAULT, {}, None),
    (RMS, M + "m19_reduction_drops_tail.py:Mutant", "forward", "fp64", ODD, {}, None),
    (RMS, M + "m21_dx_approx_rsqrt.py:Mutant", "dx", "fp64", SHAPE, {}, {"gamma": "zeros"}),
    (RMS, M + "m22_dw_rsigma_18_bits.py:Mutant", "dw", "fp64", SHAPE, {}, None),
    (RMS, M + "m23_dx_eps_scaled.py:Mutant", "dx", "fp64", SHAPE, {}, None),
    (RMS, M + "m31_lowp_zcg_offset_in_input_dtype.py:Mutant", "forward", "bf16", LOWP,
     {"zero_centered_gamma": True}, {"gamma": "ones", "zero_centered_gamma": True}),
    # m32 errs by 0.93-1.46x the shaped engine's bf16 bound over draws and shapes (D = 64 …
    # 512): caught at the default shape, γ = ones; one draw at (2, 4, 128) passes it. The row
    # engine's lifted check catches it with margin (tests/test_mutants.py).
    (RMS, M + "m32_lowp_rsigma_rounded.py:Mutant", "forward", "bf16", DEFAULT,
     {"gamma": "ones"}, None),
    (RMS, M + "m35_lowp_dw_accumulated_in_input_dtype.py:Mutant", "dw", "bf16", SHAPE,
     {}, None),
    (RMS, BUNDLED + "Before", "dx", "fp64", SHAPE, {}, {"gamma": "ones"}),
    (RMS, BUNDLED + "FixedDx", "forward", "fp64", SHAPE, {"zero_centered_gamma": True}, {}),
    (LAYER, L + "ln01_mean_subtracted_twice.py:Mutant", "dx", "fp64", SHAPE, {}, None),
    (LAYER, L + "ln02_dbias_times_gamma.py:Mutant", "dbias", "fp64", SHAPE, {},
     {"gamma": "ones"}),
    (LAYER, L + "ln03_dx_drops_the_mean_term.py:Mutant", "dx", "fp64", SHAPE,
     {"gamma": "ones"}, None),
    (LAYER, L + "ln04_variance_not_centred.py:Mutant", "forward", "fp64", SHAPE, {}, None),
    (LAYER, L + "ln05_lowp_normalised_row_cast_down.py:Mutant", "forward", "bf16", SHAPE, {},
     None),
]


@pytest.mark.parametrize("op,ref,check,dtype,shape,shows,blind", CAUGHT,
                         ids=[c[1].rsplit("/", 1)[-1] for c in CAUGHT])
def test_mutant_caught_and_hidden_at_its_control(op: str, ref: str, check: str, dtype: str,
                                                  shape: tuple[int, ...],
                                                  shows: dict[str, object],
                                                  blind: dict[str, object] | None) -> None:
    status, message = _status(op, ref, check, dtype, shape, **shows)
    assert status == "fail", (ref, check, shows, status, message)
    if blind is not None:
        status, message = _status(op, ref, check, dtype, shape, **blind)
        assert status == "pass", (ref, check, blind, status, message)


def test_batch_order_keyed_on_the_row_count_fails_below_it_too() -> None:
    """m17 sums in two halves below 32 rows: the shaped check places the point's rows in
    batches of 33 … 1025 rows too, so a point of 6 rows shows it as well as one of 40."""
    ref = M + "m17_batch_dependent_order.py:Mutant"
    status, message = _status(RMS, ref, "batch_invariance", shape=ODD)
    assert status == "fail" and "in 33 rows vs in 6 rows" in message, message
    assert _status(RMS, ref, "batch_invariance", shape=(40, 200))[0] == "fail"


@pytest.mark.parametrize("op,ref", [(RMS, M + "m13_compute_in_fp32.py:Mutant"),
                                    (LAYER, "tests/kernels/fp32_inside.py:layer_norm")])
@pytest.mark.parametrize("check", ["forward", "dx"])
def test_fp32_inside_is_judged_at_fp32(op: str, ref: str, check: str) -> None:
    """A correct norm computing in fp32 inside an fp64 call: its rounding is unbiased, so
    the search that rejects m15's systematic error keeps fp32 for it."""
    status, message = _status(op, ref, check, shape=DEFAULT)
    assert status == "pass" and "computes in fp32 inside" in message, message


def test_eps_outside_the_root_is_said_to_be_systematic() -> None:
    status, message = _status(RMS, M + "m15_eps_outside_sqrt.py:Mutant", "forward",
                              shape=DEFAULT)
    assert status == "fail" and "not fp32 rounding inside" in message, message
