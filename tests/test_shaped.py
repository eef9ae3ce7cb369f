"""Ops of any shape: the op record, the derived error model, the engine on GEMM,
gelu_and_mul and cross-entropy — correct kernels pass, each mutant fails where its
defect shows and passes at the blind control that hides it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import where_differs

from gradcheck_bi.errors import derived, forward_sigma
from gradcheck_bi.kernels import resolve
from gradcheck_bi.measure import run_point
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant
from gradcheck_bi.sweep import Sweep, shaped_points
from gradcheck_bi.vocab import Config

KERNELS = Path(__file__).resolve().parent / "kernels"


def _result(ref: str, check: str, dtype: str = "fp64", memory: str = "contiguous",
            **axes: object) -> tuple[str, str]:
    """The status and message of one point: the kernel's op's default variant with
    ``axes`` changed, memory layout ``memory``."""
    spec = resolve(str(KERNELS / ref))
    op = SHAPED[spec.op]
    base = dict(op.variants(dict(spec.fixed) and {k: [v] for k, v in spec.fixed})[0].values)
    base.update(axes)
    variant = Variant(tuple((a.name, base[a.name]) for a in op.axes))
    cfg = Config(check=check, dtype=dtype, shape=op.default_shape, op=op.name,
                 variant=variant.values, layout=memory)
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    return r.status, r.message


def test_every_op_is_found_by_its_module():
    assert {"gemm", "gelu_and_mul", "cross_entropy"} <= set(SHAPED)


def test_cancellation_is_derived_not_written():
    """1 + erf(a/√2) at a = −2.8 rounds at hundreds of u relative to its value."""
    a = torch.tensor([-2.8, 0.5], dtype=torch.float64)
    y = 1 + torch.erf(a / math.sqrt(2))
    sigma = forward_sigma(lambda t: {"y": 1 + torch.erf(t["a"] / math.sqrt(2))}, {"a": a})["y"]
    assert float(sigma[0] / y[0]) > 100 > float(sigma[1] / y[1])


def test_range_loss_is_derived_at_the_working_precision():
    """silu(t) = t · sigmoid(t) at t = −100: in fp32 sigmoid's exp(100) overflows and the
    value is lost (torch's own fp32 silu gives −0 where the exact one is −3.7e-42); the
    absolute allowance α covers that error, in y and in dy/dt, and is zero at every value in
    fp32's range; with fp64's range no value leaves it and α is zero everywhere."""
    gen = torch.Generator().manual_seed(7)
    t = torch.cat([torch.tensor([-100.0], dtype=torch.float64),
                   torch.randn(7, generator=gen, dtype=torch.float64)])
    g = torch.randn(8, generator=gen, dtype=torch.float64)

    def silu(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"y": torch.nn.functional.silu(x["t"])}

    fp32 = derived(silu, {"t": t}, {"y": g}, ["t"], reach=torch.float32)
    y = fp32.outputs["y"]
    lost = (torch.nn.functional.silu(t.float()).double() - y).abs()
    alpha, alpha_grad = fp32.output_absolute["y"], fp32.grad_absolute["t"]
    assert float(alpha[0]) > 0 and float(alpha_grad[0]) > 0, (alpha, alpha_grad)
    assert float(lost[0]) > 0 and float(lost[0]) <= float(alpha[0]), (lost, alpha)
    assert bool((alpha[1:] == 0).all()) and bool((alpha_grad[1:] == 0).all()), alpha
    fp64 = derived(silu, {"t": t}, {"y": g}, ["t"], reach=torch.float64)
    assert bool((fp64.output_absolute["y"] == 0).all()), fp64.output_absolute
    assert bool((fp64.grad_absolute["t"] == 0).all()), fp64.grad_absolute


def test_exact_zeros_stay_in_range_beside_a_value_below_it():
    """An exact zero is in fp32's range and gets no α; a value below fp32's smallest normal
    beside it does: the zeros do not hide it."""
    x = torch.tensor([0.0, 1e-20, 3.0, 0.0, -2.0], dtype=torch.float64)
    y = torch.tensor([5.0, 1e-20, 0.5, 7.0, 0.25], dtype=torch.float64)
    g = torch.tensor([0.7, 1.3, -0.4, 0.9, 1.1], dtype=torch.float64)
    m = derived(lambda t: {"p": t["x"] * t["y"]}, {"x": x, "y": y}, {"p": g}, ["x"],
                reach=torch.float32)
    alpha = m.output_absolute["p"]
    assert float(alpha[1]) == float(x[1] * y[1]) and bool((alpha[[0, 2, 3, 4]] == 0).all()), alpha
    zeros = derived(lambda t: {"p": t["x"] * t["y"]}, {"x": x, "y": y.clamp(min=1)},
                    {"p": g}, ["x"], reach=torch.float32)
    assert bool((zeros.output_absolute["p"] == 0).all()), zeros.output_absolute


@pytest.mark.parametrize("op,args,kwargs", [
    (torch.ops.aten.add.Tensor, ("a", "b"), {"alpha": -3.0}),
    (torch.ops.aten.sub.Tensor, ("a", "b"), {}),
    (torch.ops.aten.mul.Tensor, ("a", "b"), {}),
    (torch.ops.aten.mul.Scalar, ("a", 0.3), {}),
    (torch.ops.aten.div.Tensor, ("a", "b"), {}),
    (torch.ops.aten.div.Scalar, ("a", -7.0), {}),
    (torch.ops.aten.neg.default, ("a",), {}),
    (torch.ops.aten.exp.default, ("a",), {}),
    (torch.ops.aten.log.default, ("b",), {}),
    (torch.ops.aten.where.self, ("c", "a", "b"), {})])
def test_closed_form_slopes_are_the_ops_own_derivative(op, args, kwargs):
    """Each closed-form |∂out/∂in| against the central difference of the aten op itself."""
    from gradcheck_bi.errors.derive import SLOPES, _slope

    gen = torch.Generator().manual_seed(3)
    named = {"a": torch.randn(5, 7, generator=gen, dtype=torch.float64),
             "b": 0.5 + torch.rand(7, generator=gen, dtype=torch.float64),
             "c": torch.rand(5, 7, generator=gen) > 0.5}
    real = tuple(named.get(a, a) if isinstance(a, str) else a for a in args)
    out = op(*real, **kwargs)
    rule = SLOPES[f"{op._schema.name.split('::')[-1]}.{op._overloadname}"]
    for i, a in enumerate(real):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            want = _slope(op, real, kwargs, i).abs()
            got = torch.as_tensor(rule(real, kwargs, out, i), dtype=torch.float64).abs()
            got = got.expand_as(out)
            assert torch.allclose(got, want.expand_as(out), rtol=1e-6, atol=0), (op, i)


@pytest.mark.parametrize("ref,op", [("gemm.py:GemmFn", "gemm"),
                                    ("gelu_and_mul.py:GeluAndMul", "gelu_and_mul"),
                                    ("cross_entropy.py:CrossEntropy", "cross_entropy")])
def test_recognised_from_its_forward(ref, op):
    spec = resolve(str(KERNELS / ref))
    assert spec.op == op and "recognised" in spec.recognised


@pytest.mark.parametrize("check", ["forward", "dA", "dB", "dbias", "batch_invariance"])
def test_correct_gemm_passes(check):
    assert _result("gemm.py:GemmFn", check, layout="NN", memory="B-strided")[0] == "pass"
    assert _result("gemm.py:GemmFn", check, dtype="fp32")[0] == "pass"


@pytest.mark.parametrize("ref,shape", [("gemm.py:GemmFn", (1, 27, 28)),
                                       ("gemm.py:GemmFn", (2, 33, 14)),
                                       ("gelu_and_mul.py:GeluAndMul", (2, 5)),
                                       ("cross_entropy.py:CrossEntropy", (1, 7))])
def test_batch_invariance_with_fewer_rows_than_its_padding(ref, shape):
    """A point of 1 or 2 rows in batches of n + 3 rows and more: the fresh rows come from
    a draw of their own size (an IndexError, reported as the kernel's error, once)."""
    spec = resolve(str(KERNELS / ref))
    op = SHAPED[spec.op]
    base = dict(op.variants({k: [v] for k, v in spec.fixed})[0].values)
    base["reduction"] = "none"  # cross-entropy's rows are independent only under none
    variant = Variant(tuple((a.name, base[a.name]) for a in op.axes))
    cfg = Config(check="batch_invariance", shape=shape, op=op.name, variant=variant.values)
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    assert r.status == "pass", r.message


@pytest.mark.parametrize("mutant,check,shows,blind", [
    ("DbiasFirstRow", "dbias", {"cotangent": "random"}, {"cotangent": "ones"}),
    ("DbFirstRow", "dB", {"cotangent": "random"}, {"cotangent": "ones"}),
    ("DaFirstSlice", "dA", {"b_rank": 3}, {"b_rank": 2}),
    ("SmallDefectNN", "dA", {"layout": "NN"}, {"layout": "TN"}),
])
def test_gemm_mutant_caught_where_it_shows(mutant, check, shows, blind):
    ref = f"gemm_mutants.py:{mutant}"
    assert _result(ref, check, **shows)[0] == "fail"
    assert _result(ref, check, **blind)[0] == "pass"


@pytest.mark.parametrize("check", ["forward", "dA", "dB"])
def test_gemm_split_k_below_32_rows_right_to_rounding(check):
    """Its values are right: only batch invariance can show it."""
    assert _result("gemm_mutants.py:SplitKBelow32Rows", check)[0] == "pass"


def test_gemm_split_k_below_32_rows_caught_at_a_batch_of_16():
    """The default point has 16 rows (split): alone, in 16 and in 19 rows the kernel
    splits alike; the batch of 33 rows does not split."""
    status, message = _result("gemm_mutants.py:SplitKBelow32Rows", "batch_invariance")
    assert status == "fail" and "Y row 0 differs in 33 rows vs in 16 rows" in message, message
    assert "alone" not in message and "in 19 rows" not in message, message


def test_gemm_cotangent_strides_ignored_caught_by_layout():
    ref = "gemm_mutants.py:CotangentAsContiguous"
    assert _result(ref, "dA", memory="grad-transposed")[0] == "fail"
    assert _result(ref, "dA")[0] == "pass"


def test_gelu_and_mul_correct_and_mutants():
    assert _result("gelu_and_mul.py:GeluAndMul", "da")[0] == "pass"
    assert _result("gelu_and_mul.py:GeluAndMul", "da", dtype="fp32",
                   approximate="tanh")[0] == "pass"
    assert _result("gelu_and_mul.py:GeluGradNoPdf", "da")[0] == "fail"
    # the tanh backward for both forms: caught at erf, right at tanh
    assert _result("gelu_and_mul.py:TanhBackwardAlways", "da")[0] == "fail"
    assert _result("gelu_and_mul.py:TanhBackwardAlways", "da", approximate="tanh")[0] == "pass"


@pytest.mark.parametrize("mutant,shows,blind", [
    ("AssumesGradOne", {"cotangent": "random"}, {"cotangent": "ones"}),
    ("FirstRowCotangent", {"reduction": "none", "cotangent": "random"},
     {"reduction": "none", "cotangent": "ones"}),
    ("MeanOverAllRows", {"ignore": "some"}, {"ignore": "none"}),
    ("SmoothingWithoutOneMinusEps", {"label_smoothing": 0.1}, {"label_smoothing": 0.0}),
])
def test_cross_entropy_mutant_and_its_blind_control(mutant, shows, blind):
    ref = f"cross_entropy.py:{mutant}"
    assert _result(ref, "dlogits", **shows)[0] == "fail"
    assert _result(ref, "dlogits", **blind)[0] == "pass"


def test_cross_entropy_correct_and_written_logits():
    assert _result("cross_entropy.py:CrossEntropy", "dlogits")[0] == "pass"
    assert _result("cross_entropy.py:CrossEntropy", "dlogits", reduction="none")[0] == "pass"
    assert _result("cross_entropy.py:CrossEntropy", "forward", dtype="bf16")[0] == "pass"
    status, message = _result("cross_entropy.py:GradIntoLogits", "dlogits")
    assert status == "fail" and "wrote into logits" in message


def test_bf16_target_probability_rounded_caught_where_peaked():
    ref = "cross_entropy.py:TargetProbRoundedLowp"
    assert _result(ref, "dlogits", dtype="bf16", peaked=True)[0] == "fail"
    assert _result(ref, "dlogits", dtype="fp64", peaked=True)[0] == "pass"


def test_points_leave_out_what_does_not_apply():
    spec = resolve(str(KERNELS / "cross_entropy.py:CrossEntropy"))
    points = [cfg for _, cfg in shaped_points(Sweep(kernels=[spec.ref],
                                                    targets=[("cpu", "fp64")]), [spec])]
    batch = [dict(c.variant)["reduction"] for c in points if c.check == "batch_invariance"]
    assert batch and set(batch) == {"none"}  # a mean couples the rows
    assert all(dict(c.variant)["softcap"] is None for c in points)  # the kernel takes none


def test_a_check_of_another_op_is_said_not_raised():
    import gradcheck_bi

    report = gradcheck_bi.check(str(KERNELS / "gemm.py:GemmFn"), checks=["da"],
                                raise_on_failure=False)
    assert not report.results
    assert report.unchecked and "check da does not apply to gemm, whose gradients are dA" \
        in report.unchecked[0][1]


def test_liger_signature_bound_and_a_wrong_forward_not_called_coarse_rounding():
    """Liger's CE signature binds with no flags; a weighted mean over the wrong denominator
    fails its forward at fp64 (it was once judged "bf16 inside": a coarser unit is taken
    only where the kernel can have it)."""
    import gradcheck_bi

    good = gradcheck_bi.check(str(KERNELS / "cross_entropy_weighted.py:CrossEntropyLigerSignature"),
                              checks=["forward"], raise_on_failure=False)
    assert good.results and all(r.status == "pass" for r in good.results)
    assert any(dict(r.variant or {}).get("weight") for r in good.results)
    bad = gradcheck_bi.check(str(KERNELS / "cross_entropy_weighted.py:WeightedMeanOverRows"),
                             checks=["forward"], raise_on_failure=False)
    failed = [r for r in bad.results if r.status != "pass"]
    assert failed and all(dict(r.variant or {}).get("weight") for r in failed)
    assert all("inside" not in (r.message or "") for r in failed)


def test_an_option_the_kernel_lacks_is_fixed_at_its_closest_value():
    from gradcheck_bi.kernels.adapting.shaped_adapt import recognise
    from tests.kernels.gelu_and_mul import TanhOnlyFp32

    found = recognise(TanhOnlyFp32, "apply")
    assert found is not None and found.kernel.op == "gelu_and_mul"
    assert dict(found.fixed)["approximate"] == "tanh", found.note


def test_a_coarser_unit_only_where_the_errors_round_at_it():
    """fp32 inside an fp64 call explains errors of fp32's size and of either sign; errors far
    smaller than any fp32 rounding yet above fp64's (a formula a little off) are judged at
    fp64, and so are errors of fp32's size that scale the output (a wrong eps, a constant
    off: systematic, not rounding)."""
    from gradcheck_bi.checks.shaped import make_point, model, working_unit
    from gradcheck_bi.errors import unit
    from gradcheck_bi.tolerance.noise import K_SIGMA

    point = make_point(Config(check="forward", op="gelu_and_mul", shape=(16, 64)))
    m = model(point)
    sig = m.output_sigma
    u32 = unit(torch.float32)
    gen = torch.Generator().manual_seed(0)
    signs = {k: torch.randn(s.shape, generator=gen, dtype=torch.float64).sign()
             for k, s in sig.items()}
    rounded = {k: 0.4 * u32 * s * signs[k] for k, s in sig.items()}  # fp32 roundings' size
    assert working_unit(point, rounded, m)[0] == u32
    off = {k: 1e-3 * u32 * s + 1e-15 for k, s in sig.items()}  # above fp64, below fp32's
    u, note = working_unit(point, off, m)
    assert u == unit(torch.float64) and note is None
    scaled = {k: rounded[k] + 4 * u32 * m.outputs[k] for k in rounded}  # y · (1 + 4 u)
    assert all(bool((scaled[k].abs() <= K_SIGMA * u32 * sig[k]).all()) for k in sig)
    u, note = working_unit(point, scaled, m)
    assert u == unit(torch.float64) and note and note.startswith("not fp32 rounding"), note


@pytest.mark.parametrize("ref,check,axes", [
    ("fp32_inside.py:gemm", "forward", {}), ("fp32_inside.py:gemm", "dB", {}),
    ("fp32_inside.py:log_softmax", "forward", {}), ("fp32_inside.py:log_softmax", "dx", {}),
    ("fp32_inside.py:cross_entropy", "forward", {"reduction": "none"}),
    ("fp32_inside.py:cross_entropy", "dlogits", {"reduction": "none"}),
])
def test_a_correct_kernel_in_fp32_inside_is_judged_at_fp32(ref, check, axes):
    """Its rounding is unbiased: the bias test keeps fp32 for it, at 16 rows and more."""
    status, message = _result(ref, check, **axes)
    assert status == "pass" and "computes in fp32 inside" in message, message


def _layout_pair(ref: str, shape: tuple[int, ...]) -> list[tuple[object, object]]:
    """The default variant's dlogits at every layout the sweep gives it, measured with twins
    and each by its own finite differences (a measurer that keeps no twin), pairwise."""
    from gradcheck_bi.checks.twins import Twins
    from gradcheck_bi.measure import PointMeasurer

    spec = resolve(str(KERNELS / ref))
    sweep = Sweep(kernels=[spec.ref], targets=[("cpu", "fp64")], shapes=[shape],
                  checks=["dlogits"])
    first = SHAPED[spec.op].variants({k: [v] for k, v in spec.fixed})[0].values
    cfgs = [cfg for _, cfg in shaped_points(sweep, [spec]) if cfg.variant == first]
    twins, alone = PointMeasurer(), PointMeasurer()
    alone.twins = Twins(keep_bytes=-1)
    return [(twins(spec, c, sweep), alone(spec, c, sweep)) for c in cfgs]


def test_a_loss_layout_point_gets_its_twins_measurement():
    """Layout-blind (the logits strided, the cotangent strided): the twin's numbers and
    verdict, which are the point's own finite differences' — one call each instead."""
    pairs = _layout_pair("cross_entropy.py:CrossEntropy", (3, 40))
    laid = [(t, a) for t, a in pairs if t.layout != "contiguous"]
    assert {t.layout for t, _ in laid} >= {"logits-strided", "grad-strided"}
    for t, a in laid:
        assert t.details["twin"]["decided_by"].startswith("bitwise"), t.layout
        assert (t.status, t.max_abs_err, t.tolerance) == (a.status, a.max_abs_err,
                                                          a.tolerance), t.layout
        assert {k: v for k, v in t.details.items() if k != "twin"} == a.details


def test_a_loss_that_reads_strided_logits_wrong_runs_its_own_check_and_fails():
    pairs = _layout_pair("cross_entropy.py:ReadsStorageAsContiguous", (3, 40))
    strided = [(t, a) for t, a in pairs if t.layout == "logits-strided"]
    assert strided
    for t, a in strided:
        assert t.details["twin"]["decided_by"] == "own finite differences"
        assert "differs from the contiguous call's" in t.details["twin"]["why"]
        assert (t.status, t.max_abs_err) == (a.status, a.max_abs_err)
        assert t.status == "fail"


def test_points_of_one_draw_share_its_values_in_tensors_of_their_own():
    """The points of one variant (its layouts, its checks) reuse the last draw: the same
    values as a draw of their own, in tensors a kernel may write into unseen by the next."""
    from dataclasses import replace

    from gradcheck_bi.checks import shaped_point
    from gradcheck_bi.checks.shaped_point import make_point

    cfg = Config(check="dlogits", op="cross_entropy", shape=(4, 40))
    first = make_point(cfg)
    first.drawn.tensors["logits"].add_(1.0)  # a kernel that writes into its logits
    first.drawn.cotangents["loss"].add_(1.0)
    kept = make_point(replace(cfg, layout="grad-strided"))
    shaped_point._kept_draw.clear()
    fresh = make_point(cfg)
    for k in ("logits", "target"):
        assert torch.equal(kept.drawn.tensors[k], fresh.drawn.tensors[k]), k
        assert kept.drawn.tensors[k].data_ptr() != fresh.drawn.tensors[k].data_ptr(), k
    assert torch.equal(kept.drawn.cotangents["loss"], fresh.drawn.cotangents["loss"])
    other = make_point(replace(cfg, seed=1))
    assert not torch.equal(other.drawn.tensors["logits"], fresh.drawn.tensors["logits"])


@pytest.mark.parametrize("scale", [0.05, 1.0, 30.0])  # every element passes; some fail
def test_truncation_computed_only_where_the_judgement_needs_it(scale):
    """The level-4h truncation only raises a tolerance: computed for the colours whose
    ratio without it could still be the worst, the verdict, the worst element and its
    tolerance are those of every truncation computed."""
    from gradcheck_bi.checks.shaped import _judge, lazy_truncation

    gen = torch.Generator().manual_seed(3)
    colours, per = 40, 7
    err = scale * torch.rand(colours * per, generator=gen, dtype=torch.float64)
    sigma = torch.rand(colours * per, generator=gen, dtype=torch.float64)
    trunc = 0.3 * torch.rand(colours * per, generator=gen, dtype=torch.float64)
    computed = []

    def truncation(c):
        computed.append(c)
        return trunc[c * per:(c + 1) * per]

    tr = lazy_truncation(err, lambda part, t: sigma[part] + t, per, truncation)
    assert _judge(err, sigma + tr) == _judge(err, sigma + trunc)
    assert 0 < len(computed) < colours, computed


@pytest.mark.parametrize("shape", [(3, 5, 7), (11,)])
def test_a_direction_projected_from_its_factors_is_the_whole_tensors(shape):
    """``‖t ∘ σ‖`` and ``Σ |t| α`` of a rank-one direction ``t = a bᵀ`` from its factors
    (a matrix product over the rows) against the direction formed element by element."""
    from gradcheck_bi.checks.shaped_directions import _projected, rank_one

    gen = torch.Generator().manual_seed(5)
    sigma = torch.rand(shape, generator=gen, dtype=torch.float64) * 1e3
    alpha = torch.rand(shape, generator=gen, dtype=torch.float64)
    factors = [rank_one(torch.Size(shape), gen, torch.device("cpu")) for _ in range(4)]
    norms = _projected(sigma, factors, square=True).sqrt()
    sums = _projected(alpha, factors)
    for i, (a, b) in enumerate(factors):
        t = a * b
        assert t.shape == sigma.shape
        want = float(torch.linalg.vector_norm(t * sigma))
        assert math.isclose(float(norms[i]), want, rel_tol=1e-13), (i, float(norms[i]), want)
        want = float((t.abs() * alpha).sum())
        assert math.isclose(float(sums[i]), want, rel_tol=1e-13), (i, float(sums[i]), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(1100, 1000), (3, 5, 7), (11,)])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_direction_level_written_by_blocks_is_torchs_mixed_dtype_ops(shape, dtype,
                                                                        transposed):
    """A direction's level on CPU, ``x ± v a bᵀ`` rounded once to the dtype and the step
    ``x₊ − x₋`` in fp64, computed a block of rows at a time in fp64 (more than one block at
    (1100, 1000)): the bits of torch's mixed-dtype ``addcmul`` and ``sub_``, at any
    strides."""
    from gradcheck_bi.checks.shaped_directions import _widening_buffer, _write_level, rank_one

    gen = torch.Generator().manual_seed(9)
    x0 = (1e3 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    x0 = x0.transpose(0, -1) if transposed else x0
    a, b = rank_one(x0.shape, gen, torch.device("cpu"))
    spare = _widening_buffer(x0)
    assert (spare is None) == (dtype == torch.float64)
    x, want_x = torch.empty_like(x0), torch.empty_like(x0)
    taken = torch.full(x0.shape, float("nan"), dtype=torch.float64)
    want = taken.clone()
    for value in (0.37e-3, -0.37e-3):
        _write_level(x0, (a, b), value, x, taken, spare)
        torch.addcmul(x0, a, b, value=value, out=want_x)
        assert torch.equal(x, want_x), where_differs(x, want_x)
        if value > 0:
            want.copy_(want_x)
        else:
            want.sub_(want_x)
        assert torch.equal(taken, want), where_differs(taken, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 5, 300), (37, 7)])
