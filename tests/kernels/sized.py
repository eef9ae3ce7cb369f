"""Stand-ins for entry points that take sizes, written with torch alone on their shipped
signatures (names, order, defaults): transformers' GPT-2 ``Conv1D(nf, nx)`` (a linear layer
whose weight is stored ``(nx, nf)``) and ``ForMaskedLMLoss(logits, labels, vocab_size, …)``
(``transformers.loss.loss_utils``), a per-head layer norm whose constructor needs
``num_heads`` (no op of the tool computes it), and two layer norms whose constructors hide
their hidden size (Chameleon's, DINOv3-ConvNeXt's).

======================  =================================================================
stand-in                what it computes
======================  =================================================================
``Conv1D``              ``y = x @ W + b``, W ``(nx, nf)``, b ``(nf,)``; its bias always
                        added (``torch.addmm``): it cannot run without one
``Conv1DNoBiasGrad``    MUTANT: ``Conv1D`` whose backward gives the bias no gradient
``ForMaskedLMLoss``     the mean cross-entropy over the labels not equal to ignore_index, in
                        fp32 whatever the logits' dtype; a sum over ``num_items_in_batch``
                        when given
``PerHeadLayerNorm``    a layer norm over each head's ``head_dim`` columns of
                        ``(…, num_heads · head_dim)``, a weight per column
``ShapeLayerNorm``      Chameleon's layer norm, its hidden size a shape (``hidden_size[-1]``)
``DelegatingLayerNorm`` DINOv3-ConvNeXt's, every constructor argument through ``*args``
                        to ``nn.LayerNorm``; ``…DropsEps``: MUTANT, eps ignored
``Fp32LayerNorm``       EsmFold2's layer norm: fp32 inside, its parameters fp32 only
``Fp32OnlyLayerNorm``   the same, its forward refusing other parameters in its own words
======================  =================================================================
"""

from __future__ import annotations

from typing import Any

import torch


class Conv1D(torch.nn.Module):
    """GPT-2's ``Conv1D(nf, nx)``: a linear layer with its weight transposed."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.empty(nx, nf))
        self.bias = torch.nn.Parameter(torch.zeros(nf))
        torch.nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size_out = (*x.size()[:-1], self.nf)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class _NoBiasGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor  # type: ignore[override]
                ) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return torch.addmm(b, x, w)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        return g @ w.t(), x.t() @ g, torch.zeros(w.shape[1], dtype=g.dtype)  # MUTANT: no db


class Conv1DNoBiasGrad(Conv1D):
    """MUTANT: ``Conv1D`` whose bias gets a zero gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _NoBiasGrad.apply(x.reshape(-1, x.size(-1)), self.weight, self.bias)
        return y.view(*x.shape[:-1], self.nf)


def ForMaskedLMLoss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                    num_items_in_batch: torch.Tensor | None = None, ignore_index: int = -100,
                    **kwargs: Any) -> torch.Tensor:
    """transformers' masked-LM loss: the logits flattened to ``(-1, vocab_size)`` in fp32."""
    logits = logits.float().view(-1, vocab_size)
    labels = labels.view(-1).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=ignore_index,
                                             reduction=reduction)
    return loss / num_items_in_batch if num_items_in_batch is not None else loss


class PerHeadLayerNorm(torch.nn.Module):
    """A layer norm over each head's columns (StableLM's per-head norm, flattened)."""

    def __init__(self, hidden_size: int, num_heads: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_heads, self.eps = num_heads, eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h = hidden_states.unflatten(-1, (self.num_heads, -1))
        y = torch.nn.functional.layer_norm(h, h.shape[-1:], eps=self.eps)
        return y.flatten(-2) * self.weight


class ShapeLayerNorm(torch.nn.LayerNorm):
    """Chameleon's ``ChameleonLayerNorm(hidden_size, *args, **kwargs)``: ``hidden_size`` is a
    shape (it reads ``hidden_size[-1]``); statistics over the last axis at a fixed eps."""

    def __init__(self, hidden_size: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(hidden_size, *args, **kwargs)
        self.normalized_shape = (hidden_size[-1],)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.layer_norm(hidden_states, self.normalized_shape, None, None,
                                           eps=1e-5)
        return y * self.weight + self.bias


class DelegatingLayerNorm(torch.nn.LayerNorm):
    """DINOv3-ConvNeXt's ``LayerNorm(*args, data_format="channels_last", **kwargs)``: every
    size and eps handed to ``nn.LayerNorm``."""

    def __init__(self, *args: Any, data_format: str = "channels_last", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.data_format = data_format

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.data_format == "channels_first":
            return super().forward(features.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return super().forward(features)


class DelegatingLayerNormDropsEps(DelegatingLayerNorm):
    """MUTANT: normalises at eps 1e-2 whatever eps it was given."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(features, self.normalized_shape, self.weight,
                                              self.bias, 1e-2)


class Fp32LayerNorm(torch.nn.LayerNorm):
    """EsmFold2's ``LayerNorm``: x cast to fp32 and normalised with its own parameters, kept in
    fp32 in the model (``F.layer_norm`` refuses fp64 ones with an fp32 x: "mixed dtype")."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(hidden_states.float(), self.normalized_shape,
                                              self.weight, self.bias, self.eps
                                              ).to(hidden_states.dtype)


class Fp32OnlyLayerNorm(Fp32LayerNorm):
    """``Fp32LayerNorm`` checking its parameters itself, in words naming no dtype."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != torch.float32:
            raise TypeError("weights must be single precision")
        return super().forward(hidden_states)
