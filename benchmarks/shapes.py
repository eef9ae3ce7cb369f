"""Which shapes a run feeds the kernel: every (shape, dtype, layout) its forward and backward
receive, with call counts.

    PYTHONPATH=. python benchmarks/shapes.py                          # the default run
    PYTHONPATH=. python benchmarks/shapes.py -- --case cases/ci.toml  # any `run` arguments
    PYTHONPATH=. python benchmarks/shapes.py --gpu-elements 536870912  # GPU-sized FD chunks

Each distinct input shape is, for a Triton kernel, one compile (and, when autotuned, one
autotune) at least: the count of distinct shapes bounds a cold run's compile time
(docs/benchmarks.md, "Shapes a run feeds the kernel"). The run is the command line's own
(``gradcheck-bi run ARGS``), with every kernel wrapped by a :class:`Recorder`; its report is
discarded. ``--gpu-elements N`` sizes finite-difference chunks as a GPU with room for ``N``
elements would (a CPU chunk is capped to stay in cache and uses a finer ladder of sizes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

Key = tuple[str, tuple[int, ...], str, str]  # (phase, shape, dtype, layout)


def layout_of(t: torch.Tensor) -> str:
    """``contiguous``, ``offset`` (contiguous, storage offset > 0), ``transposed`` (the last
    two dims stored swapped) or ``strided`` (any other view)."""
    if t.is_contiguous():
        return "offset" if t.storage_offset() else "contiguous"
    return "transposed" if t.dim() > 1 and t.stride(-2) == 1 else "strided"


def _key(phase: str, t: torch.Tensor) -> Key:
    return phase, tuple(t.shape), str(t.dtype).removeprefix("torch."), layout_of(t)


class Recorder:
    """A kernel that counts what its forward (``x``) and hand-written backward (the
    cotangent of ``y``) receive, then runs the kernel it wraps.

    Both kinds of kernel are wrapped: an RMSNorm Function (``apply``) and a row op's
    adapter (``call``, the ``x`` input and the first output's cotangent). It does not
    pickle, so finite differences run every chunk in this process, where it can count.
    """

    def __init__(self, inner: Any, seen: Counter[Key]) -> None:
        self.inner, self.seen = inner, seen
        self.op = getattr(inner, "op", "rms_norm")

    def _watch(self, x: torch.Tensor, y: Any) -> Any:
        self.seen[_key("forward", x)] += 1
        first = y[0] if isinstance(y, (tuple, list)) else y
        if isinstance(first, torch.Tensor) and first.grad_fn is not None:
            # A node pre-hook sees the cotangent the backward gets (after tensor hooks).
            def on_backward(grads: tuple[torch.Tensor | None, ...]) -> None:
                if grads and grads[0] is not None:
                    self.seen[_key("backward", grads[0])] += 1

            first.grad_fn.register_prehook(on_backward)
        return y

    def apply(self, x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool) -> Any:
        return self._watch(x, self.inner.apply(x, w, eps, zcg))

    def call(self, inputs: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
             options: dict[str, Any], zcg: bool) -> Any:
        return self._watch(inputs["x"], self.inner.call(inputs, params, options, zcg))

    def __reduce__(self) -> Any:
        raise TypeError("a Recorder counts in its own process; it is not sent elsewhere")


@contextlib.contextmanager
def recording(seen: Counter[Key]) -> Iterator[None]:
    """While open, every kernel the command line loads is wrapped by a :class:`Recorder`."""
    from gradcheck_bi.cli import execute

    original = execute.resolve_kernels

    def wrapped(*args: Any, **kwargs: Any) -> list[Any]:
        return [replace(spec, fn=Recorder(spec.fn, seen))
                for spec in original(*args, **kwargs)]

    execute.resolve_kernels = wrapped  # type: ignore[assignment]
    try:
        yield
    finally:
        execute.resolve_kernels = original  # type: ignore[assignment]


@contextlib.contextmanager
def gpu_sized(elements: int | None) -> Iterator[None]:
    """Size FD chunks on CPU as on a GPU: room for ``elements`` elements (a quarter of free
    device memory there, not a cache-sized cap) and the GPU's ladder of batch sizes."""
    if elements is None:
        yield
        return
    from gradcheck_bi.fd import budget, chunks, coloured, estimate

    users = [m for m in (budget, chunks, coloured, estimate) if hasattr(m, "ladder_base")]
    saved = budget.CPU_CHUNK_ELEMENTS, [m.ladder_base for m in users]
    caps = coloured.CPU_CHUNK_ELEMENTS, coloured.MAX_ELEMENTS  # the input checks' calls
    budget.CPU_CHUNK_ELEMENTS = elements
    coloured.CPU_CHUNK_ELEMENTS = coloured.MAX_ELEMENTS = elements  # type: ignore[misc]
    for m in users:
        m.ladder_base = lambda device: 8  # type: ignore[attr-defined]
    try:
        yield
    finally:
        budget.CPU_CHUNK_ELEMENTS = saved[0]
        coloured.CPU_CHUNK_ELEMENTS, coloured.MAX_ELEMENTS = caps  # type: ignore[misc]
        for m, f in zip(users, saved[1], strict=True):
            m.ladder_base = f  # type: ignore[attr-defined]


def record(args: list[str], gpu_elements: int | None = None) -> tuple[int, Counter[Key]]:
    """Run ``gradcheck-bi run ARGS`` in this process; its exit code and what the kernels
    received."""
    from gradcheck_bi.cli import main
    from gradcheck_bi.runner import measured_here

    seen: Counter[Key] = Counter()
    with (tempfile.TemporaryDirectory() as tmp, recording(seen), gpu_sized(gpu_elements),
          measured_here()):  # the kernels are watched in this process
        out = os.path.join(tmp, "report.json")
        code = main(["run", *args, "--format", "json", "--output", out])
    return code, seen


def table(seen: Counter[Key]) -> str:
    """A markdown table: one line per distinct (shape, dtype, layout), its forward and
    backward calls; then the totals."""
    rows: dict[tuple[tuple[int, ...], str, str], list[int]] = {}
    for (phase, shape, dtype, layout), n in seen.items():
        rows.setdefault((shape, dtype, layout), [0, 0])[phase == "backward"] += n
    lines = ["| shape | dtype | layout | forward | backward |", "| --- | --- | --- | ---: | ---: |"]
    for (shape, dtype, layout), (f, b) in sorted(rows.items(), key=lambda kv: (
            -sum(kv[1]), kv[0])):
        lines.append(f"| {shape} | {dtype} | {layout} | {f} | {b} |")
    calls = [sum(n for (p, *_), n in seen.items() if p == ph) for ph in ("forward", "backward")]
    lines.append(f"\n{len(rows)} distinct (shape, dtype, layout); {calls[0]} forward and "
                 f"{calls[1]} backward calls; {len({k[1:] for k in seen if k[0] == 'forward'})}"
                 f" distinct forward inputs, {len({k[1] for k in seen})} distinct shapes")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-elements", type=int, default=None,
                        help="size FD chunks as a GPU with room for this many elements "
                             "(2**29 on an H200)")
    parser.add_argument("run_args", nargs="*", help="arguments of `gradcheck-bi run`, after --")
    opts = parser.parse_args()
    code, seen = record(opts.run_args, opts.gpu_elements)
    print(f"gradcheck-bi run {' '.join(opts.run_args) or '(default)'}: exit {code}")
    print(table(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
