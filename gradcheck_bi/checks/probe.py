"""Refusal or crash: is an exception a kernel's explicit refusal of a device or dtype?

A gate is worth its false-pass rate, so ``unsupported`` ("nothing wrong shown, it could not
run here") is kept for explicit refusals. Anything else a kernel raises is a bug — an
``error`` result, exit 1. An exception is a **refusal** when it is

* :class:`~gradcheck_bi.vocab.Unsupported` (``gradcheck_bi.Unsupported``), raised by the
  kernel or by this tool (no GPU here, a dtype the method cannot use, a missing import);
* a ``NotImplementedError`` raised by the kernel — not one raised by
  ``torch.autograd.Function``'s own ``forward``/``backward``, which stand in for a method
  the kernel does not define (that is a broken kernel, not a refusal);
* a ``RuntimeError``, ``TypeError`` or ``ValueError`` whose message names a device or a
  dtype (``cuda``, ``cpu``, ``float64``, ``fp64``, ``bfloat16``, ``half``, ``dtype`` …)
  **and** a refusal phrase (``requires``, ``unsupported``, ``not supported``, ``only
  supports``, ``does not support``, ``not implemented for`` …), and says nothing of two
  things disagreeing (``same``, ``mismatch``, ``operand``): "Expected all tensors to be on
  the same device" is a kernel mixing devices, a bug, though it names two.

"expected" is deliberately not a refusal phrase: torch's dtype and device mismatch errors
("expected scalar type Double but found Float") use it, and those are bugs.
An ``AssertionError``, ``NameError``, ``AttributeError``, ``ZeroDivisionError``, … is
always an error, whatever its message.

The **probe** runs one forward once per (kernel, device, dtype): a refusal there makes
every result of that target ``unsupported`` without running it. A crash there decides
nothing — each point then runs and reports its own exception, classified the same way.

>>> refusal(RuntimeError("Batch-invariant RMSNorm requires CUDA tensors."))
'RuntimeError: Batch-invariant RMSNorm requires CUDA tensors.'
>>> refusal(NameError("name 'rsqrtt' is not defined")) is None
True
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import torch

from gradcheck_bi.checks.family.point import make_point
from gradcheck_bi.kernels import phase
from gradcheck_bi.kernels.opadapt import as_op_kernel
from gradcheck_bi.kernels.trace import stops_the_run
from gradcheck_bi.ops import OPS
from gradcheck_bi.vocab import Config, KernelSpec, Unsupported, first_line

_NAMES_TARGET = re.compile(
    r"\b(cuda|cpu|gpu|mps|xpu|device|dtype|float64|float32|float16|bfloat16|fp64|fp32|fp16|"
    r"bf16|double|half)\b", re.IGNORECASE)
_REFUSES = re.compile(
    r"\b(requires?|unsupported|not supported|only supports?|supports only|only supported|"
    r"(?:does|do|can) ?not support|doesn't support|not implemented for|only (?:runs|works) on)\b",
    re.IGNORECASE)
_DISAGREEMENT = re.compile(r"\b(same|mismatch(?:ed)?|operands?)\b", re.IGNORECASE)
_TORCH_FUNCTION_BASE = Path(torch.autograd.function.__file__).resolve()


def _from_function_base(exc: BaseException) -> bool:
    """Raised by ``torch.autograd.Function``'s placeholder forward/backward."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve() == _TORCH_FUNCTION_BASE


def refusal(exc: BaseException) -> str | None:
    """The refusal's message if ``exc`` explicitly refuses a device or dtype, else ``None``."""
    if isinstance(exc, Unsupported):
        return str(exc)
    if isinstance(exc, NotImplementedError) and not _from_function_base(exc):
        return first_line(exc)
    if isinstance(exc, (RuntimeError, TypeError, ValueError)):
        text = str(exc)
        if (_NAMES_TARGET.search(text) and _REFUSES.search(text)
                and not _DISAGREEMENT.search(text)):
            return first_line(exc)
    return None


def probe(spec: KernelSpec, device: str, dtype: str, at: Config | None = None) -> str | None:
    """Why the kernel refuses this device/dtype (every result ``unsupported``), else ``None``.

    One forward at the shape (and group size) of the point ``at`` — the first the run
    measures there, so the probe feeds the kernel no shape the run would not — or, without
    one, at ``(2, 8)``. Only a refusal counts: a forward that crashes returns ``None``, so
    that each point runs and reports its own ``error``.
    """
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda asked for, but no CUDA GPU is visible here"
    try:
        if at is None:
            at = Config(check="forward", shape=(2, 8), op=spec.op,
                        group_size=8 if OPS[spec.op].has("group_size") else None)
        cfg = Config(check="forward", device=device, dtype=dtype, shape=at.shape, op=spec.op,
                     group_size=at.group_size, norm_before_gate=at.norm_before_gate,
                     bias=at.bias)
        phase.now("forward (probe)")
        with torch.no_grad():
            p = make_point(cfg)  # zcg off, unless only on is run
            as_op_kernel(spec.fn).call(p.inputs, p.params, p.options, min(spec.zcg))
    except Unsupported as exc:  # e.g. a user kernel whose module could not be imported here
        return str(exc)
    except BaseException as exc:  # a kernel may raise anything; only a refusal decides here
        if stops_the_run(exc):
            raise
        why = refusal(exc)
        return None if why is None else f"kernel refuses {device}/{dtype}: {why}"
    return None
