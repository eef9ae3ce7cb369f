"""Shaped like Megatron-Core's ``batch_invariant_kernels.py`` as far as loading goes.

Module-level ``import triton`` and a ``@triton.jit`` kernel decorated at import time; a
``BatchInvariantRMSNormFn`` that raises ``RuntimeError`` for CPU tensors and for dtypes
other than fp16/bf16/fp32. Loaded by path, no package around it.
"""

from typing import Any

import torch
import triton
import triton.language as tl
from packaging import version

_TORCH_2 = version.parse(torch.__version__.split("+")[0]) >= version.parse("2.0")


@triton.jit
def _row_sum_sq(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        acc += v * v
    tl.store(out_ptr + row, tl.sum(acc))


def _supported(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16, torch.float32)


class BatchInvariantRMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float,
                zero_centered_gamma: bool) -> torch.Tensor:
        if not x.is_cuda:
            raise RuntimeError("Batch-invariant RMSNorm requires CUDA tensors.")
        if not _supported(x.dtype):
            raise RuntimeError(f"Unsupported dtype for batch-invariant RMSNorm: {x.dtype}")
        x2 = x.reshape(-1, x.shape[-1]).float().contiguous()
        ms = torch.empty(x2.shape[0], device=x.device, dtype=torch.float32)
        _row_sum_sq[(x2.shape[0],)](x2, ms, x2.shape[1], BLOCK=1024)
        r = torch.rsqrt(ms / x2.shape[1] + eps).reshape(*x.shape[:-1], 1)
        w = weight.float() + (1 if zero_centered_gamma else 0)
        ctx.save_for_backward(x, weight, r)
        return (x.float() * r * w).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        raise NotImplementedError
