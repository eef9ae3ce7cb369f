"""The per-(row, column) sums of one chunk of perturbed outputs, in one pass where it can.

What a chunk must yield is data: :class:`Sums` says how many levels were evaluated and which
sums the estimate and its noise-floor model read. For ``ys`` of shape ``(2L, ..., R, D)``
(the ``+o`` outputs first), the unperturbed ``y0`` and the upstream ``g`` of ``(R, D)``,
:func:`level_sums` returns, per perturbed row and in this order,

    S_o = Σ_i g_i (y_i(+o h) - y_i(-o h))                       (odd, one per level)
    A_o = Σ_i g_i ((y_i(-o h) - y0_i) + (y_i(+o h) - y0_i))     (even, one per level)

in fp64, each with one fixed summation order per ``D`` (bitwise the same in any chunk, with
any number of threads, run to run). Every difference is taken elementwise in fp64 between
nearby values (exact) before the product with ``g``, so the sums add almost no rounding of
their own to what they measure.

Three paths, one set of bits per path and ``D``:

* where the reduction backend is Triton (CUDA by default) and the chunk is large
  (:data:`FUSED_MIN_ELEMENTS`), one fused kernel reads each perturbed output once and keeps
  every sum in registers
  (:mod:`gradcheck_bi.fd._triton_fd`);
* on CPU (``native=True``, see :func:`native_worth`) one compiled pass, bitwise equal to
  the torch ops: C built by the system's compiler (:mod:`gradcheck_bi.fd._c_fd`) for every
  check where it builds; else numba (:mod:`gradcheck_bi.fd._numba_fd`) for a check large
  enough to repay numba's start, or any check once this process has run it on its dtype;
* elsewhere a few whole-chunk torch ops (no fp64 copy of an fp64 chunk) and one fixed-order
  :func:`~gradcheck_bi.sums.reduction.row_sum`.

>>> import torch
>>> ys = torch.randn(6, 3, 2, 8, dtype=torch.float64)
>>> y0, g = torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
>>> level_sums(ys, y0, g, Sums(levels=3)).shape
torch.Size([6, 3, 2])
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import torch

from gradcheck_bi.sums.reduction import chosen_backend, resolve_backend, row_sum


@dataclass(frozen=True)
class Sums:
    """The sums a chunk yields: ``S_o`` for every level (``odd``), then ``A_o`` (``even``)."""

    levels: int
    odd: bool = True
    even: bool = True

    def __post_init__(self) -> None:
        if self.levels < 1 or not (self.odd or self.even):
            raise ValueError(f"need >= 1 level and odd or even sums, got {self}")

    @property
    def count(self) -> int:
        return self.levels * (int(self.odd) + int(self.even))


# Below this many elements a chunk's sums run as torch ops on CUDA too, unless a backend is
# forced: the fused kernel's first call in a process costs a compile (cold cache) or a load.
# In Liger's default run on an H200 (Triton cache cold) its two first calls took 0.6 and
# 0.25 s; all of that run's sums as torch ops took 0.03 s (docs/benchmarks.md).
# Its one pass pays back only on chunks of tens of millions of elements, as (64, 8192)'s.
FUSED_MIN_ELEMENTS = 1 << 24


def _small_on_cuda(ys: torch.Tensor) -> bool:
    """An automatic backend, a CUDA chunk below :data:`FUSED_MIN_ELEMENTS`: torch ops."""
    return ys.is_cuda and ys.numel() < FUSED_MIN_ELEMENTS and chosen_backend() is None


def _fused(ys: torch.Tensor, sums: Sums) -> bool:
    """The fused kernel runs where ``row_sum`` runs Triton (compiled on CUDA by default, by
    the interpreter on CPU when the backend is forced to ``triton``), except on small CUDA
    chunks (:func:`_small_on_cuda`)."""
    if resolve_backend(ys) != "triton" or _small_on_cuda(ys):
        return False
    from gradcheck_bi.fd import _triton_fd

    return sums.levels <= _triton_fd.MAX_LEVELS


# numba's one-pass sums pay its import and cached-code load (~0.5 s; ~1.2 s to compile per
# dtype the first time) and then save ~0.9 ns per perturbed element over the torch ops
# (docs/benchmarks.md, "One-pass CPU sums"): below 2^29 elements the start costs more.
# The C build (fd._c_fd) has no such start: where it builds, every CPU check uses it.
NATIVE_MIN_ELEMENTS = 1 << 29


def c_ready() -> bool:
    """Whether the CPU sums run in the compiled C pass here: not turned off
    (``GRADCHECK_BI_CC=0``), no reduction backend forced, and the library built (now, once
    per machine, if need be) and giving the torch path's bits (:func:`c_gives_torch_bits`)."""
    if chosen_backend() is not None:
        return False
    from gradcheck_bi.fd import _c_fd

    return _c_fd.allowed() and c_gives_torch_bits()


