"""Correct kernels that compute in fp32 whatever dtype they are called in (Megatron's
``x.float()``): each casts its floating inputs to fp32, calls a correct kernel of this
folder there (its own hand-written backward) and casts the outputs back. Called in fp64,
their forward errs as fp32 rounds: the working-precision search must take fp32 for them
(gradcheck_bi.checks.shaped_precision), however biased it is told to reject."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cross_entropy import CrossEntropy
from gemm import GemmFn
from layer_norm import LayerNorm
from log_softmax import LogSoftmax


def _f(t: Any) -> Any:
    return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def gemm(A, B, bias, out_dtype, layout):
    y = GemmFn.apply(_f(A), _f(B), _f(bias), None, layout)
    return y.to(out_dtype if out_dtype is not None else B.dtype)


def log_softmax(x):
    return LogSoftmax.apply(_f(x)).to(x.dtype)


def layer_norm(x, weight, bias, eps):
    return LayerNorm.apply(_f(x), _f(weight), _f(bias), eps).to(x.dtype)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return CrossEntropy.apply(_f(logits), target, ignore_index, reduction,
                              label_smoothing).to(logits.dtype)