def test_a_direction_level_fused_writes_and_projects_as_the_torch_ops(shape, dtype):
    """The fused level (Triton's interpreter here, compiled on CUDA) writes ``x ± v a bᵀ``
    as torch's ``addcmul`` does (rounded once to the dtype from fp64; an fp64 tensor's last
    bit may differ where one of them fuses the multiply-add) and projects the fp64 gradient
    on exactly the ``x₊ − x₋`` it wrote, as an fp64 step buffer and ``torch.dot`` do, to
    rounding."""
    pytest.importorskip("triton")
    from gradcheck_bi.checks.shaped_directions import rank_one
    from gradcheck_bi.fd import _triton_directions

    gen = torch.Generator().manual_seed(7)
    x0 = (3 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    x0.view(-1)[::11] = 0.0  # where the step is all of x₊ − x₋
    grad = torch.randn(shape, generator=gen, dtype=torch.float64)
    a, b = rank_one(torch.Size(shape), gen, torch.device("cpu"))
    v = 0.37 * 1e-3
    va = (v * a).reshape(-1)
    x = torch.full_like(x0, float("nan"))
    got = []
    for sign, d in ((1, None), (-1, grad)):
        projected = _triton_directions.level(x0, va, b, x, d)
        assert (projected is None) == (d is None)
        want = torch.addcmul(x0, a, b, value=sign * v, out=torch.empty_like(x0))
        if dtype == torch.float32:
            assert torch.equal(x, want), where_differs(x, want)
        else:
            ulp = torch.finfo(dtype).eps * want.abs()
            assert bool(((x - want).abs() <= ulp).all()), where_differs(x, want)
        got.append((x.clone(), projected))
    step = got[0][0].double() - got[1][0].double()
    want = torch.dot(grad.reshape(-1), step.reshape(-1))
    scale = float(torch.dot(grad.abs().reshape(-1), step.abs().reshape(-1)))
    projected = got[1][1]
    assert projected is not None
    assert abs(float(projected) - float(want)) <= 1e-14 * scale, \
        (float(projected), float(want), scale)
