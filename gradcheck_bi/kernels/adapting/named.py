"""Named adapters: ``--kernel torch`` or ``--kernel liger`` for the libraries people use.

Each name imports its library only when asked for; a library missing here gives a kernel
whose every result is ``unsupported`` with the import's message and how to install it.

=================== ==================================================================
name                kernel
=================== ==================================================================
torch               ``torch.nn.functional.rms_norm`` (no zero_centered_gamma)
torch:nn            ``torch.nn.RMSNorm``, built per shape and eps
liger               Liger-Kernel's ``LigerRMSNormFunction``, casting mode ``llama``
liger:gemma         the same, casting mode ``gemma`` (everything in fp32, one rounding)
liger:none          the same, casting mode ``none`` (no casts)
liger:inplace       the same with ``in_place=True``: a declared write into grad_output
liger:module        ``LigerRMSNorm`` (the Hugging Face-facing module)
liger:megatron      ``LigerMegatronRMSNorm`` (zero_centered_gamma as a keyword)
torch:layer_norm    ``torch.nn.functional.layer_norm`` (op layer_norm)
torch:nn.LayerNorm  ``torch.nn.LayerNorm``, built per shape and eps (op layer_norm)
liger:fused_add     ``LigerFusedAddRMSNormFunction`` (op fused_add_rms_norm; zcg as offset)
liger:layer_norm    ``LigerLayerNormFunction`` (op layer_norm)
=================== ==================================================================

Liger: zero_centered_gamma is its ``offset`` (1.0 under zcg), ``in_place=False`` (its
default ``True`` overwrites the upstream gradient with dx; ``liger:inplace`` keeps that
default and declares the write, a note in the report), and ``--kernel-arg`` reaches its
other parameters (``casting_mode``, ``row_mode``). Its Triton kernels need a CUDA GPU, and
its backward has no fp64; both are ``unsupported`` with a message saying so.

>>> sorted(NAMED)[:3]
['liger', 'liger:fused_add', 'liger:gemma']
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch

from gradcheck_bi.kernels.adapting.adapters import Adapted, adapt
from gradcheck_bi.kernels.adapting.loader import unimportable
from gradcheck_bi.vocab import KernelSpec, Unsupported, first_line

LIGER_INSTALL = "pip install 'gradcheck-bi[liger]'"


@dataclass(frozen=True)
class Named:
    """A named adapter: what it checks and what it needs, built only when asked for."""

    name: str
    summary: str
    needs: str
    package: str  # the import that must work (checked without importing by `installed`)
    build: Callable[[str, dict[str, Any]], KernelSpec]
    op: str = "rms_norm"  # the op it computes (gradcheck_bi.ops)

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None


def _torch_functional(name: str, kernel_args: dict[str, Any]) -> KernelSpec:
    return adapt(torch.nn.functional.rms_norm, name, name, kernel_args)


def _torch_module(name: str, kernel_args: dict[str, Any]) -> KernelSpec:
    return adapt(torch.nn.RMSNorm, name, name, kernel_args)


class _GuardedGrad(torch.autograd.Function):
    """Runs a kernel inside an autograd graph of its own, so that an exception its backward
    raises can be turned into a refusal here (Liger's fp64 backward: ``KeyError``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        with torch.enable_grad():
            xi, wi = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            y = run(xi, wi)
        ctx.graph = (y, xi, wi)
        return y.detach()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        y, xi, wi = ctx.graph
        try:
            dx, dw = torch.autograd.grad(y, (xi, wi), g)
        except KeyError as exc:  # Liger's Triton dtype map has no entry for this dtype
            raise Unsupported(f"Liger's backward has no {xi.dtype} kernel "
                              f"({first_line(exc)} in its Triton dtype map)") from None
        return dx, dw, None


class _Liger:
    """A Liger kernel behind the adapter, refusing what Liger cannot run with a clear line."""

    def __init__(self, inner: Adapted) -> None:
        self.inner = inner
        self.zcg = inner.zcg

    def apply(self, x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool) -> Any:
        if not x.is_cuda:
            raise Unsupported("Liger-Kernel's Triton kernels need a CUDA GPU; they do not "
                              "run on CPU, nor in Triton's CPU interpreter")
        if not torch.is_grad_enabled() or not (x.requires_grad or w.requires_grad):
            return self.inner.apply(x, w, eps, zcg)
        return _GuardedGrad.apply(x, w, lambda xi, wi: self.inner.apply(xi, wi, eps, zcg))


def _liger(attr_path: str, defaults: dict[str, Any], allow_mutation: frozenset[str] = frozenset()
           ) -> Callable[[str, dict[str, Any]], KernelSpec]:
    module_name, attr = attr_path.rsplit(":", 1)

    def build(name: str, kernel_args: dict[str, Any]) -> KernelSpec:
        obj = getattr(importlib.import_module(module_name), attr)
        spec = adapt(obj, name, name, {**defaults, **kernel_args})
        assert isinstance(spec.fn, Adapted)
        return KernelSpec(name, _Liger(spec.fn), (), spec.description, source=name,
                          zcg=spec.zcg, zcg_how=spec.zcg_how, allow_mutation=allow_mutation)

    return build


def _torch_layer_norm(name: str, kernel_args: dict[str, Any]) -> KernelSpec:
    # Its weight and bias default to None: the op is said, not read off the names.
    return adapt(torch.nn.functional.layer_norm, name, name, {**kernel_args, "op": "layer_norm"})


def _torch_layer_norm_module(name: str, kernel_args: dict[str, Any]) -> KernelSpec:
    return adapt(torch.nn.LayerNorm, name, name, kernel_args)  # recognised: (D,) weight, bias


class _LigerOp:
    """A Liger kernel of another op behind the adapter, refusing CPU with a clear line."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.op, self.zcg = inner, inner.op, inner.zcg

    def call(self, inputs: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
             options: dict[str, Any], zcg: bool) -> Any:
        if not inputs["x"].is_cuda:
            raise Unsupported("Liger-Kernel's Triton kernels need a CUDA GPU; they do not "
                              "run on CPU, nor in Triton's CPU interpreter")
        return self.inner.call(inputs, params, options, zcg)


def _liger_op(attr_path: str, defaults: dict[str, Any]
              ) -> Callable[[str, dict[str, Any]], KernelSpec]:
    module_name, attr = attr_path.rsplit(":", 1)

    def build(name: str, kernel_args: dict[str, Any]) -> KernelSpec:
        obj = getattr(importlib.import_module(module_name), attr)
        spec = adapt(obj, name, name, {**defaults, **kernel_args})
        return replace(spec, fn=_LigerOp(spec.fn))

    return build


def _megatron_config() -> SimpleNamespace:
    # The three fields LigerMegatronRMSNorm reads from Megatron's TransformerConfig.
    return SimpleNamespace(normalization="RMSNorm", sequence_parallel=False,
                           layernorm_zero_centered_gamma=False)


_FUNCTION = "liger_kernel.ops.rms_norm:LigerRMSNormFunction"
_LIGER_NEEDS = f"a CUDA GPU and liger-kernel: {LIGER_INSTALL}"
NAMED: dict[str, Named] = {n.name: n for n in [
    Named("torch", "torch.nn.functional.rms_norm; zcg absent", "torch", "torch",
          _torch_functional),
    Named("torch:nn", "torch.nn.RMSNorm, built per shape and eps; zcg absent", "torch",
          "torch", _torch_module),
    *[Named("liger" if mode == "llama" else f"liger:{mode}",
            f"LigerRMSNormFunction, casting_mode={mode}; zcg as offset",
            _LIGER_NEEDS, "liger_kernel",
            _liger(_FUNCTION, {"casting_mode": mode, "in_place": False}))
      for mode in ("llama", "gemma", "none")],
    Named("liger:inplace", "LigerRMSNormFunction with its in_place=True default (backward "
          "writes dx into grad_output: a declared mutation); zcg as offset", _LIGER_NEEDS,
          "liger_kernel", _liger(_FUNCTION, {"casting_mode": "llama", "in_place": True},
                                 frozenset({"grad_output"}))),
    Named("liger:module", "LigerRMSNorm (nn.Module), casting_mode=llama; zcg as offset",
          _LIGER_NEEDS, "liger_kernel",
          _liger("liger_kernel.transformers.rms_norm:LigerRMSNorm", {"in_place": False})),
    Named("liger:megatron", "LigerMegatronRMSNorm (nn.Module, casting llama); zcg as keyword",
          _LIGER_NEEDS, "liger_kernel",
          _liger("liger_kernel.megatron.rms_norm:LigerMegatronRMSNorm",
                 {"config": _megatron_config()})),
    Named("torch:layer_norm", "torch.nn.functional.layer_norm; zcg absent", "torch", "torch",
          _torch_layer_norm, op="layer_norm"),
    Named("torch:nn.LayerNorm", "torch.nn.LayerNorm, built per shape and eps; zcg absent",
          "torch", "torch", _torch_layer_norm_module, op="layer_norm"),
    Named("liger:fused_add", "LigerFusedAddRMSNormFunction, casting_mode=llama, "
          "in_place=False; zcg as offset", _LIGER_NEEDS, "liger_kernel",
          _liger_op("liger_kernel.ops.fused_add_rms_norm:LigerFusedAddRMSNormFunction",
                    {"casting_mode": "llama", "in_place": False}), op="fused_add_rms_norm"),
    Named("liger:layer_norm", "LigerLayerNormFunction; zcg absent", _LIGER_NEEDS,
          "liger_kernel", _liger_op("liger_kernel.ops.layer_norm:LigerLayerNormFunction", {}),
          op="layer_norm"),
]}


def resolve_named(ref: str, kernel_args: dict[str, Any] | None = None) -> KernelSpec | None:
    """The named adapter ``ref`` (``None`` if there is none by that name), built now."""
    named = NAMED.get(ref)
    if named is None:
        return None
    try:
        return named.build(ref, dict(kernel_args or {}))
    except ImportError as exc:
        return unimportable(ref, f"kernel {ref} needs {named.needs}: {first_line(exc)}")