@functools.cache
def c_gives_torch_bits() -> bool:
    """Whether the C library loads and its sums of a small random chunk (a padded block, two
    levels) are the torch path's, bit for bit, in fp32 and fp64: checked once a process,
    before any check uses it (a compiler that fused or reordered would fail here)."""
    from gradcheck_bi.fd import _c_fd

    if _c_fd.library() is None:
        return False
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        y0 = torch.randn(3, 300, generator=gen, dtype=torch.float64)
        ys = (y0 + 1e-3 * torch.randn(4, 2, 3, 300, generator=gen, dtype=torch.float64)
              ).to(dtype)
        g = torch.randn(3, 300, generator=gen, dtype=torch.float64)
        want = _level_sums_torch(ys, y0, g, Sums(2))
        got = _c_fd.level_sums(ys, y0, g, True, True)
        if not torch.equal(want.view(torch.int64), got.view(torch.int64)):
            return False
    return True


def _numba_allowed() -> bool:
    """``GRADCHECK_BI_NUMBA=0`` turns the one-pass CPU sums off."""
    return os.environ.get("GRADCHECK_BI_NUMBA", "1") != "0"


@functools.cache
def numba_available() -> bool:
    """True when numba imports here and ``GRADCHECK_BI_NUMBA`` is not ``0``."""
    if not _numba_allowed():
        return False
    try:
        import numba  # noqa: F401
    except Exception:
        return False
    return True


def described() -> dict[str, str]:
    """Which sums run on each device, as the JSON's environment says it (numba: installed,
    without importing it; the C pass: built on this machine and giving the torch path's
    bits, without building it)."""
    forced = chosen_backend()
    if forced is not None:
        return {"cpu": forced, "cuda": forced}
    import importlib.util

    from gradcheck_bi.fd import _c_fd

    numba = _numba_allowed() and importlib.util.find_spec("numba") is not None
    big = NATIVE_MIN_ELEMENTS.bit_length() - 1
    loaded = ("; below, once loaded for a dtype (by such a check, or up front for a run whose "
              "checks of that dtype reach it together)")
    cpu = f"torch{f'; numba one-pass from 2^{big} elements{loaded}' if numba else ''}"
    if _c_fd.built() is not None and c_gives_torch_bits():  # built: no compile here
        cpu = "C one-pass (built here by the system's compiler), every chunk"
    return {"cpu": cpu,
            "cuda": f"triton (compiled) from 2^{FUSED_MIN_ELEMENTS.bit_length() - 1} "
                    "elements per chunk; torch below"}


def native_worth(perturbed_elements: int, device: torch.device,
                 dtype: torch.dtype | None = None) -> bool:
    """Whether a CPU check that reduces ``perturbed_elements`` in all should use the
    compiled one-pass sums: the C pass wherever it is ready (:func:`c_ready`); else numba
    importable, and enough work to repay its start — or, for outputs of ``dtype``, that
    start already paid in this process (same bits either way)."""
    if device.type != "cpu":
        return False
    if c_ready():
        return True
    if perturbed_elements >= NATIVE_MIN_ELEMENTS:
        return numba_available()
    return dtype is not None and native_loaded(dtype)


