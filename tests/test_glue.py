"""Zero glue for losses' real entry points: torch's ``cross_entropy`` function, the
``CrossEntropyLoss`` module class (options and class weights to its constructor, tensors
to its forward) and Functions whose parameters are spelled in upper case."""

from __future__ import annotations

import torch

from gradcheck_bi.kernels import adapt
from gradcheck_bi.kernels.adapting.shaped_adapt import recognise
from gradcheck_bi.measure import run_point
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec


class UpperCE(torch.autograd.Function):
    """Cross-entropy over the last axis with its parameters spelled in upper case."""

    @staticmethod
    def forward(ctx, Logits, Target, Ignore_Index=-100, Reduction="mean"):
        lse = torch.logsumexp(Logits, -1)
        valid = Target != Ignore_Index
        safe = torch.where(valid, Target, 0)
        loss = torch.where(valid, lse - Logits.gather(-1, safe[:, None])[:, 0], 0.0)
        count = valid.sum().to(Logits.dtype)
        ctx.save_for_backward(Logits, safe, valid, count)
        ctx.reduction = Reduction
        if Reduction == "none":
            return loss
        return loss.sum() if Reduction == "sum" else loss.sum() / count

    @staticmethod
    def backward(ctx, g):
        logits, safe, valid, count = ctx.saved_tensors
        p = torch.softmax(logits, -1)
        p[torch.arange(len(safe)), safe] -= 1
        per_row = g * valid if ctx.reduction == "none" else (
            g * valid / (count if ctx.reduction == "mean" else 1))
        return p * per_row[:, None], None, None, None


def _status(spec: KernelSpec, check: str, **axes: object) -> str:
    op = SHAPED[spec.op]
    base = dict(op.variants({k: [v] for k, v in spec.fixed})[0].values)
    base.update(axes)
    variant = Variant(tuple((a.name, base[a.name]) for a in op.axes))
    cfg = Config(check=check, dtype="fp64", shape=(4, 64), op=op.name, variant=variant.values)
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    return r.status


def test_cross_entropy_loss_binds_its_constructor() -> None:
    found = recognise(torch.nn.CrossEntropyLoss, "module")
    assert found is not None and found.distance < 1e-12
    ctor = dict(found.kernel.ctor)
    assert ctor["reduction"] == "reduction" and ctor["weight"] == "weight"
    assert ctor["label_smoothing"] == "label_smoothing"
    assert ctor["ignore_index"] == "=ignore_index"
    assert dict(found.kernel.binding) == {"input": "logits", "target": "target"}
    assert "constructor weight←weight" in found.note
    # the options it takes are swept, not fixed at the value its default computes
    assert {k for k, _ in found.fixed} == {"softcap", "lse_square_scale"}


def test_cross_entropy_loss_passes_with_class_weights_and_per_row_losses() -> None:
    spec = adapt(torch.nn.CrossEntropyLoss, "CrossEntropyLoss", "api")
    assert spec.op == "cross_entropy"
    assert _status(spec, "dlogits", weight=True) == "pass"
    assert _status(spec, "batch_invariance", reduction="none") == "pass"


def test_cross_entropy_function_binds_with_no_glue() -> None:
    found = recognise(torch.nn.functional.cross_entropy, "function")
    assert found is not None and found.distance < 1e-12
    assert dict(found.kernel.binding)["input"] == "logits"


def test_upper_case_function_binds_by_name() -> None:
    found = recognise(UpperCE, "apply")
    assert found is not None and found.distance < 1e-12, found and found.note
    binding = dict(found.kernel.binding)
    assert binding["Logits"] == "logits" and binding["Target"] == "target"
    assert binding["Reduction"] == "reduction" and binding["Ignore_Index"] == "=ignore_index"
    spec = adapt(UpperCE, "UpperCE", "api")
    assert spec.op == "cross_entropy" and "reduction" not in dict(spec.fixed)
    assert _status(spec, "dlogits") == "pass"
    assert _status(spec, "dlogits", reduction="none") == "pass"


L2_FILE = '''
import torch


def l2norm(x, eps=1e-6, output_dtype=None):
    y = x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)
    return y if output_dtype is None else y.to(output_dtype)


def forward_only(x, weight, eps=1e-6):
    with torch.no_grad():
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
'''


def test_refusals_are_one_line_exit_2(tmp_path, capsys) -> None:
    from gradcheck_bi import cli

    path = tmp_path / "l2.py"
    path.write_text(L2_FILE)
    code = cli.main(["run", "--kernel", f"{path}:l2norm", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "l2norm(x, eps, output_dtype)" in lines[0]
    assert "matches no op here (nearest: layer_norm" in lines[0]
    assert "--op NAME" in lines[0] and "--generic" in lines[0]
    code = cli.main(["run", "--kernel", f"{path}:forward_only", "--no-progress"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "does not require grad" in lines[0]
    assert "forward_only(x, weight, eps)" in lines[0]
