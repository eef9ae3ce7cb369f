"""A correct batch-invariant GEMM in Triton with Megatron-Core's signature
``apply(A, B, bias, out_dtype, layout)`` (CUDA only).

One kernel, ``C = X @ W (+ bias)``: every program owns one fixed ``BM × BN`` tile of C and
walks the inner index in ``BK`` steps from 0 up, accumulating in fp32 (fp32 inputs at
``input_precision="ieee"``: no TF32), the bias added in fp32 and the result rounded once.
No split-K, no persistent scheduling, no tile size chosen from the shape: a row of C is
the same bits whatever the other rows are (batch-invariant).

Layouts as :mod:`gemm` (Transformer Engine's flags): ``layout[0] == "T"``: A is stored
``(O, K)``, else ``(K, O)``; ``layout[1] == "T"``: B is stored ``(K, N)``, else
``(…, K)`` with every leading dim a row. ``Y = op(B) @ op(A) + bias`` in ``(…, O)``. The
backward is written by hand with the same kernel: ``dA = opᵀ(bᵀ g)``, ``dB = g aᵀ`` (in
B's layout), ``dbias = 1ᵀ g`` (a fixed-order sum over the rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BM, BN, BK = 64, 64, 32
NUM_WARPS, NUM_STAGES = 4, 3


@triton.jit
def _mm_kernel(x_ptr, w_ptr, c_ptr, bias_ptr, M, N, K,
               sxm, sxk, swk, swn, scm, scn, sb,
               HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < K
        x = tl.load(x_ptr + offs_m[:, None] * sxm + k[None, :] * sxk,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + k[:, None] * swk + offs_n[None, :] * swn,
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n * sb, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(c_ptr + offs_m[:, None] * scm + offs_n[None, :] * scn,
             acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _require_cuda(*ts: torch.Tensor | None) -> None:
    for t in ts:
        if t is not None and not t.is_cuda:
            raise RuntimeError(f"GemmTritonFn requires CUDA tensors (a Triton kernel); got a "
                               f"tensor on {t.device}")


def triton_mm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x (M, K) @ w (K, N) + bias (N)`` at any strides, fp32 inside, rounded once."""
    _require_cuda(x, w, bias)
    if x.dtype != w.dtype:
        wide = torch.promote_types(x.dtype, w.dtype)
        x, w = x.to(wide), w.to(wide)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise RuntimeError(f"GemmTritonFn supports fp32, bf16 and fp16; got {x.dtype}")
    M, K = x.shape
    K2, N = w.shape
    assert K == K2, f"inner sizes differ: {K} and {K2}"
    c = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(c))
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _mm_kernel[grid](x, w, c, bias if bias is not None else c, M, N, K,
                     x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                     c.stride(0), c.stride(1), bias.stride(0) if bias is not None else 0,
                     HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                     num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return c


def _op_a(A: torch.Tensor, layout: str) -> torch.Tensor:
    """A as (K, O)."""
    return A.t() if layout[0].upper() == "T" else A


def _rows_of_b(B: torch.Tensor, layout: str) -> torch.Tensor:
    """B as (N, K)."""
    return B.t() if layout[1].upper() == "T" else B.reshape(-1, B.shape[-1])


class GemmTritonFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, B, bias, out_dtype, layout):
        assert isinstance(layout, str) and len(layout) == 2, f"unsupported layout {layout!r}"
        _require_cuda(A, B, bias)
        a, b = _op_a(A, layout), _rows_of_b(B, layout)
        y = triton_mm(b, a, bias, out_dtype or B.dtype)
        lead = (B.shape[1],) if layout[1].upper() == "T" else tuple(B.shape[:-1])
        ctx.layout, ctx.has_bias = layout, bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.save_for_backward(A, B)
        return y.reshape(*lead, y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        A, B = ctx.saved_tensors
        layout = ctx.layout
        g = grad.reshape(-1, grad.shape[-1])
        a, b = _op_a(A, layout), _rows_of_b(B, layout)
        g = g.to(b.dtype) if g.dtype != b.dtype else g
        d_a = triton_mm(b.t(), g, out_dtype=A.dtype)  # (K, O): a sum over the rows
        d_b = triton_mm(g, a.t(), out_dtype=B.dtype)  # (N, K): per row
        dA = d_a.t() if layout[0].upper() == "T" else d_a
        dB = d_b.t() if layout[1].upper() == "T" else d_b.reshape(B.shape)
        dbias = None
        if ctx.has_bias:
            ones = torch.ones(1, g.shape[0], dtype=g.dtype, device=g.device)
            dbias = triton_mm(ones, g, out_dtype=ctx.bias_dtype).reshape(-1)
        return dA.contiguous(), dB.contiguous(), dbias, None, None
