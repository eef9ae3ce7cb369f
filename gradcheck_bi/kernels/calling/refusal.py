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

from gradcheck_bi.vocab import Unsupported, first_line

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
