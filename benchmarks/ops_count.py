"""The torch ops one gradient check dispatches, and the bytes each touches: the kernel's own
calls apart from the engine's work around them.

    PYTHONPATH=. python benchmarks/ops_count.py [--op rms_norm] [--shape 64,8192]
        [--dtype fp32] [--check dx --check dw] [--top 25]

Runs each check once untimed (caches, the kept draw), then once under a
``TorchDispatchMode`` that records every aten op: who called it (the kernel — any frame in
the kernel's own module — or the innermost gradcheck_bi function), its bytes (every tensor
argument and result; 0 for a view) and its size class (the largest tensor it touches
against ``N`` = the point's elements: ``small`` ≤ max(R, D), ``N`` ≤ 2 N, ``6N`` ≤ 8 N
(every level of every column: ``(2L, D, R)``), ``>8N`` beyond: a GPU's batched call). A
fixed-order ``row_sum`` counts as one op (one Triton launch on CUDA), whatever its CPU
torch path dispatches. Prints, per check,
the totals by owner and size class, the engine's ops grouped by function and the ops the
finite differences run once per batched call (their count times the calls a GPU makes is
what a GPU pays per call).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gradcheck_bi.checks.rows import run_op_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.ops import ROWS
from gradcheck_bi.sweep import checks_of
from gradcheck_bi.vocab import Config

KERNEL = "gradcheck_bi.kernels.bundled.rmsnorm:After"
PKG = os.sep + "gradcheck_bi" + os.sep
KERNEL_FILES = (os.path.join("kernels", "bundled") + os.sep, os.sep + "tests" + os.sep
                + "kernels" + os.sep)
# the forward's and the FD loop's per-call functions (fd.coloured.input_grad_outputs.call)
PER_CALL = {("coloured", "call")}


@dataclass
class Tally:
    ops: collections.Counter[tuple[str, ...]] = field(default_factory=collections.Counter)
    bytes: collections.Counter[tuple[str, ...]] = field(default_factory=collections.Counter)


def _where(frame: Any) -> tuple[str, str, bool]:
    """``(owner, innermost gradcheck_bi function, inside row_sum)`` for the op being run."""
    inner, kernel, in_row_sum = "", False, False
    while frame is not None:
        f = frame.f_code.co_filename
        if any(k in f for k in KERNEL_FILES):
            kernel = True
        if PKG in f:
            mod = os.path.splitext(os.path.basename(f))[0]
            name = f"{mod}.{frame.f_code.co_name}"
            if frame.f_code.co_name == "row_sum" and mod == "reduction":
                in_row_sum = True
            if not inner and mod not in ("_python_dispatch",):
                inner = name
        frame = frame.f_back
    return ("kernel" if kernel else "engine"), inner, in_row_sum


class Counter(TorchDispatchMode):
    def __init__(self, n: int, dims: tuple[int, int]) -> None:
        super().__init__()
        self.n, self.dims = n, dims
        self.by_owner = Tally()
        self.by_func = Tally()
        self.per_call = Tally()
        self.by_op = Tally()
        self.row_sums: set[int] = set()
        self.syncs = 0

    def _size(self, numel: int) -> str:
        if numel <= max(self.dims):
            return "small"
        return "N" if numel <= 2 * self.n else "6N" if numel <= 8 * self.n else ">8N"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        frame = sys._getframe(1)
        owner, inner, in_row_sum = _where(frame)
        if in_row_sum:  # one op per row_sum call (a Triton launch on CUDA)
            f = frame
            while f is not None and not (f.f_code.co_name == "row_sum"
                                         and f.f_code.co_filename.endswith("reduction.py")):
                f = f.f_back
            key = id(f)
            if key in self.row_sums:
                return out
            self.row_sums.add(key)
            name = "row_sum"
        else:
            name = str(func.overloadpacket.__name__)
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        view = getattr(func, "is_view", False) or name in ("detach", "alias")
        nbytes = 0 if view else sum(t.numel() * t.element_size() for t in tensors)
        if name == "index_put_":  # the indices, the values and the elements written
            _, idx, vals = args[:3]
            nbytes = 2 * vals.numel() * args[0].element_size() + sum(
                i.numel() * i.element_size() for i in idx if i is not None)
        biggest = max((t.numel() for t in tensors), default=0)
        size = "view" if view else self._size(biggest)
        masked = name in ("index", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
        if name in ("_local_scalar_dense", "nonzero") or masked:  # a host sync on CUDA
            self.syncs += 1
        for tally, key in ((self.by_owner, (owner, size)), (self.by_func, (owner, inner, size)),
                           (self.by_op, (owner, name, size))):
            tally.ops[key] += 1
            tally.bytes[key] += nbytes
        mod_fn = tuple(inner.split(".", 1)) if inner else ("", "")
        if owner == "engine" and mod_fn in PER_CALL:
            self.per_call.ops[(name, size)] += 1
            self.per_call.bytes[(name, size)] += nbytes
        return out


def _mb(b: int) -> str:
    return f"{b / 2**20:.1f}"


def count(op: str, shape: tuple[int, ...], dtype: str, checks: list[str] | None,
          top: int, device: str = "cpu", ref: str = KERNEL) -> None:
    spec = resolve(ref, {"op": op})
    fn = as_op_kernel(spec.fn)
    for check in checks or [c for c in ROWS[op].gradient_checks if c in checks_of(spec)]:
        cfg = Config(check=check, op=op, shape=shape, dtype=dtype, device=device)
        run_op_check(fn, cfg)  # untimed: caches, the kept draw
        n = 1
        for s in shape:
            n *= s
        mode = Counter(n, (n // shape[-1], shape[-1]))
        calls = _forward_calls(fn, n)
        with mode:
            m = run_op_check(fn, cfg)
        fwd = calls()
        verdict = "pass" if m.passed else "FAIL"
        print(f"\n## {op} {check} {shape} {dtype} {device}: {verdict}, kernel calls "
              f"{fwd['calls']} (at the batch: {fwd['batched']}), host syncs on CUDA {mode.syncs}\n")
        print("| owner | size | ops | MiB touched |\n| --- | --- | ---: | ---: |")
        for key in sorted(mode.by_owner.ops):
            print(f"| {key[0]} | {key[1]} | {mode.by_owner.ops[key]} | "
                  f"{_mb(mode.by_owner.bytes[key])} |")
        tot = sum(v for k, v in mode.by_owner.ops.items() if k[0] == "engine" and k[1] != "view")
        print(f"\nengine ops (views aside): {tot}\n")
        print("| engine function | size | ops | MiB |\n| --- | --- | ---: | ---: |")
        rows = [(k, v) for k, v in mode.by_func.ops.items() if k[0] == "engine" and k[2] != "view"]
        for key, v in sorted(rows, key=lambda kv: (-mode.by_func.bytes[kv[0]], -kv[1]))[:top]:
            print(f"| {key[1]} | {key[2]} | {v} | {_mb(mode.by_func.bytes[key])} |")
        print("\n| engine aten op | size | ops | MiB |\n| --- | --- | ---: | ---: |")
        rows = [(k, v) for k, v in mode.by_op.ops.items() if k[0] == "engine" and k[2] != "view"]
        for key, v in sorted(rows, key=lambda kv: (-kv[1], kv[0]))[:top]:
            print(f"| {key[1]} | {key[2]} | {v} | {_mb(mode.by_op.bytes[key])} |")
        if mode.per_call.ops:
            print("\nper batched FD call (coloured.call), summed over the CPU's calls:\n")
            print("| aten op | size | ops | MiB |\n| --- | --- | ---: | ---: |")
            for key, v in sorted(mode.per_call.ops.items(), key=lambda kv: -kv[1]):
                print(f"| {key[0]} | {key[1]} | {v} | {_mb(mode.per_call.bytes[key])} |")


def _forward_calls(fn: Any, n: int) -> Any:
    """Count the kernel's calls from now on (forward, and the analytic forward + backward),
    and those fed more elements than the point's ``n`` (the batched FD calls)."""
    from gradcheck_bi.kernels.calling import opcall

    seen = {"calls": 0, "batched": 0}
    orig = opcall._called

    def wrapped(f: Any, inputs: Any, *a: Any) -> Any:
        seen["calls"] += 1
        seen["batched"] += int(next(iter(inputs.values())).numel() > n)
        return orig(f, inputs, *a)

    opcall._called = wrapped  # type: ignore[assignment]

    def done() -> dict[str, int]:
        opcall._called = orig  # type: ignore[assignment]
        return seen

    return done


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="rms_norm")
    ap.add_argument("--shape", default="64,8192")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--check", action="append")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    count(args.op, tuple(int(s) for s in args.shape.split(",")), args.dtype, args.check,
          args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