def preload(work: dict[torch.dtype, int]) -> list[torch.dtype]:
    """Pay numba's start now for every dtype whose CPU checks ahead reduce at least
    ``NATIVE_MIN_ELEMENTS`` perturbed elements in all (``work``: dtype → elements), by
    running the compiled sums once on a one-element chunk: every check of those dtypes then
    uses them (:func:`native_loaded`). The per-check rule of :func:`native_worth`, applied
    to a whole run of checks each too small to repay the start alone. Where the C pass
    serves every check (:func:`c_ready`) there is nothing to repay: it is loaded and
    verified here instead (~3 ms), for any such work, so that the workers forked from this
    process inherit it ready. Returns the dtypes numba was loaded for."""
    work = {dt: n for dt, n in work.items() if n > 0 and dt in (torch.float32, torch.float64)}
    if not work or chosen_backend() is not None or c_ready():
        return []
    due = [dt for dt, n in work.items() if n >= NATIVE_MIN_ELEMENTS]
    if not due or not numba_available():
        return []
    from gradcheck_bi.fd import _numba_fd

    one = torch.zeros(1, 1, dtype=torch.float64)
    for dt in due:
        _numba_fd.level_sums(torch.zeros(2, 1, 1, 1, dtype=dt), one, one, True, True)
    return due


def native_loaded(dtype: torch.dtype) -> bool:
    """Whether this process has already run the compiled sums on outputs of ``dtype`` (and
    no reduction backend is forced: a forced one keeps its own path for such checks)."""
    compiled = sys.modules.get("gradcheck_bi.fd._numba_fd")
    return (compiled is not None and dtype in compiled.READY and _numba_allowed()
            and chosen_backend() is None)


def level_sums(ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor,
               sums: Sums | None = None, *, native: bool = False,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``(sums.count, *ys.shape[1:-1])`` fp64: see the module docstring. ``y0`` and ``g`` are
    ``ys.shape[-2:]`` (shared by every leading index); ``sums`` defaults to odd and even for
    every level. ``native`` asks for the compiled CPU pass where it applies (same bits);
    ``out``, a view of that shape, receives the sums (and is returned)."""
    sums = sums or Sums(ys.shape[0] // 2)
    if ys.shape[0] != 2 * sums.levels:
        raise ValueError(f"{ys.shape[0]} stencil points for {sums.levels} levels")
    if y0.shape != ys.shape[-2:] or g.shape != ys.shape[-2:]:
        raise ValueError(f"y0 {tuple(y0.shape)} and g {tuple(g.shape)} must be the (rows, D) "
                         f"of ys {tuple(ys.shape)}")
    if _fused(ys, sums):
        from gradcheck_bi.fd import _triton_fd

        return _triton_fd.level_sums(ys, y0, g, sums.odd, sums.even, out)
    if native and ys.device.type == "cpu" and ys.dtype in (torch.float32, torch.float64):
        if c_ready():
            from gradcheck_bi.fd import _c_fd

            return _c_fd.level_sums(ys, y0, g, sums.odd, sums.even, out)
        from gradcheck_bi.fd import _numba_fd

        return _numba_fd.level_sums(ys, y0, g, sums.odd, sums.even, out)
    result = _level_sums_torch(ys, y0, g, sums)
    if out is None:
        return result
    out.copy_(result)
    return out


def _level_sums_torch(ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor,
                      sums: Sums) -> torch.Tensor:
    n = sums.levels
    work = torch.empty((sums.count, *ys.shape[1:]), dtype=torch.float64, device=ys.device)
    src = ys if ys.dtype == torch.float64 else ys.to(torch.float64)
    k = 0
    if sums.odd:
        torch.sub(src[:n], src[n:], out=work[:n])  # y(+o) - y(-o)
        k = n
    if sums.even:
        even = work[k : k + n]
        torch.sub(src[n:], y0, out=even)  # y(-o) - y0
        even.add_(torch.sub(src[:n], y0))  # + (y(+o) - y0)
    work.mul_(g)
    return row_sum(work, "torch" if _small_on_cuda(ys) else None)
