"""Losses: ``token_logprobs`` and ``fused_linear_cross_entropy`` — recognised from their
forwards, correct kernels pass, each mutant fails where its defect shows and passes at the
blind control that hides it (an axis's blind value, or one row chunk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gradcheck_bi.checks.shaped import run_shaped_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.measure import run_point
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config

KERNELS = Path(__file__).resolve().parent / "kernels"
TLP = "token_logprobs.py"
FLCE = "fused_linear_cross_entropy.py"


def _status(ref: str, check: str, shape: tuple[int, ...] | None = None, dtype: str = "fp64",
            **axes: Any) -> tuple[str, dict[str, Any]]:
    """One point of the kernel's op: its default variant with ``axes`` changed (an option the
    kernel fixes kept at its value), ``dtype``, contiguous; the status and the details."""
    spec = resolve(str(KERNELS / ref))
    op = SHAPED[spec.op]
    values = {**dict(op.variants({k: [v] for k, v in spec.fixed})[0].values), **axes}
    cfg = Config(check=check, dtype=dtype, shape=shape or op.default_shape, op=op.name,
                 variant=Variant(tuple((a.name, values[a.name]) for a in op.axes)).values)
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    return r.status, r.details or {}


@pytest.mark.parametrize("ref,op", [
    (f"{TLP}:TokenLogprobs", "token_logprobs"),
    (f"{FLCE}:FusedLinearCrossEntropy", "fused_linear_cross_entropy"),
    (f"{FLCE}:ChunkedFusedLinearCrossEntropy", "fused_linear_cross_entropy"),
])
def test_recognised_from_its_forward(ref, op):
    spec = resolve(str(KERNELS / ref))
    assert spec.op == op and "recognised" in spec.recognised


def test_a_tensor_after_the_target_that_is_not_class_weights_is_left_alone():
    """transformers' ``fixed_cross_entropy(source, target, num_items_in_batch, …)``: the
    optional class weights bound by position are probed present, the loss divided by them
    differs, so ``num_items_in_batch`` stays at its default and the weights are absent —
    where it used to be given class weights and fail at ``weight=on``."""
    spec = resolve(str(KERNELS / "entry_points.py:fixed_cross_entropy"))
    assert spec.op == "cross_entropy" and ("weight", False) in spec.fixed
    assert "num_items_in_batch is not" in spec.recognised
    assert _status("entry_points.py:fixed_cross_entropy", "dlogits")[0] == "pass"
    assert _status("entry_points.py:fixed_cross_entropy", "forward")[0] == "pass"


def test_plain_fused_kernel_has_no_bias_axis():
    spec = resolve(str(KERNELS / f"{FLCE}:FusedLinearCrossEntropy"))
    assert ("bias", False) in spec.fixed


@pytest.mark.parametrize("check,axes", [
    ("forward", {}), ("dlogits", {}), ("batch_invariance", {}),
    ("dlogits", {"temperature": 1.0, "cotangent": "ones"}),
])
def test_token_logprobs_correct(check, axes):
    assert _status(f"{TLP}:TokenLogprobs", check, **axes)[0] == "pass"


@pytest.mark.parametrize("mutant,shows,blind", [
    ("IgnoresCotangent", {"cotangent": "random"}, {"cotangent": "ones"}),
    ("FirstTokenCotangent", {"cotangent": "random"}, {"cotangent": "ones"}),
    ("TemperatureForgotten", {"temperature": 0.7}, {"temperature": 1.0}),
])
def test_token_logprobs_mutant_and_its_blind_control(mutant, shows, blind):
    assert _status(f"{TLP}:{mutant}", "dlogits", **shows)[0] == "fail"
    assert _status(f"{TLP}:{mutant}", "dlogits", **blind)[0] == "pass"


@pytest.mark.parametrize("check,axes", [
    ("forward", {}), ("dweight", {}), ("dbias", {"reduction": "none"}),
    ("dhidden", {"reduction": "none"}), ("batch_invariance", {"reduction": "none"}),
])
def test_chunked_fused_correct(check, axes):
    assert _status(f"{FLCE}:ChunkedFusedLinearCrossEntropy", check, **axes)[0] == "pass"


@pytest.mark.parametrize("dtype,hidden", [("fp64", 19), ("fp32", 67)])
def test_chunked_fused_batch_invariant_where_a_row_moves_in_its_buffer(dtype, hidden):
    """One class (V = 1: the z-loss ``s·lse²`` shows the logit's bits), H = 19 in fp64 and 67
    in fp32: a ``gemv`` of the row where it sat in the batch's buffer gave row 7 of 8 other
    bits than the row alone, at some of these seeds in each dtype; each row's product is of
    a fresh copy now."""
    fn = resolve(str(KERNELS / f"{FLCE}:ChunkedFusedLinearCrossEntropy")).fn
    variant = {a.name: a.values[0] for a in SHAPED["fused_linear_cross_entropy"].axes}
    variant.update(reduction="none", cotangent="ones", ignore="none", lse_square_scale=1e-2,
                   class_weight=True)
    for seed in (0, 1, 2):
        m = run_shaped_check(fn, Config(check="batch_invariance", dtype=dtype, seed=seed,
                                        shape=(8, hidden, 1), op="fused_linear_cross_entropy",
                                        variant=tuple(variant.items())))
        assert m.passed, f"seed {seed}: {m.message}"


def test_dweight_is_sampled_with_directions():
    status, details = _status(f"{FLCE}:FusedLinearCrossEntropy", "dweight", reduction="sum")
    assert status == "pass"
    assert details["directions"] > 0
    assert 0 < details["checked_per_element"] < details["elements"]


@pytest.mark.parametrize("mutant,check,shows,blind", [
    ("AssumesGradOne", "dhidden", {"reduction": "none", "cotangent": "random"},
     {"reduction": "none", "cotangent": "ones"}),
    ("AssumesGradOne", "dweight", {"cotangent": "random"}, {"cotangent": "ones"}),
    ("MeanOverAllRows", "dweight", {"ignore": "some"}, {"ignore": "none"}),
    ("MeanOverAllRows", "dhidden", {"ignore": "some"}, {"ignore": "none"}),
])
def test_fused_mutant_and_its_blind_control(mutant, check, shows, blind):
    assert _status(f"{FLCE}:{mutant}", check, **shows)[0] == "fail"
    assert _status(f"{FLCE}:{mutant}", check, **blind)[0] == "pass"


def test_dweight_of_one_chunk_caught_with_several_chunks():
    ref = f"{FLCE}:DweightOneChunk"
    assert _status(ref, "dweight")[0] == "fail"  # the default shape's 10 rows: three chunks
    assert _status(ref, "dweight", shape=(1, 4, 16, 320))[0] == "pass"  # one chunk


@pytest.mark.parametrize("axes", [{"label_smoothing": 0.1}, {"softcap": 5.0},
                                  {"lse_square_scale": 1e-2}, {"class_weight": True}])
@pytest.mark.parametrize("check", ["forward", "dhidden", "dweight"])
def test_chunked_fused_takes_every_option(check, axes):
    assert _status(f"{FLCE}:ChunkedFusedLinearCrossEntropy", check, **axes)[0] == "pass"


def test_liger_signature_binds_with_no_glue():
    """Liger 0.8.5's ``forward(ctx, _input, weight, target, bias=None, ce_weight=None,
    ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0, reduction="mean",
    softcap=None, return_z_loss=False, accum_dtype=None, …)`` (its 4-tuple of outputs):
    every role and option bound by name, nothing fixed, the rest at its defaults."""
    spec = resolve(str(KERNELS / f"{FLCE}:ChunkedFusedLinearCrossEntropy"))
    binding = dict(spec.fn.binding)
    assert (binding["_input"], binding["ce_weight"], binding["weight"]) == (
        "hidden", "class_weight", "weight")
    for option in ("label_smoothing", "softcap", "lse_square_scale", "reduction"):
        assert binding[option] == option
    assert spec.fixed == ()
    assert binding["return_z_loss"] == binding["accum_dtype"] == "=default"


@pytest.mark.parametrize("mutant,shows,blind", [
    ("SoftcapChainForgotten", {"softcap": 5.0}, {"softcap": None}),
    ("ZLossGradForgotten", {"lse_square_scale": 1e-2}, {"lse_square_scale": 0.0}),
])
@pytest.mark.parametrize("check", ["dhidden", "dweight"])
def test_fused_option_mutant_caught_where_the_option_is_on(mutant, shows, blind, check):
    assert _status(f"{FLCE}:{mutant}", check, **shows)[0] == "fail"
    assert _status(f"{FLCE}:{mutant}", check, **blind)[0] == "pass"


def test_token_logprobs_without_ignore_index_is_checked_with_none_ignored(tmp_path):
    """A kernel that takes no ignore_index (TRL's ``selective_log_softmax(logits, index)``):
    recognition fixes the axis at its blind value, no token ignored."""
    path = tmp_path / "plain_logprobs.py"
    path.write_text(
        "import torch\n\n"
        "def selective_log_softmax(logits, index):\n"
        "    lp = torch.log_softmax(logits, -1)\n"
        "    return lp.gather(-1, index.unsqueeze(-1)).squeeze(-1)\n")
    spec = resolve(f"{path}:selective_log_softmax")
    assert spec.op == "token_logprobs"
    assert ("ignore", "none") in spec.fixed


@pytest.mark.parametrize("check", ["forward", "dlogits", "batch_invariance"])
def test_ignored_tokens_get_zero_and_no_gradient(check):
    assert _status(f"{TLP}:TokenLogprobs", check, ignore="some")[0] == "pass"


def test_token_logprobs_leak_into_ignored_tokens_caught():
    ref = f"{TLP}:IgnoredTokensLeak"
    assert _status(ref, "dlogits", ignore="some")[0] == "fail"
    assert _status(ref, "dlogits", ignore="none")[0] == "pass"


@pytest.mark.parametrize("check", ["dhidden", "dweight"])
def test_fused_logit_gradient_kept_in_bf16_caught_in_bf16_blind_in_fp32(check):
    """The logits' gradient stored in the input's dtype before the products (the class of
    Liger 0.8.5's bf16 fused CE, and of TransformerEngine's bf16 intermediate gradients):
    a bf16 point fails, the correct chunked kernel passes there, fp32 is its blind control."""
    mutant = f"{FLCE}:GradLogitsInInputDtype"
    assert _status(mutant, check, dtype="bf16")[0] == "fail"
    assert _status(f"{FLCE}:ChunkedFusedLinearCrossEntropy", check, dtype="bf16")[0] == "pass"
    assert _status(mutant, check, dtype="fp32")[0] == "pass"
