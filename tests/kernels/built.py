"""Modules shaped like the norms of real model code that the tool must build itself, each
correct and computing in its input's dtype (so fp64 runs are judged at fp64):

``L2Norm(eps)`` and ``PlainL2Norm()`` — weightless RMSNorms (Llama4TextL2Norm,
DeepseekV4UnweightedRMSNorm); ``BufferL2Norm(hidden_size, eps)`` keeps a ones *buffer*
named weight (FalconMambaWeightlessRMSNorm); ``FixedEpsRMSNorm(hidden_size)`` fixes its eps
in an attribute, ``FixedEpsLayerNorm(hidden_size)`` in its forward (OlmoLayerNorm);
``GroupGated(hidden_size, group_size, eps)`` requires its group size (BambaRMSNormGated),
``CountGated(hidden_size, eps, n_groups, norm_before_gate)`` takes a number of groups
(FalconH1RMSNormGated); ``ConfigRMSNorm(config: TinyConfig)`` takes a config object
(CpmAntLayerNorm). Refused: ``AdaNorm`` (a norm with a projection, EsmFold2AdaptiveLayerNorm),
``MyBatchNorm2d`` and ``ChannelGroups`` (channels-first; the latter a torch GroupNorm
under another name, as timm's are).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class L2Norm(nn.Module):
    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.eps)


class PlainL2Norm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class BufferL2Norm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Buffer(torch.ones(hidden_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.eps)


class FixedEpsRMSNorm(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = 1e-5

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _rms(hidden_states, self.variance_epsilon) * self.weight


class FixedEpsLayerNorm(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.normalized_shape = (hidden_size,)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden_states, self.normalized_shape, None, None, eps=1e-5)


def _grouped_rms(x: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    *lead, d = x.shape
    return _rms(x.reshape(*lead, d // group, group), eps).reshape(x.shape)


class GroupGated(nn.Module):
    def __init__(self, hidden_size: int, group_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.group_size, self.eps = group_size, eps

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None
                ) -> torch.Tensor:
        if gate is not None:
            hidden_states = hidden_states * F.silu(gate)
        return self.weight * _grouped_rms(hidden_states, self.group_size, self.eps)


class CountGated(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, n_groups: int = 1,
                 norm_before_gate: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps, self.n_groups, self.norm_before_gate = eps, n_groups, norm_before_gate

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None
                ) -> torch.Tensor:
        if gate is not None and not self.norm_before_gate:
            hidden_states = hidden_states * F.silu(gate)
        y = self.weight * _grouped_rms(hidden_states, hidden_states.shape[-1] // self.n_groups,
                                       self.eps)
        if gate is not None and self.norm_before_gate:
            y = y * F.silu(gate)
        return y


class TinyConfig:
    """A model's config, as transformers writes them: keyword fields with defaults."""

    def __init__(self, *, vocab_size: int = 100, hidden_size: int = 4096,
                 rms_norm_eps: float = 1e-5) -> None:
        self.vocab_size, self.hidden_size, self.rms_norm_eps = vocab_size, hidden_size, \
            rms_norm_eps


class ConfigRMSNorm(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(config.hidden_size))
        self.eps = config.rms_norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.eps) * self.weight


class AdaNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.shift = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden_states, hidden_states.shape[-1:], eps=self.eps) \
            + self.shift(cond)


class MyBatchNorm2d(nn.Module):
    def __init__(self, n: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean((0, 2, 3), keepdim=True)
        var = x.var((0, 2, 3), keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight[:, None, None]


class ChannelGroups(nn.GroupNorm):
    """A torch GroupNorm under a name that says nothing of it."""


class RsqrtOnly(nn.Module):
    """Returns the row's rsqrt factor alone (HYV4UnweightedRMSNorm): not a norm's output."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class CondRMSNorm(nn.Module):
    """An RMSNorm whose forward also needs a conditioning input no op has."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return _rms(hidden_states, self.eps) * self.weight + cond


class HeadsConfig:
    def __init__(self, *, hidden_size: int = 96, num_heads: int = 3, eps: float = 1e-6) -> None:
        self.hidden_size, self.num_heads, self.eps = hidden_size, num_heads, eps


class HeadsNorm(ConfigRMSNorm):
    """Builds only where its config's heads divide the hidden size (not at D = 8)."""

    def __init__(self, config: HeadsConfig) -> None:
        if config.hidden_size % config.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        super().__init__(TinyConfig(hidden_size=config.hidden_size, rms_norm_eps=config.eps))


class ConfigLayerNorm(nn.Module):
    """A LayerNorm (weight and bias) inside, its eps from the config (PatchTSMixerNormLayer)."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.norm(inputs)
