"""Independent checks behind the scoreboard's hand classifications (docs/scoreboard.md).

    PYTHONPATH=benchmarks/scoreboard_stand_in python benchmarks/scoreboard_crosscheck.py

For a sample of the classes gradcheck-bi fails or refuses, this builds the module (or calls the
function) directly — without gradcheck-bi — at x of shape (4, 64), fp64, seed 0, a random
weight (and bias), and measures, against an fp64 formula of the op written here:

* fwd: max |module(x) − formula(x)|, relative to max |formula(x)|;
* grad: max over x, weight (and bias) of max |autograd of the module − autograd of the
  formula|, relative to that gradient's max, for one random cotangent;
* gradcheck: ``torch.autograd.gradcheck`` of the module in fp64 (its default eps 1e-6,
  atol 1e-5, rtol 1e-3; for a module whose forward is off by fp32 rounding, eps 1e-3 and
  atol = rtol = 1e-3), on x and every parameter.

Relative errors at fp64 rounding (~1e-15) or fp32 rounding (~1e-7, a module that computes in
fp32 inside) with no systematic part say "no defect of the library".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

D = 64


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    xc = x - x.mean(-1, keepdim=True)
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * w
    return y if b is None else y + b


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


# (class or function, how to build/call it, the fp64 formula of the same op)
CASES: list[tuple[str, dict[str, Any], Callable[..., torch.Tensor]]] = [
    ("torch.nn.functional:layer_norm", {},
     lambda x, p: layer(x, p["weight"], p["bias"], 1e-5)),
    ("transformers.models.cohere.modeling_cohere:CohereLayerNorm", {"hidden_size": D},
     lambda x, p: layer(x, p["weight"], None, 1e-5)),
    ("transformers.models.llama.modeling_llama:LlamaRMSNorm", {"hidden_size": D},
     lambda x, p: rms(x, p["weight"], 1e-6)),
    ("transformers.models.gemma.modeling_gemma:GemmaRMSNorm", {"dim": D},
     lambda x, p: rms(x, 1 + p["weight"], 1e-6)),
    ("transformers.models.olmo.modeling_olmo:OlmoLayerNorm", {"hidden_size": D},
     lambda x, p: layer(x, torch.ones(D, dtype=x.dtype), None, 1e-5)),
    ("transformers.models.muse_spark.modeling_muse_spark:MuseSparkRMSNorm", {"dim": D},
     lambda x, p: rms(x, p["weight"], 1e-6)),
    ("transformers.models.videoprism.modeling_videoprism:VideoPrismLayerNorm",
     {"normalized_shape": D},
     lambda x, p: layer(x, 1 + p["weight"], p["bias"], 1e-5)),
    ("transformers.models.nemotron.modeling_nemotron:NemotronLayerNorm1P",
     {"normalized_shape": D}, lambda x, p: layer(x, 1 + p["weight"], p["bias"], 1e-5)),
    ("transformers.models.llama4.modeling_llama4:Llama4TextL2Norm", {},
     lambda x, p: rms(x, torch.ones(D, dtype=x.dtype), 1e-6)),
]


def crosscheck(spec: str, kwargs: dict[str, Any],
               formula: Callable[..., torch.Tensor]) -> dict[str, Any]:
    torch.manual_seed(0)
    x = torch.randn(4, D, dtype=torch.float64, requires_grad=True)
    obj = _load(spec)
    if isinstance(obj, type):
        mod = obj(**kwargs).double()
        with torch.no_grad():
            for p in mod.parameters():
                p.copy_(torch.randn_like(p))
        params = dict(mod.named_parameters())
        call: Callable[..., torch.Tensor] = mod
    else:
        params = {"weight": torch.randn(D, dtype=torch.float64, requires_grad=True),
                  "bias": torch.randn(D, dtype=torch.float64, requires_grad=True)}

        def call(x: torch.Tensor) -> torch.Tensor:
            return obj(x, (D,), params["weight"], params["bias"], 1e-5)
    inputs = [x, *params.values()]
    y, ref = call(x), formula(x, params)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, inputs, g)
    want = torch.autograd.grad(ref, inputs, g)
    fwd = ((y - ref).abs().max() / ref.abs().max()).item()
    grad = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True))

    def as_function(*args: torch.Tensor) -> torch.Tensor:
        if isinstance(obj, type):
            tensors = dict(zip(params, args[1:], strict=True))
            return torch.func.functional_call(mod, tensors, (args[0],))
        return obj(args[0], (D,), args[1], args[2], 1e-5)

    # A module that computes in fp32 inside rounds at ~6e-8: gradcheck's default step 1e-6 would
    # difference that rounding (noise ~6e-2), so such a module gets step 1e-3 (noise ~6e-5,
    # truncation ~1e-6) and atol = rtol = 1e-3.
    settings = {} if fwd < 1e-12 else {"eps": 1e-3, "atol": 1e-3, "rtol": 1e-3}
    ok = torch.autograd.gradcheck(as_function, tuple(t.detach().requires_grad_() for t in inputs),
                                  raise_exception=False, **settings)
    how = ", ".join(f"{k} {v:g}" for k, v in settings.items()) or "defaults"
    return {"fwd": fwd, "grad": grad, "gradcheck": ok, "settings": how}


def main() -> None:
    print(f"x (4, {D}) fp64 seed 0, random weight/bias; relative to the formula's max")
    for spec, kwargs, formula in CASES:
        r = crosscheck(spec, kwargs, formula)
        print(f"{spec}: fwd {r['fwd']:.1e}  grad {r['grad']:.1e}  "
              f"gradcheck (fp64, {r['settings']}) {'passes' if r['gradcheck'] else 'FAILS'}")


if __name__ == "__main__":
    main()
