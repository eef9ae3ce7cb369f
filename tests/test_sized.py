"""Entry points whose sizes come from the run's shape, and compiled builtins read from their
docstrings: ``nn.Linear`` (its constructor needs ``out_features``), GPT-2's ``Conv1D(nf, nx)``
(no name says which size is which), ``F.linear`` (a builtin ``inspect`` cannot read) and
transformers' ``ForMaskedLMLoss(logits, labels, vocab_size, …)`` — each checked with no flag
(stand-ins in tests/kernels/sized.py where the library is not installed here)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import cli
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.calling.textsig import signature
from gradcheck_bi.measure import run_point
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant, sizes_of
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelLoadError

SIZED = "tests/kernels/sized.py"


def _status(ref: str, check: str, shape: tuple[int, ...] | None = None, **axes: Any
            ) -> str:
    """One fp64 point of the kernel's op: its default variant (the options it fixes at
    their values) with ``axes`` changed."""
    spec = resolve(ref)
    op = SHAPED[spec.op]
    values = {**dict(op.variants({k: [v] for k, v in spec.fixed})[0].values), **axes}
    cfg = Config(check=check, dtype="fp64", shape=shape or op.default_shape, op=op.name,
                 variant=Variant(tuple((a.name, values[a.name]) for a in op.axes)).values)
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    return r.status


def test_a_builtins_signature_is_read_from_its_docstring() -> None:
    with pytest.raises((TypeError, ValueError)):
        inspect.signature(torch.nn.functional.linear)
    sig = signature(torch.nn.functional.linear)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ("input", inspect.Parameter.empty), ("weight", inspect.Parameter.empty),
        ("bias", None)]


@pytest.mark.parametrize("builtin", [
    torch.bartlett_window,  # "(window_length, periodic=True, *, …, layout=torch.strided, …)"
    torch.batch_norm,  # no docstring
])
def test_a_builtin_whose_line_cannot_be_read_stays_unreadable(builtin: Any) -> None:
    """A default that is no literal would be called as something else: not read."""
    with pytest.raises((TypeError, ValueError)):
        signature(builtin)


def test_sizes_are_read_from_a_calls_tensors() -> None:
    op = SHAPED["gemm"]
    drawn = op.draw(op.sizes((2, 3, 5, 7)), op.variants()[0], torch.float64, "cpu",
                    torch.Generator().manual_seed(0))
    assert sizes_of(op, drawn.tensors, drawn.options) == {"o": 7, "k": 5, "n": 6}


@pytest.mark.parametrize("ref,layout,words", [
    ("torch.nn:Linear", "TN", "constructor in_features←size k, out_features←size o; "
     "forward input←B; parameters weight←A, bias←bias; in_features, out_features from the "
     "run's shape (…leading, K, O)"),
    (f"{SIZED}:Conv1D", "NN", "constructor nf←size o, nx←size k; forward x←B; parameters "
     "weight←A, bias←bias; nf, nx from the run's shape (…leading, K, O)"),
    ("torch.nn.functional:linear", "TN", "input←B, weight←A, bias←bias"),
])
def test_a_linear_layer_is_recognised_with_its_sizes_from_the_shape(ref: str, layout: str,
                                                                    words: str) -> None:
    spec = resolve(ref)
    assert spec.op == "gemm" and ("layout", layout) in spec.fixed
    assert f"recognised gemm from its forward ({words}; layout fixed at {layout}" \
        in spec.recognised


@pytest.mark.parametrize("ref", ["torch.nn:Linear", f"{SIZED}:Conv1D",
                                 "torch.nn.functional:linear"])
@pytest.mark.parametrize("check", ["forward", "dA", "dB", "dbias"])
def test_a_linear_layers_forward_and_gradients_pass(ref: str, check: str) -> None:
    assert _status(ref, check) == "pass"
    assert _status(ref, check, shape=(3, 5, 7)) == "pass"  # built at K = 5, O = 7


def test_nn_linear_runs_without_its_bias_and_conv1d_only_with_it() -> None:
    """``nn.Linear``'s forward takes a bias of None; GPT-2's Conv1D always adds its own
    (``torch.addmm``), so it is run with one alone and the note says why."""
    linear, conv = resolve("torch.nn:Linear"), resolve(f"{SIZED}:Conv1D")
    assert "bias" not in dict(linear.fixed)
    assert _status("torch.nn:Linear", "dA", bias=False) == "pass"
    assert ("bias", True) in conv.fixed
    assert ("bias fixed at True: the module always holds its bias (given none, its forward "
            "raises): run with it alone") in conv.fixed_how


def test_a_held_parameters_wrong_gradient_fails() -> None:
    """The module's own bias is the one checked: a backward that gives it no gradient."""
    ref = f"{SIZED}:Conv1DNoBiasGrad"
    assert _status(ref, "dbias") == "fail"
    assert _status(ref, "dA") == "pass"


