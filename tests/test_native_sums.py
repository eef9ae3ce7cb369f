"""The compiled one-pass CPU level sums (C built here, and numba): the torch path's bits, and
when they run."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from conftest import rand, where_differs

from gradcheck_bi import fd
from gradcheck_bi.fd import _c_fd
from gradcheck_bi.fd.reduce import Sums, _level_sums_torch


@pytest.fixture(params=["c", "numba"])
def compiled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[ModuleType]:
    """Each compiled path in turn, as ``level_sums(native=True)`` reaches it: the C build
    (the default where it builds), then numba with the C path turned off."""
    if request.param == "c":
        if _c_fd.library() is None:
            pytest.skip("no C compiler builds the level sums here")
        monkeypatch.delenv("GRADCHECK_BI_CC", raising=False)
        yield _c_fd
        return
    pytest.importorskip("numba")
    from gradcheck_bi.fd import _numba_fd

    monkeypatch.setenv("GRADCHECK_BI_CC", "0")
    yield _numba_fd


@pytest.fixture
def numba_only(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """numba's path with the C path off: its start-repaying rules."""
    pytest.importorskip("numba")
    from gradcheck_bi.fd import _numba_fd

    monkeypatch.setenv("GRADCHECK_BI_CC", "0")
    return _numba_fd


def _chunk(levels: int, cols: int, rows: int, d: int, dtype: torch.dtype, seed: int):  # type: ignore[no-untyped-def]
    """Perturbed outputs near y0 (differences small against y, as in a real chunk), with a
    -0.0 and an exact zero difference planted."""
    y0 = rand(rows, d, dtype=dtype, seed=seed)
    ys = y0[None, None] + 1e-3 * rand(2 * levels, cols, rows, d, dtype=dtype, seed=seed + 1)
    ys[0, 0, 0, 0] = y0[0, 0]
    ys[levels, 0, 0, 0] = y0[0, 0]
    ys[:, 0, -1, -1] = -0.0
    return ys, y0.double(), rand(rows, d, seed=seed + 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", [1, 2, 3, 5, 16, 255, 256, 300, 1023, 1024, 1025, 2048, 2500,
                               4097])
def test_native_sums_are_the_torch_paths_bits(compiled: ModuleType, dtype: torch.dtype,
                                              d: int) -> None:
    for levels in (1, 3):
        ys, y0, g = _chunk(levels, 2, 3, d, dtype, seed=d + levels)
        for sums in (Sums(levels), Sums(levels, odd=False), Sums(levels, even=False)):
            want = _level_sums_torch(ys, y0, g, sums)
            got = fd.reduce.level_sums(ys, y0, g, sums, native=True)
            assert got.dtype == torch.float64 and torch.equal(got, want), \
                f"D={d} {sums}: " + where_differs(got, want)


def test_native_sums_write_into_a_strided_view(compiled: ModuleType) -> None:
    ys, y0, g = _chunk(3, 2, 4, 300, torch.float64, seed=3)
    whole = torch.full((6, 5, 9), float("nan"), dtype=torch.float64)
    view = whole[:, 1:3, 2:6]  # (6, 2, 4), not contiguous
    out = fd.reduce.level_sums(ys, y0, g, native=True, out=view)
    assert out.data_ptr() == view.data_ptr()
    assert torch.equal(view, _level_sums_torch(ys, y0, g, Sums(3)))
    assert whole[:, 0].isnan().all() and whole[:, :, :2].isnan().all(), "wrote outside out"
    with pytest.raises(ValueError, match="out must be fp64"):
        compiled.level_sums(ys, y0, g, True, True, out=torch.empty(6, 2, 4))


def test_native_sums_refuse_what_they_cannot_compute(compiled: ModuleType) -> None:
    ys, y0, g = _chunk(1, 1, 2, 8, torch.float64, seed=1)
    with pytest.raises(ValueError, match="fp32/fp64 CPU"):
        compiled.level_sums(ys.half(), y0, g, True, True)
    with pytest.raises(ValueError, match="2 points per level"):
        compiled.level_sums(ys[:1], y0, g, True, True)
    with pytest.raises(ValueError, match="D ≥ 1"):  # nothing to read: never past the end
        compiled.level_sums(ys[..., :0], y0[:, :0], g[:, :0], True, True)
    with pytest.raises(ValueError, match="rows, D"):
        compiled.level_sums(ys, y0, g[:1], True, True)
    # bf16 outputs are not compiled for: the torch path takes them, native asked or not
    got = fd.reduce.level_sums(ys.bfloat16(), y0, g, native=True)
    assert torch.equal(got, _level_sums_torch(ys.bfloat16(), y0, g, Sums(1)))


