"""A Triton RMSNorm whose forward stores out of bounds at one width: the CUDA context dies.

``OobAt1025``: one program per row; the row's output is stored with a mask that is right
everywhere but at D = 1025 (``cases/ci.toml``'s width past a 1024-wide block), where the
tail block's store lands a gigabyte past the output — an illegal address, which leaves the
process's CUDA context refusing every later call. ``Healthy`` stores correctly everywhere.
The backward is plain torch (correct), so only the fault is under test. CUDA only.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 1024
FAULT_WIDTH = 1025


@triton.jit
def _rms_forward(x_ptr, w_ptr, y_ptr, r_ptr, d, eps, stray, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, d, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + row * d + cols, mask=cols < d, other=0.0).to(tl.float32)
        acc += x * x
    r = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / d + eps)
    tl.store(r_ptr + row, r)
    for start in range(0, d, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        inside = cols < d
        x = tl.load(x_ptr + row * d + cols, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        # The defect: a tail block's store offset by `stray` elements (0 but at the bad width).
        shift = tl.where(start > 0, stray, 0)
        tl.store(y_ptr + row * d + cols + shift, x * r * w, mask=inside)


def _tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the last dim by pairwise halving: the order depends on D only (batch-invariant)."""
    d = t.shape[-1]
    width = 1 << max(0, (d - 1).bit_length())
    t = torch.nn.functional.pad(t, (0, width - d))
    while t.shape[-1] > 1:
        t = t[..., : t.shape[-1] // 2] + t[..., t.shape[-1] // 2 :]
    return t


def _make(name: str, faulty: bool) -> type:
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float,
                    zero_centered_gamma: bool) -> torch.Tensor:
            if x.device.type != "cuda" or x.dtype not in (torch.float32, torch.bfloat16,
                                                           torch.float16):
                raise NotImplementedError("OobAt1025 runs on CUDA in fp32/bf16/fp16 only")
            d = x.shape[-1]
            xc = x.contiguous().view(-1, d)
            w = weight.float() + (1 if zero_centered_gamma else 0)
            y = torch.empty_like(xc)
            r = torch.empty(xc.shape[0], device=x.device, dtype=torch.float32)
            stray = (1 << 28) if faulty and d == FAULT_WIDTH else 0
            _rms_forward[(xc.shape[0],)](xc, w, y, r, d, eps, stray, BLOCK_D=BLOCK)
            ctx.save_for_backward(xc, w, r)
            ctx.shape, ctx.wdtype = x.shape, weight.dtype
            return y.view(x.shape)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
            xc, w, r = ctx.saved_tensors
            d = xc.shape[-1]
            x32, g32, r_ = xc.float(), g.reshape(-1, d).float(), r[:, None]
            s = _tree_sum(g32 * x32 * w)
            dx = g32 * w * r_ - x32 * r_ ** 3 * s / d
            dw = (g32 * x32 * r_).sum(0)
            return dx.to(xc.dtype).view(ctx.shape), dw.to(ctx.wdtype), None, None

    Fn.__name__ = Fn.__qualname__ = name
    return Fn


OobAt1025 = _make("OobAt1025", faulty=True)
Healthy = _make("Healthy", faulty=False)