def test_a_loss_takes_its_vocabulary_size_from_the_logits() -> None:
    ref = f"{SIZED}:ForMaskedLMLoss"
    spec = resolve(ref)
    assert spec.op == "cross_entropy"
    assert "labels←target, vocab_size←size v" in spec.recognised
    assert _status(ref, "forward") == _status(ref, "dlogits") == "pass"
    assert _status(ref, "dlogits", shape=(3, 40)) == "pass"


def test_a_norm_per_head_is_refused_saying_no_kernel_arg_makes_it_an_op() -> None:
    with pytest.raises(KernelLoadError) as info:
        resolve(f"{SIZED}:PerHeadLayerNorm")
    assert str(info.value) == (
        "kernel PerHeadLayerNorm(hidden_size, num_heads, eps) needs 'num_heads' (heads): a norm "
        "whose statistics run over each head's slice, not the whole last axis, is no op here "
        "(`gradcheck-bi ops`), so no --kernel-arg makes it one")


def _norm_status(ref: str, check: str, tmp_path: Path) -> set[str]:
    """The statuses of every result of ``check`` in the kernel's run with no flag but the
    check and a small shape (fp64 on CPU)."""
    out = tmp_path / "r.json"
    cli.main(["run", "--kernel", ref, "--check", check, "--shape", "2,3,32", "--device", "cpu",
              "--format", "json", "--output", str(out), "--no-progress"])
    return {r["status"] for r in json.loads(out.read_text())["results"]}


def test_a_hidden_size_the_constructor_reads_as_a_shape_is_given_as_one(tmp_path: Path
                                                                        ) -> None:
    """Chameleon's ``hidden_size[-1]``: built with the int, it raises; built with (D,), it
    is a layer norm at its own eps (1e-5)."""
    spec = resolve(f"{SIZED}:ShapeLayerNorm")
    assert spec.op == "layer_norm" and ("eps", 1e-5) in spec.fixed
    assert _norm_status(f"{SIZED}:ShapeLayerNorm", "forward", tmp_path) == {"pass"}
    assert _norm_status(f"{SIZED}:ShapeLayerNorm", "dbias", tmp_path) == {"pass"}


def test_a_constructor_handing_everything_to_its_base_takes_the_bases_parameters(
        tmp_path: Path) -> None:
    """``__init__(self, *args, data_format=…, **kwargs)`` → ``nn.LayerNorm(normalized_shape,
    eps, …)``: the hidden size and eps are its base's, and each point's eps reaches it (a
    forward that ignores it fails)."""
    spec = resolve(f"{SIZED}:DelegatingLayerNorm")
    assert spec.op == "layer_norm" and "eps" not in dict(spec.fixed)
    assert _norm_status(f"{SIZED}:DelegatingLayerNorm", "dx", tmp_path) == {"pass"}
    assert "fail" in _norm_status(f"{SIZED}:DelegatingLayerNormDropsEps", "forward", tmp_path)


@pytest.mark.parametrize(("attr", "raised"), [
    ("Fp32LayerNorm", "RuntimeError: mixed dtype"),
    ("Fp32OnlyLayerNorm", "TypeError: weights must be single precision"),
])
def test_a_module_whose_parameters_are_fp32_only_gets_them_in_fp32(
        tmp_path: Path, attr: str, raised: str) -> None:
    """Given fp64 parameters, its forward raises, whatever its words, and runs given fp32
    ones: they are cast to fp32 in each call (dw flows back through the cast), the note says
    why, and it is judged at the fp32 it computes in."""
    ref = f"{SIZED}:{attr}"
    spec = resolve(ref)
    assert spec.op == "layer_norm"
    assert any(line.startswith("its parameters given in float32 at every point: its forward "
                               f"raises with them in float64 ({raised}")
               for line in spec.fixed_how), spec.fixed_how
    for check in ("forward", "dx", "dw", "dbias"):
        assert _norm_status(ref, check, tmp_path) == {"pass"}, check