def test_numba_only_for_large_cpu_checks(numba_only: ModuleType,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    big = fd.reduce.NATIVE_MIN_ELEMENTS
    assert fd.reduce.native_worth(big, cpu)
    assert not fd.reduce.native_worth(big - 1, cpu)
    assert not fd.reduce.native_worth(big, torch.device("meta"))
    monkeypatch.setenv("GRADCHECK_BI_NUMBA", "0")
    fd.reduce.numba_available.cache_clear()
    try:
        assert not fd.reduce.native_worth(big, cpu)
    finally:
        monkeypatch.delenv("GRADCHECK_BI_NUMBA")
        fd.reduce.numba_available.cache_clear()


def test_loaded_sums_serve_small_checks_of_their_dtype(numba_only: ModuleType,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Once this process has run numba's sums on fp64 outputs, a small fp64 CPU check uses
    them too (no start to repay, the same bits); fp32, other devices and
    GRADCHECK_BI_NUMBA=0 do not."""
    _numba_fd = numba_only
    cpu, small = torch.device("cpu"), 1000
    monkeypatch.setattr(_numba_fd, "READY", set())
    assert not fd.reduce.native_worth(small, cpu, torch.float64)
    ys, y0, g = _chunk(3, 2, 3, 40, torch.float64, seed=5)
    fd.reduce.level_sums(ys, y0, g, native=True)
    assert _numba_fd.READY == {torch.float64}
    assert fd.reduce.native_worth(small, cpu, torch.float64)
    assert not fd.reduce.native_worth(small, cpu, torch.float32)
    assert not fd.reduce.native_worth(small, cpu)
    assert not fd.reduce.native_worth(small, torch.device("meta"), torch.float64)
    monkeypatch.setenv("GRADCHECK_BI_NUMBA", "0")
    assert not fd.reduce.native_worth(small, cpu, torch.float64)
    monkeypatch.delenv("GRADCHECK_BI_NUMBA")
    from gradcheck_bi.sums.reduction import use_backend

    with use_backend("torch"):  # a forced backend keeps its own path
        assert not fd.reduce.native_worth(small, cpu, torch.float64)


def test_a_run_whose_checks_repay_the_start_together_loads_the_sums(
        numba_only: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks each too small for numba's sums, but enough of them in one run: the run loads
    them up front (fd.reduce.preload), per dtype, and not for a run below that."""
    _numba_fd = numba_only
    from gradcheck_bi.sweep import Sweep
    from gradcheck_bi.upfront import preload_cpu_sums
    from gradcheck_bi.vocab import Config

    def points(*cfgs: Config) -> list:  # type: ignore[type-arg]
        return [(None, cfg, Sweep()) for cfg in cfgs]

    one = 6 * 64 * 4 * 64  # the perturbed elements of one (4, 64) dx check
    monkeypatch.setattr(_numba_fd, "READY", set())
    monkeypatch.setattr(fd.reduce, "NATIVE_MIN_ELEMENTS", 2 * one)
    preload_cpu_sums(points(Config(check="dx", shape=(4, 64)),
                             Config(check="dw", shape=(4, 64)),
                             Config(check="dx", shape=(4, 64), device="cuda"),
                             Config(check="dx", shape=(4, 64), dtype="fp32")))
    assert _numba_fd.READY == set()
    preload_cpu_sums(points(Config(check="dx", shape=(4, 64)),
                             Config(check="dx", shape=(4, 64), seed=1)))
    assert _numba_fd.READY == {torch.float64}
    assert fd.reduce.native_worth(one, torch.device("cpu"), torch.float64)


def test_the_c_pass_serves_every_cpu_check_where_it_builds(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """With a C compiler on this machine the C pass builds, proves its bits and takes every
    CPU check, a one-row one too; not on another device, under a forced backend or with
    GRADCHECK_BI_CC=0; and preload has no start to pay for it."""
    if shutil.which("cc") is None:
        pytest.skip("no cc here")
    monkeypatch.delenv("GRADCHECK_BI_CC", raising=False)
    assert _c_fd.library() is not None, "cc is here but the C level sums did not build"
    cpu = torch.device("cpu")
    assert fd.reduce.native_worth(1, cpu) and fd.reduce.native_worth(1, cpu, torch.float32)
    assert not fd.reduce.native_worth(1, torch.device("meta"))
    assert fd.reduce.preload({torch.float64: fd.reduce.NATIVE_MIN_ELEMENTS}) == []
    # a run of one small CPU dx check loads and verifies it before its workers fork
    from gradcheck_bi.sweep import Sweep
    from gradcheck_bi.upfront import preload_cpu_sums
    from gradcheck_bi.vocab import Config

    fd.reduce.c_gives_torch_bits.cache_clear()
    preload_cpu_sums([(None, Config(check="dx", shape=(4, 64), device="cuda"), Sweep())])
    assert fd.reduce.c_gives_torch_bits.cache_info().currsize == 0  # no CPU work: nothing
    preload_cpu_sums([(None, Config(check="dx", shape=(4, 64)), Sweep())])
    assert fd.reduce.c_gives_torch_bits.cache_info().currsize == 1
    assert "C one-pass" in fd.reduce.described()["cpu"]
    from gradcheck_bi.sums.reduction import use_backend

    with use_backend("torch"):
        assert not fd.reduce.c_ready()
    monkeypatch.setenv("GRADCHECK_BI_CC", "0")
    assert not fd.reduce.c_ready() and _c_fd.built() is None
    assert "C one-pass" not in fd.reduce.described()["cpu"]


def test_a_c_build_that_fails_or_differs_leaves_the_path_off(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pytest.TempPathFactory) -> None:
    """No compiler or a compiler that fails: ``library()`` is None; a library whose sums
    differ from the torch path's: not used (``c_ready``). The sums then run in numba or
    torch ops."""
    monkeypatch.delenv("GRADCHECK_BI_CC", raising=False)
    monkeypatch.setenv("GRADCHECK_BI_CACHE", str(tmp_path))
    try:
        for compiler in ("no-such-compiler-here", "false"):
            monkeypatch.setenv("CC", compiler)
            _c_fd.library.cache_clear()
            fd.reduce.c_gives_torch_bits.cache_clear()
            assert _c_fd.library() is None and _c_fd.built() is None
            assert not fd.reduce.c_ready()
        # the failed build is remembered: not tried again with those flags and compiler
        assert list(tmp_path.glob("*.failed")), "no .failed marker for the failed build"
        calls = []
        monkeypatch.setattr(_c_fd.subprocess, "run", lambda *a, **k: calls.append(a))
        _c_fd.library.cache_clear()
        assert _c_fd.library() is None and calls == []
        monkeypatch.undo()  # subprocess.run and the environment back
        monkeypatch.delenv("GRADCHECK_BI_CC", raising=False)
        monkeypatch.setenv("GRADCHECK_BI_CACHE", str(tmp_path))
        if shutil.which("cc") is None:
            return
        monkeypatch.setenv("CC", "cc")
        _c_fd.library.cache_clear()
        fd.reduce.c_gives_torch_bits.cache_clear()
        assert fd.reduce.c_ready() and _c_fd.built() is not None
        good = _c_fd.level_sums
        monkeypatch.setattr(_c_fd, "level_sums", lambda *a, **k: good(*a, **k).mul_(1 + 2.0**-50))
        fd.reduce.c_gives_torch_bits.cache_clear()
        assert not fd.reduce.c_ready()  # built, then refused by its bits
        assert "C one-pass" not in fd.reduce.described()["cpu"]  # and not reported as used
        assert not fd.reduce.native_worth(1, torch.device("cpu"))
    finally:
        _c_fd.library.cache_clear()
        fd.reduce.c_gives_torch_bits.cache_clear()
