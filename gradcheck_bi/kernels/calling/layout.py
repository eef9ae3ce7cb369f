"""Memory layouts a kernel may be handed: the same values, other strides or offsets.

Real norm kernels have broken outside fresh contiguous tensors: a backward that read a
strided grad_output as if it were contiguous, a forward that assumed a 2-D input. A layout
names one tensor and how it is laid out:

* ``contiguous`` — every tensor fresh and contiguous (the default point);
* ``x-strided``, ``weight-strided``, ``grad-strided`` — every other element of a tensor
  twice as wide in the last dim (the gaps hold NaN, so a kernel that reads the view as if it
  were contiguous reads NaN and cannot pass);
* ``x-transposed``, ``grad-transposed`` — stored with the last two dims swapped and viewed
  back (strides ``(…, 1, rows)``); the same as contiguous where a dim is 1;
* ``x-offset``, ``weight-offset``, ``grad-offset`` — a slice of a larger tensor: storage
  offset of one row (of ``D`` elements), NaN before it.

``grad`` is the cotangent the kernel's backward receives (its grad_output). The values are
bitwise those of the contiguous tensor; only the memory differs.

>>> import torch
>>> t = torch.arange(6.0).reshape(2, 3)
>>> v = lay_out(t, "x-strided", "x")
>>> torch.equal(v, t), v.is_contiguous(), v.stride()
(True, False, (6, 2))
>>> lay_out(t, "x-strided", "weight") is t  # a layout of x leaves the weight alone
True
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "x-strided", "x-transposed", "x-offset", "weight-strided",
           "weight-offset", "grad-strided", "grad-transposed", "grad-offset")


def target(layout: str) -> str | None:
    """The tensor a layout applies to (``None`` for ``contiguous``)."""
    return None if layout == "contiguous" else layout.split("-", 1)[0]


def applies(layout: str, check: str) -> bool:
    """Whether a point of ``check`` can carry ``layout``: the forward has no cotangent,
    and the batch-invariance check builds its own batches."""
    if layout == "contiguous":
        return True
    if check == "batch_invariance":
        return False
    return not (check == "forward" and target(layout) == "grad")


def lay_out(t: torch.Tensor, layout: str, name: str) -> torch.Tensor:
    """``t`` (tensor ``name``: x, weight or grad) in ``layout``: same values, other memory;
    ``t`` itself when the layout is for another tensor."""
    if target(layout) != name:
        return t
    how = layout.split("-", 1)[1]
    nan = float("nan")
    if how == "strided":
        base = t.new_full((*t.shape[:-1], 2 * t.shape[-1]), nan)
        base[..., ::2] = t
        return base[..., ::2]
    if how == "transposed":
        if t.dim() < 2:
            return t
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "offset":
        shift = t.shape[-1]
        base = t.new_full((shift + t.numel(),), nan)
        base[shift:] = t.reshape(-1)
        return base[shift:].view(t.shape)
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
