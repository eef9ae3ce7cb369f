"""The torch ops a gradient check issues from the host, beside the kernel's own calls.

    PYTHONPATH=. python benchmarks/host_ops.py [--op rms_norm] [--shape 64,8192] [--check dw]

Runs each check once untimed, then once under a ``TorchDispatchMode`` that counts every
aten op the check dispatches outside the kernel under test (its forward and backward, by
the frames of ``gradcheck_bi/kernels/bundled``) and outside the per-chunk loop of
``fd.coloured`` (one batched forward and its sums per chunk: the floor's work). Printed per
check: ``host`` (all of them), ``views`` (no device work), ``gpu_eq`` (each ``row_sum``
that CUDA runs as one Triton launch counted once; on CPU it is a dozen torch ops) and
``syncs`` (``item``/``float``/``bool``/``tolist`` of a tensor and ``torch.equal``: on CUDA
each waits for the device; a boolean-mask index waits too and is counted as ``masks``).
Counted on CPU; on CUDA the same code issues the same ops, bar the ``row_sum``s.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradcheck_bi.checks.rows import run_op_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.vocab import Config

VIEWS = {"view", "detach", "alias", "transpose", "t", "select", "slice", "expand", "unsqueeze",
         "squeeze", "diagonal", "as_strided", "reshape", "_reshape_alias", "permute", "unbind",
         "split"}
SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default}


class HostOps(TorchDispatchMode):
    """Counts the ops dispatched inside it, by kind (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self._row_sums: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        frame, skip, row_sum = sys._getframe(1), False, None
        while frame is not None:
            name, path = frame.f_code.co_name, frame.f_code.co_filename
            skip = skip or "kernels/bundled/" in path or (name == "call"
                                                            and "fd/coloured" in path)
            if (name == "row_sum" and "sums/reduction" in path
                    and frame.f_locals.get("backend") != "torch"):
                row_sum = id(frame)
            frame = frame.f_back
        if not skip:
            c = self.counts
            c["host"] += 1
            c["views"] += func.overloadpacket.__name__ in VIEWS
            c["gpu_eq"] += row_sum is None or row_sum not in self._row_sums
            if row_sum is not None:
                self._row_sums.add(row_sum)
            c["syncs"] += func in SYNCS
            c["masks"] += (func is torch.ops.aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _tolist_counted(counter: HostOps) -> Iterator[None]:
    """``tolist`` dispatches no aten op on CPU; on CUDA it is a copy to the host and a sync."""
    real = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        counter.counts["syncs"] += 1
        return real(self)

    torch.Tensor.tolist = tolist  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.tolist = real  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="rms_norm")
    ap.add_argument("--kernel", default="gradcheck_bi.kernels.bundled.rmsnorm:After")
    ap.add_argument("--shape", default="64,8192")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--check", action="append", help="default: every gradient check")
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    fn = as_op_kernel(resolve(args.kernel, {"op": args.op}).fn)
    from gradcheck_bi.ops import OPS

    for check in args.check or list(OPS[args.op].gradient_checks):
        cfg = Config(check=check, op=args.op, shape=shape, dtype=args.dtype, device="cpu")
        run_op_check(fn, cfg)  # compiles and caches out of the count
        with HostOps() as counter, _tolist_counted(counter):
            m = run_op_check(fn, cfg)
        counts = " ".join(f"{k} {counter.counts[k]}"
                          for k in ("host", "views", "gpu_eq", "syncs", "masks"))
        print(f"{args.op} {check} {args.shape} {args.dtype}: {counts} (passed: {m.passed})",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
