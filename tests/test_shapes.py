"""The shapes a run feeds the kernel (benchmarks/shapes.py): few, and the ones the checks need.

On a GPU every new shape may be a compile or an autotune of the kernel; the finite-difference
chunks are padded to the batch sizes the batch invariance check uses anyway (on CPU, to one
size per check), the probe runs at the point's shape and the unperturbed forward at the
checked one.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import load_benchmark

from gradcheck_bi.checks import batch_sizes
from gradcheck_bi.fd.budget import batch_rows

ONE_POINT = ["--kernel", "after", "--shape", "2,8,256", "--weight", "randn", "--zcg", "off"]


shapes = load_benchmark("shapes", "shapes_bench")


def _forward_shapes(seen: Counter[tuple[str, tuple[int, ...], str, str]]
                    ) -> set[tuple[int, ...]]:
    return {shape for phase, shape, _, _ in seen if phase == "forward"}


def test_layouts_are_named() -> None:
    t = torch.randn(4, 6)
    assert shapes.layout_of(t) == "contiguous"
    assert shapes.layout_of(torch.randn(5, 6)[1:]) == "offset"
    assert shapes.layout_of(torch.randn(4, 12)[:, ::2]) == "strided"
    assert shapes.layout_of(torch.randn(6, 4).T) == "transposed"


def test_a_cpu_run_feeds_the_point_alone_batches_and_one_chunk_size() -> None:
    """The last, narrower chunk is padded to the others' size: one FD shape per check."""
    code, seen = shapes.record([*ONE_POINT, "--check", "dx,batch_invariance"])
    assert code == 0
    got = _forward_shapes(seen)
    bi = {(b, 256) for b in batch_sizes(256)}
    chunks = got - bi - {(2, 8, 256), (1, 256)}
    # The probe ran at the point's shape, not at a tiny one of its own; the unperturbed
    # forward at the checked (3-D) shape, not at a 2-D view of it.
    assert (2, 8) not in got and (16, 256) not in got, sorted(got)
    assert len(chunks) == 1, f"FD chunks of several row counts: {sorted(chunks)}"
    assert got >= bi | {(2, 8, 256), (1, 256)}, "a shape the checks need was not fed"


def test_a_gpu_sized_run_adds_no_shape_to_the_batch_invariance_batches() -> None:
    """With a GPU's room, every FD chunk is one of the batch sizes the batch invariance
    check compiles for anyway: dx adds no shape to dx + batch invariance."""
    code, seen = shapes.record([*ONE_POINT, "--check", "dx,batch_invariance"], 1 << 29)
    assert code == 0
    got = _forward_shapes(seen)
    assert got == {(b, 256) for b in batch_sizes(256)} | {(2, 8, 256), (1, 256)}, sorted(got)
    fd_only = _forward_shapes(shapes.record([*ONE_POINT, "--check", "dx"], 1 << 29)[1])
    assert fd_only - {(2, 8, 256)} == {(4096, 256)}, sorted(fd_only)


def test_the_recorder_counts_backward_cotangents_and_restores_the_cli() -> None:
    from gradcheck_bi.cli import execute

    before = execute.resolve_kernels
    code, seen = shapes.record([*ONE_POINT, "--check", "dw", "--layout",
                                 "contiguous,grad-strided"])
    assert code == 0 and execute.resolve_kernels is before
    backward = {(shape, layout) for phase, shape, _, layout in seen if phase == "backward"}
    assert backward == {((2, 8, 256), "contiguous"), ((2, 8, 256), "strided")}, backward
    assert "distinct shapes" in shapes.table(seen)


@pytest.mark.parametrize("rows", [1, 6, 30, 480, 2016, 24576])
def test_batch_rows_is_the_smallest_ladder_step(rows: int) -> None:
    step = batch_rows(rows)
    assert step >= rows and step >= 8
    assert step == 8 or step // 8 < rows, f"{step} is not the smallest for {rows}"
    assert batch_rows(rows, None) == rows, "without a ladder (CPU) a chunk is not padded"
