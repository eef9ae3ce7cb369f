"""A point's label as a baseline's drift lines and a hang's excuse spell it.

Users keep baselines and read drift lines keyed by these words, so they are pinned here
byte for byte, for a point of each norm op (γ, zcg, β, a gated norm's group size and order)
and of two ops of any shape (swiglu, cross-entropy: no γ, their options as a variant). A
hang names no γ or zcg for an op without a weight (it once named the defaults of both).
"""

from __future__ import annotations

from typing import Any

import pytest

from gradcheck_bi.gate.baseline import describe_key, key_of
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec, Result
from gradcheck_bi.workers import Hangs

# (the point's fields, its baseline label, its hang label)
POINTS: list[tuple[dict[str, Any], str, str]] = [
    ({"op": "rms_norm"},
     "k dx cpu/fp64 shape (2, 8, 256) γ=randn zcg=off eps 1e-06 seed 0",
     "dx γ=randn zcg=off"),
    ({"op": "rms_norm", "control": "ones", "zero_centered_gamma": True, "bias": "zeros",
      "seed": 3, "input_scale": 2.0, "weight_scale": 0.5},
     "k dx cpu/fp64 shape (2, 8, 256) γ=ones zcg=on eps 1e-06 seed 3 x-scale 2 γ-scale 0.5"
     " β=zeros",
     "dx γ=ones zcg=on x·2 γ·0.5 seed 3"),
    ({"op": "fused_add_rms_norm", "layout": "x-strided"},
     "k dx cpu/fp64 shape (2, 8, 256) γ=randn zcg=off eps 1e-06 seed 0 layout x-strided"
     " op fused_add_rms_norm",
     "dx γ=randn zcg=off layout x-strided"),
    ({"op": "layer_norm", "bias": "randn", "control": "zeros"},
     "k dx cpu/fp64 shape (2, 8, 256) γ=zeros zcg=off eps 1e-06 seed 0 op layer_norm β=randn",
     "dx γ=zeros zcg=off"),
    ({"op": "rms_norm_gated", "bias": "randn", "group_size": 64, "norm_before_gate": False,
      "zero_centered_gamma": True},
     "k dx cpu/fp64 shape (2, 8, 256) γ=randn zcg=on eps 1e-06 seed 0 op rms_norm_gated"
     " β=randn group 64 norm_before_gate False",
     "dx γ=randn zcg=on"),
    ({"op": "rms_norm_gated", "group_size": 256, "norm_before_gate": True},
     "k dx cpu/fp64 shape (2, 8, 256) γ=randn zcg=off eps 1e-06 seed 0 op rms_norm_gated"
     " group 256 norm_before_gate True",
     "dx γ=randn zcg=off"),
    ({"op": "swiglu", "check": "da", "variant": (("gate_multiplier", 0.7),
                                                  ("down_multiplier", 1.0))},
     "k da cpu/fp64 shape (2, 8, 256) seed 0 op swiglu gate_multiplier=0.7 down_multiplier=1.0",
     "da"),
    ({"op": "cross_entropy", "check": "dlogits",
      "variant": (("reduction", "sum"), ("softcap", None),
                                                            ("weight", True))},
     "k dlogits cpu/fp64 shape (2, 8, 256) seed 0 op cross_entropy reduction=sum softcap=None"
     " weight=True",
     "dlogits"),
]


def _config(fields: dict[str, Any]) -> Config:
    return Config(**{"check": "dx", **fields})


def _result(cfg: Config) -> Result:
    from gradcheck_bi.ops import SHAPED

    return Result("k", cfg.check, cfg.device, cfg.dtype, list(cfg.shape), cfg.eps, cfg.seed,
                  cfg.control, cfg.zero_centered_gamma, 1e-15, 1e-13, "pass", "pass", True,
                  input_scale=cfg.input_scale, weight_scale=cfg.weight_scale,
                  layout=cfg.layout, op=cfg.op, bias=cfg.bias, group_size=cfg.group_size,
                  norm_before_gate=cfg.norm_before_gate,
                  variant=dict(cfg.variant) if cfg.variant else None,
                  row_axes=cfg.op not in SHAPED)


@pytest.mark.parametrize("fields,label,_", POINTS, ids=[f"{p['op']}-{i}" for i, (p, _, _)
                                                        in enumerate(POINTS)])
def test_a_baseline_labels_a_point_as_it_always_has(fields: dict[str, Any], label: str,
                                                    _: str) -> None:
    assert describe_key(key_of(_result(_config(fields)))) == label


@pytest.mark.parametrize("fields,_,label", POINTS, ids=[f"{p['op']}-{i}" for i, (p, _, _)
                                                        in enumerate(POINTS)])
def test_a_hang_names_the_point_it_hung_in(fields: dict[str, Any], _: str, label: str) -> None:
    spec, sweep, cfg = KernelSpec("k", None, source="k.py:K"), Sweep(timeout=2), _config(fields)
    hangs = Hangs()
    hangs.add((spec, cfg, sweep), "backward")
    other = Config(check=cfg.check, shape=cfg.shape, op=cfg.op)
    excuse = hangs.excuse((spec, other, sweep))
    assert excuse is not None and excuse.details["hung_in"] == label
    assert excuse.message == (f"not run: the kernel hung at this shape in point {label} "
                              "(backward past 2 s)")
