"""The package's norm records with their row plans taken away, so that the
shaped engine checks them from the record alone: the evidence that a norm's record is
complete as an op of any shape, and how much sharper its row plan is (docs/shaped_ops.md, "A
norm as an op of any shape"). Named ``rms_norm_any``, ``layer_norm_any``, … so that they
never meet the package's own ``rms_norm``, ``layer_norm``, … (:data:`gradcheck_bi.ops.OPS`, checked
by the row engine); :func:`registered` adds them to :data:`gradcheck_bi.ops.SHAPED` for as
long as a test needs them (recognition then offers them to every kernel it reads, so never for
longer).

Both have a row ``x (n, d)``, a weight ``γ (d)`` (LayerNorm a bias ``β (d)`` too; RMSNorm an
optional one) and an output ``y (n, d)``; the axis ``d`` is coupled (the row's statistic).
The sweep's axes (:func:`gradcheck_bi.ops.norms.norm_op`): ``gamma`` (γ's control on the
*effective* weight, ones blind), ``zero_centered_gamma`` (passed; the stored weight is then
``γ − 1``), ``beta`` (LayerNorm: randn | zeros) or ``bias`` (RMSNorm: given or not), and
``cotangent``.

>>> import torch
>>> x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
>>> w = torch.zeros(2, dtype=torch.float64)
>>> RMS_NORM_ANY.reference({"x": x, "weight": w}, {"eps": 0.0, "zero_centered_gamma": True})["y"]
tensor([[0.8485, 1.1314]], dtype=torch.float64)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from gradcheck_bi.ops import OPS, SHAPED

# Every norm's record without its row plan, as ``<op>_any``.
ANY = {f"{name}_any": dataclasses.replace(op, name=f"{name}_any", rows=None)
       for name, op in OPS.items() if op.rows is not None}
RMS_NORM_ANY, LAYER_NORM_ANY = ANY["rms_norm_any"], ANY["layer_norm_any"]


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """Both ops in :data:`gradcheck_bi.ops.SHAPED` for the block, removed after it."""
    SHAPED.update(ANY)
    try:
        yield
    finally:
        for name in ANY:
            SHAPED.pop(name, None)
