"""Torch calls of a whole run by who makes them: the kernel's Functions, gradcheck-bi's FD
sums, or the rest of gradcheck-bi (gradcheck-bi's own work per result).

    PYTHONPATH=. python3 benchmarks/run_ops.py [--top N] [-- RUN ARGS]

One process runs ``gradcheck-bi run --format json RUN ARGS`` with every aten op counted (a
``TorchDispatchMode``, views aside), each call filed under the part it runs in
(the parts of ``run_profile.py``'s breakdown). A count is machine-independent where a
time on a shared machine is not: on CUDA each op outside the kernel is a launch, each
``item``, ``float``, ``bool`` or ``equal`` of a tensor a host sync, and so is a ``tolist``
(counted with the syncs and listed among the calls, not among the ops). Prints Markdown: ops per
part and per result, syncs, and the rest's most frequent ops with the function making them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_profile import Clock, instrument

# aten ops that bring a value to the host (on CUDA: a sync)
SYNCS = {"_local_scalar_dense", "equal", "is_nonzero"}


class PartClock(Clock):
    """A :class:`Clock` that also says which part runs now."""

    def __init__(self) -> None:
        super().__init__(lambda: None)
        self.part = "rest"

    def time(self, kind: str, key: tuple[Any, ...], call: Any) -> Any:
        if self._depth:
            return call()
        previous, self.part = self.part, kind
        try:
            return super().time(kind, key, call)
        finally:
            self.part = previous


def _caller() -> str:
    """The innermost gradcheck_bi frame making the call (file:function)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "gradcheck_bi" in name and "run_ops" not in name:
            short = name.split("gradcheck_bi/", 1)[-1]
            return f"{short}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _is_view(func: Any) -> bool:
    """An aten op that only makes a view (an alias of an input, nothing written)."""
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


def count(run_args: list[str]) -> tuple[dict[str, int], collections.Counter[tuple[str, str]],
                                         dict[str, int], int]:
    """Aten ops (views aside) of one run by part; the rest's by (op, caller); syncs by
    part; the number of results."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import gradcheck_bi.cli as cli
    import gradcheck_bi.fd.estimate  # noqa: F401  (instrument patches what is imported)

    clock = PartClock()
    instrument(clock)
    parts: dict[str, int] = collections.Counter()
    syncs: dict[str, int] = collections.Counter()
    rest: collections.Counter[tuple[str, str]] = collections.Counter()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            if not _is_view(func):
                parts[clock.part] += 1
                if name in SYNCS:
                    syncs[clock.part] += 1
                if clock.part == "rest":
                    rest[(name, _caller())] += 1
            return func(*args, **(kwargs or {}))

    # ``tolist`` brings a whole tensor to the host in one go: on CUDA a copy to the host and
    # a sync, on CPU no aten op at all, so it is counted here (a tensor made on the CPU,
    # such as fd.stencil.level_offsets(), is no sync on CUDA: the caller tells which).
    import torch

    real_tolist = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        syncs[clock.part] += 1
        if clock.part == "rest":
            rest[("tolist", _caller())] += 1
        return real_tolist(self)

    sink = io.StringIO()
    from gradcheck_bi.runner import measured_here

    torch.Tensor.tolist = tolist  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(sink), Mode(), measured_here():  # the ops run here
            cli.main(["run", "--no-progress", "--format", "json", *run_args])
    finally:
        torch.Tensor.tolist = real_tolist  # type: ignore[method-assign]
    import json
    n_results = len(json.loads(sink.getvalue())["results"])
    return parts, rest, syncs, n_results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("run_args", nargs="*", help="after --: arguments of `gradcheck-bi run`")
    opts = ap.parse_args()
    parts, rest, syncs, n = count(opts.run_args)
    print(f"`run {' '.join(opts.run_args)}`: {n} results\n")
    print("| part | aten ops (views aside) | per result | syncs (item, equal, bool; tolist) |")
    print("| --- | ---: | ---: | ---: |")
    for part in ("kernel", "fd", "rest"):
        print(f"| {part} | {parts[part]} | {parts[part] / n:.0f} | {syncs[part]} |")
    print("\n| the rest's most frequent calls | calls |\n| --- | ---: |")
    for (name, where), c in rest.most_common(opts.top):
        print(f"| `{name}` in {where} | {c} |")


if __name__ == "__main__":
    main()
