"""kernels/calling/watch.py: a slow first call at a shape (a compile, an autotune) is announced."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import pytest
import torch

from gradcheck_bi.cli.execute import progress_bar
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.kernels.calling import watch
from gradcheck_bi.kernels.calling.opcall import op_forward


class SlowFirstCall(torch.autograd.Function):
    """Sleeps on its first call at each shape, as a kernel that compiles per shape does."""

    shapes: ClassVar[set[tuple[int, ...]]] = set()

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                eps: float, zcg: bool) -> torch.Tensor:
        if tuple(x.shape) not in SlowFirstCall.shapes:
            SlowFirstCall.shapes.add(tuple(x.shape))
            time.sleep(0.2)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_a_slow_first_call_is_announced_once_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "SLOW_AFTER_S", 0.05)
    heard: list[tuple[int, ...]] = []
    watch.listen(lambda fn, shape: heard.append(shape))
    try:
        w, kernel = torch.randn(16), as_op_kernel(SlowFirstCall)
        for shape in ((3, 16), (3, 16), (5, 16)):
            op_forward(kernel, {"x": torch.randn(shape)}, {"weight": w}, {"eps": 1e-6}, False)
    finally:
        watch.listen(None)
    assert heard == [(3, 16), (5, 16)]


def test_the_progress_line_says_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    bar, _ = progress_bar(True)
    try:
        assert watch._listener is not None
        watch._listener(SlowFirstCall, (7, 16))
        [task] = bar.tasks
        assert task.description == "compiling / autotuning SlowFirstCall at 7×16"
    finally:
        watch.listen(None)
    assert progress_bar(False) == (None, None)
