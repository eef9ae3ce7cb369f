"""The fp64 references of the norm family, written with torch's own ops (not the kernels').

Each takes fp64 tensors by name — ``inputs`` shaped like x, ``params`` *effective*
(γ, not the stored γ − 1) — and ``options`` (``eps``; ``group_size``, ``norm_before_gate``
for the gated norm), and returns the outputs by name. Over the last axis of size D:

* ``rms_norm``: ``y = x · (mean x² + eps)^(-1/2) · γ``;
* ``fused_add_rms_norm``: ``s = x + residual``, ``y = rms_norm(s)``, ``residual_out = s``;
* ``layer_norm``: ``μ = mean x``, ``y = (x − μ) · (mean (x − μ)² + eps)^(-1/2) · γ + β``;
* ``rms_norm_gated``: the mean square over each group of ``group_size`` consecutive
  features (``None`` = D); with ``norm_before_gate`` ``y = rms(x) · γ · silu(z)``, else
  ``y = rms(x · silu(z)) · γ``; ``silu(z) = z · sigmoid(z)``.

>>> import torch
>>> x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
>>> rms_norm({"x": x}, {"weight": torch.ones(2, dtype=torch.float64)}, {"eps": 0.0})["y"]
tensor([[0.8485, 1.1314]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

Tensors = dict[str, torch.Tensor]


def _rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)


def rms_norm(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    return {"y": _rms(inputs["x"], options["eps"]) * params["weight"]}


def fused_add_rms_norm(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    s = inputs["x"] + inputs["residual"]
    return {"y": _rms(s, options["eps"]) * params["weight"], "residual_out": s}


def layer_norm(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    x = inputs["x"]
    c = x - x.mean(dim=-1, keepdim=True)
    return {"y": _rms(c, options["eps"]) * params["weight"] + params["bias"]}


def grouped(v: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``v`` with its last axis cut into groups: ``(..., D / G, G)``."""
    d = v.shape[-1]
    g = d if group_size is None else int(group_size)
    if g <= 0 or d % g:
        raise ValueError(f"group_size {group_size} does not divide the last dim {d}")
    return v.reshape(*v.shape[:-1], d // g, g)


def rms_norm_gated(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    x, z = inputs["x"], inputs["z"]
    gate = torch.nn.functional.silu(z)
    g = options.get("group_size")
    if options.get("norm_before_gate", True):
        y = _rms(grouped(x, g), options["eps"]).reshape(x.shape) * params["weight"] * gate
    else:
        y = _rms(grouped(x * gate, g), options["eps"]).reshape(x.shape) * params["weight"]
    return {"y": y}
