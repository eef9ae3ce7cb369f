"""``gemm``: ``Y = op(B) @ op(A) + bias`` with Transformer Engine's layout flags.

The signature is Megatron-Core's batch-invariant GEMM, ``apply(A, B, bias, out_dtype,
layout)``: ``layout[0] == "T"`` means A is stored transposed (``(O, K)``, a linear layer's
weight), ``layout[1] == "T"`` that B is (``(K, N)``); otherwise A is ``(K, O)`` and B is
``(…, K)`` with every leading dim flattened into rows. The output is ``(…, O)``::

    Y[n, o] = Σ_k B[n, k] A[o, k] + bias[o]      (canonical: A as (o, k), B as (n, k))
    dA[o, k] = Σ_n g[n, o] B[n, k]    dB[n, k] = Σ_o g[n, o] A[o, k]    dbias[o] = Σ_n g[n, o]

An element of A reaches one column of Y, an element of B one row: the finite differences
perturb a column ``k`` of A (or of B) at once, ``K`` colours each; the bias, one. Batch
invariance is over B's rows. ``--shape`` is ``(…leading, K, O)``; the default
``(2, 8, 64, 48)`` is B ``(2, 8, 64)`` and A ``(48, 64)`` under the default layout TN.

The blind controls: a 2-D B (``b_rank=2``) hides a defect in the leading dims, a contiguous
cotangent one in its strides, and each layout hides a defect in the others' branches.

>>> import torch
>>> A, B = torch.randn(3, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
>>> y = OP.reference({"A": A, "B": B, "bias": None}, {"layout": "TN"})["Y"]
>>> torch.allclose(y, B @ A.T)
True
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.ops.shaped import (
    Axis,
    Drawn,
    Output,
    Role,
    ShapedOp,
    Sizes,
    Variant,
    cotangent,
    cotangent_axis,
    rows_view,
)

LAYOUTS = ("TN", "NN", "NT")


def _split(n: int) -> tuple[int, ...]:
    """Two leading dims for ``n`` rows (a 3-D B): ``(2, n / 2)``, or ``(1, n)``."""
    return (2, n // 2) if n % 2 == 0 and n >= 2 else (1, n)


def sizes(shape: tuple[int, ...]) -> Sizes:
    if len(shape) < 3:
        raise ValueError(f"gemm takes --shape as (…leading, K, O), e.g. 64,4096,4096; got "
                         f"{','.join(map(str, shape))}")
    return {"n": math.prod(shape[:-2]), "k": shape[-2], "o": shape[-1],
            "lead": len(shape) - 2, **{f"lead{i}": s for i, s in enumerate(shape[:-2])}}


def _lead(s: Sizes, rank: int) -> tuple[int, ...]:
    if rank == 2:
        return (s["n"],)
    given = tuple(s[f"lead{i}"] for i in range(s["lead"]))
    return given if len(given) >= 2 else _split(s["n"])


def canonical(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor | None]:
    layout = options["layout"].upper()
    A, B = t["A"], t["B"]
    assert A is not None and B is not None
    a = A.t() if layout[0] == "N" else A
    b = B.t() if layout[1] == "T" else B.view(-1, B.shape[-1])
    return {"A": a, "B": b, "bias": t.get("bias")}


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    A, B, bias = t["A"], t["B"], t.get("bias")
    assert A is not None and B is not None
    y = B @ A.t()
    return {"Y": y + bias if bias is not None else y}


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    layout = variant["layout"]
    rank = 2 if layout[1] == "T" else int(variant["b_rank"])

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    A = randn(s["o"], s["k"]) if layout[0] == "T" else randn(s["k"], s["o"])
    B = randn(s["k"], s["n"]) if layout[1] == "T" else randn(*_lead(s, rank), s["k"])
    bias = randn(s["o"]) if variant["bias"] else None
    g = cotangent(variant, s["n"], s["o"], gen)
    return Drawn({"A": A, "B": B, "bias": bias}, {"layout": layout, "out_dtype": None},
                 {"Y": g.to(dtype).to(device)}, s)


def restore(name: str, part: torch.Tensor, like: torch.Tensor, options: dict[str, Any]
            ) -> torch.Tensor:
    """Rows of canonical B as the kernel takes B: transposed under ``?T``, 3-D as ``like``."""
    if name == "B" and options["layout"][1] == "T":
        return part.t().contiguous()
    if name == "B" and like.dim() == 3:
        return part.reshape(1, *part.shape).contiguous()
    return part.contiguous()


OP = ShapedOp(
    "gemm", "Y = op(B) @ op(A) + bias (Transformer Engine's layout flags)",
    roles=(Role("A", ("o", "k"), names=("a", "weight", "w", "mat2")),
           Role("B", ("n", "k"), names=("b", "input", "x", "inp", "mat1")),
           Role("bias", ("o",), optional=True, names=("bias",))),
    outputs=(Output("Y", ("n", "o")),),
    axes=(Axis("layout", LAYOUTS, passed=True, names=("layout",),
               words="TE's layout flags: T = stored transposed (A, B)"),
          Axis("bias", (True, False), words="a bias given (on) or None"),
          Axis("b_rank", (3, 2), blind=2, words="B's rank: 3 (leading dims flattened) or 2"),
          cotangent_axis("the cotangent of Y: random, or all ones")),
    reference=reference, canonical=canonical, draw=draw, sizes=sizes,
    default_shape=(2, 8, 64, 48), shape_words="(…leading, K, O)",
    batch_axis=lambda options: "n", column="layout",
    fills={"out_dtype": None}, marks=("gemm", "matmul", "linear"), output_view=rows_view,
    restore=restore, size_names={"k": ("in_features",), "o": ("out_features",)},
)
