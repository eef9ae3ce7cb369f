"""The probe: does a kernel run a tiny forward on this device and dtype at all?

A kernel that refuses a target here (no GPU, a dtype it does not take) makes every result
of that target ``unsupported``, with the kernel's own message.
"""

from __future__ import annotations

import torch

from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.vocab import Config, KernelSpec, Unsupported, first_line


def probe(spec: KernelSpec, device: str, dtype: str) -> str | None:
    """``None`` if the kernel runs a tiny forward here, else why it refuses (unsupported)."""
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda asked for, but no CUDA GPU is visible here"
    try:
        x, w, _ = make_inputs(Config(check="forward", device=device, dtype=dtype, shape=(2, 8)))
        with torch.no_grad():
            spec.fn.apply(x, w, 1e-6, False)
    except Unsupported as exc:  # e.g. a user kernel whose module could not be imported here
        return str(exc)
    except Exception as exc:  # a kernel may raise anything; it is reported, not re-raised
        return f"kernel refuses {device}/{dtype}: {first_line(exc)}"
    return None
