"""The fixed-order row reduction: exact-ish sums, batch invariance, torch vs interpreter."""

from __future__ import annotations

import pytest
import torch
from conftest import rand, where_differs

from gradcheck_bi.sums.blocking import block_d
from gradcheck_bi.sums.reduction import row_sum, use_backend

SHAPES = [(7, 1), (5, 5), (3, 1000), (4, 1024), (2, 5000), (3, 4096)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_row_sum_matches_fp64_sum(shape: tuple[int, int], backend: str) -> None:
    x = rand(*shape, seed=shape[1])
    got = row_sum(x, backend)
    ref = x.sum(-1)
    assert got.dtype == torch.float64
    tol = 1e-15 * x.abs().sum(-1).max().item() * 4
    assert torch.allclose(got, ref, rtol=0, atol=tol), where_differs(got, ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_interpreter_and_torch_paths_agree(shape: tuple[int, int], dtype: torch.dtype) -> None:
    x = rand(*shape, dtype=dtype, seed=7)
    a, b = row_sum(x, "triton"), row_sum(x, "torch")
    u = torch.finfo(dtype).eps
    tol = 8 * u * x.abs().double().sum(-1).max().item()
    assert (a.double() - b.double()).abs().max().item() <= tol, where_differs(a, b)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("n_cols", [5, 1000, 3000])
def test_row_bits_do_not_depend_on_batch_size(backend: str, n_cols: int) -> None:
    x = rand(300, n_cols, dtype=torch.float32, seed=n_cols)
    full = row_sum(x, backend)
    for size in (1, 2, 3, 64, 257):
        part = row_sum(x[:size], backend)
        assert torch.equal(part, full[:size]), (
            f"batch of {size}: {where_differs(part, full[:size])}")
    for r in (0, 150, 299):
        alone = row_sum(x[r : r + 1], backend)
        assert torch.equal(alone, full[r : r + 1]), f"row {r} alone differs"


def test_fp64_accumulates_in_fp64() -> None:
    # 1 + 1e-10 repeatedly: an fp32 accumulator would lose every 1e-10.
    x = torch.full((2, 3000), 1e-10, dtype=torch.float64)
    x[:, 0] = 1.0
    for backend in ("torch", "triton"):
        got = row_sum(x, backend)
        assert abs(got[0].item() - (1.0 + 2999e-10)) < 1e-14, backend


def test_block_size_depends_only_on_the_row_length() -> None:
    assert [block_d(n) for n in (1, 5, 1000, 1024, 1025, 8192)] == [1, 8, 1024, 1024, 1024, 1024]


def test_backend_override_and_bad_name() -> None:
    x = rand(3, 10)
    with use_backend("triton"):
        a = row_sum(x)
    assert torch.allclose(a, x.sum(-1))
    with pytest.raises(ValueError, match="unknown reduction backend"):
        row_sum(x, "cuda-magic")
    with pytest.raises(ValueError, match="non-empty"):
        row_sum(torch.empty(3, 0))
