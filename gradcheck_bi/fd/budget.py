"""Memory for the finite-difference checks: the budget, the chunk it allows, the refusal.

The default budget is a quarter of the host memory free when it is first asked for (from
``os.sysconf``; 1 GiB where that cannot be read), computed once per process and never at
import. ``parse_bytes`` is the one reader of sizes such as ``512M`` or ``2G``.

>>> parse_bytes("512M"), parse_bytes("2GiB"), parse_bytes("4096")
(536870912, 2147483648, 4096)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import os
import time
from typing import Any

import torch

from gradcheck_bi.fd.stencil import Stencil

# Bytes held per perturbed element in one chunk: the perturbed input, the forward's
# intermediates (a handful of compute-dtype temporaries) and our fp64 differences.
BYTES_PER_ELEMENT = {torch.float64: 8 * 8, torch.float32: 4 * 8 + 8}
# Bytes per element of x held for the whole check, outside the chunks: x, g, y, the analytic
# dx and w-grad copies in the input dtype, and fp64 copies of g, y0 (the unperturbed output),
# the estimate, its floor and the error.
FIXED_BYTES_PER_ELEMENT = 6 * 8 + 8 * 8
# On CPU a chunk is sized to stay in cache, not to fill the budget: measured on the
# benchmark machine (docs/benchmarks.md), elementwise ops on 4 MiB tensors run ~10x faster
# than on 32 MiB ones, and fresh large allocations cost page faults on every call.
CPU_CHUNK_ELEMENTS = 1 << 19
MEMORY_FRACTION = 0.25
_MIN_DEFAULT_MEMORY = 256 << 20
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


# glibc's malloc hands blocks over its mmap threshold straight back to the kernel when freed
# and trims the heap top above its trim threshold, so every chunk-sized tensor of the loop
# (the forward's output and temporaries, a few MiB each) came back as fresh zero pages:
# 411 k page faults in one (16, 4096) fp64 CPU check, 1.3x its time (docs/benchmarks.md);
# ~20 k in an (8, 1024) one, a tenth of its CPU time. CPU checks therefore keep freed chunks
# in the heap (glibc only; see keep_freed_memory).
HEAP_MMAP_THRESHOLD = 64 << 20
HEAP_TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Free heap below which release_freed_memory leaves the heap as it is (a fork copies its
# page tables in ~1 ms).
RELEASE_AT_LEAST = 64 << 20


_kept_up_to = 0  # the largest block keep_freed_memory has asked glibc to keep


def keep_freed_memory(block: int = HEAP_MMAP_THRESHOLD) -> bool:
    """Make glibc's malloc keep freed blocks up to ``block`` bytes (at least 64 MiB, at most
    1 GiB) for reuse, and up to four of them (at least 256 MiB) idle at the heap top,
    instead of returning them to the OS: reused memory costs no page faults. A
    cross-entropy's forward at (512, 32000) fp64 makes a 128 MiB temporary each call: 32 k
    page faults, a third of its CPU time.

    Process-wide and for the rest of the process (glibc cannot restore its adaptive
    defaults; a later call only raises the thresholds); called by the finite-difference
    loops of the CPU checks. Returns whether it took effect (False off glibc).
    """
    global _kept_up_to
    want = min(max(block, HEAP_MMAP_THRESHOLD), 1 << 30)
    if want <= _kept_up_to:
        return True
    mallopt = _mallopt()
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim = min(max(4 * want, HEAP_TRIM_THRESHOLD), (1 << 31) - 1)
    if mallopt(_M_MMAP_THRESHOLD, want) and mallopt(_M_TRIM_THRESHOLD, trim):
        _kept_up_to = want
        return True
    return False


def release_freed_memory(least: int = RELEASE_AT_LEAST) -> bool:
    """Give the free pages of this process's heap back to the OS (glibc's ``malloc_trim``)
    when it holds at least ``least`` bytes free; returns whether it did.

    For the process that forks the CPU worker (:mod:`gradcheck_bi.workers`): a fork copies
    the page tables of every page mapped, free or not. After ``torch.autograd.gradcheck``
    of (8, 1024) fp64 the caller's heap held ~1.1 GiB freed but mapped (RSS 1.7 GiB), and
    each fork took ~110 ms against ~15 ms before it, half an (8, 1024) check. Trimming costs
    more than one such fork (~0.3 ms per MiB against ~0.07), so
    :func:`gradcheck_bi.workers.measure` calls it while the worker it forked measures, not
    before the fork; every later fork is cheap."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return False
    libc.mallinfo2.restype = _MallInfo2
    if libc.mallinfo2().fordblks < least:
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.malloc_trim(0)
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallopt() -> Any:
    """glibc's ``mallopt`` (``None`` off glibc)."""
    libc = _libc()
    return None if libc is None else getattr(libc, "mallopt", None)


def _libc() -> Any:
    """glibc (``None`` off glibc). By its soname first: ``find_library`` runs ``ldconfig``
    in a subprocess, ~9 ms, paid again by every worker forked for a check."""
    for name in ("libc.so.6", None):
        try:
            libc = ctypes.CDLL(name or ctypes.util.find_library("c"))
        except (OSError, TypeError):
            continue
        if hasattr(libc, "mallopt"):
            return libc
    return None


class MemoryBudgetError(ValueError):
    """A check cannot run inside the memory budget; the message carries the estimate."""


def parse_bytes(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"1.5GiB"``, ``"1048576"`` → bytes (> 0); ``ValueError`` else."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        n = int(float(t[:-1]) * _UNITS[t[-1]]) if t and t[-1] in _UNITS else int(t)
    except (ValueError, KeyError):
        raise ValueError(f"{text!r} is not a size; expected e.g. 512M or 2G") from None
    if n <= 0:
        raise ValueError(f"{text!r}: a size must be > 0")
    return n


def _free_host_memory() -> int | None:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


@functools.cache
def default_max_memory() -> int:
    """``MEMORY_FRACTION`` of the host memory free now (1 GiB if it cannot be read)."""
    free = _free_host_memory()
    if free is None:
        return 1 << 30
    return max(_MIN_DEFAULT_MEMORY, int(free * MEMORY_FRACTION))


def budget(max_memory: int | None) -> int:
    """The budget in bytes: ``max_memory``, or the default when it is ``None``."""
    return default_max_memory() if max_memory is None else max_memory


def _bytes_per_element(dtype: torch.dtype) -> int:
    return BYTES_PER_ELEMENT.get(dtype, 64)


# The row counts of the batches a check feeds the kernel beyond the point's own shape: 1 (a
# row alone), 3 (a batch that is not a multiple of any tile) and the steps of a ladder,
# ``8 · 8^k``. The batch invariance check places its probe rows in 3, 8, 64, 512 and 4096
# rows; off the CPU every finite-difference chunk is padded to a ladder step
# (:func:`batch_rows`), so chunks land on the batch sizes and a kernel that compiles or
# autotunes per shape reuses what the batches compiled. On CPU nothing compiles per shape
# and a chunk's size is set by the cache, so there is no ladder: every chunk of a check is
# padded to the size of its first (docs/benchmarks.md, "Shapes a run feeds the kernel").
LADDER = 8
MIN_BATCH = 8
# What a chunk's call costs beyond its rows (Python, the contract checks, a launch), counted
# as this many elements when choosing between two batch sizes: a judgement, not a
# measurement; it only keeps a tiny check from being split into many calls.
CALL_ELEMENTS = 1 << 16


def ladder_base(device: torch.device | str) -> int | None:
    """The ladder's base (:data:`LADDER`) off the CPU; ``None`` (no ladder) on CPU."""
    return None if torch.device(device).type == "cpu" else LADDER


def batch_rows(rows: int, base: int | None = LADDER) -> int:
    """The smallest ladder step ``8 · base^k`` holding ``rows``: a chunk's padded row count
    (``rows`` itself without a ladder).

    >>> batch_rows(6), batch_rows(480), batch_rows(513), batch_rows(24576), batch_rows(480, None)
    (8, 512, 4096, 32768, 480)
    """
    if base is None:
        return rows
    n = MIN_BATCH
    while n < rows:
        n *= base
    return n


def chunk_shape(n_rows: int, n_cols: int, stencil: Stencil, dtype: torch.dtype,
                max_memory: int | None, device: torch.device | str = "cpu") -> tuple[int, int]:
    """``(columns, rows)`` perturbed in one batched forward call.

    A chunk holds ``stencil.points × columns × rows`` perturbed rows of length ``n_cols``,
    padded with unperturbed rows to :func:`batch_rows` of that. Its size is capped by what
    ``max_memory`` leaves after the arrays held for the whole check
    (:func:`memory_estimate`) and, on CPU, by ``CPU_CHUNK_ELEMENTS`` (cache); the padded
    batch is a ladder step under that cap (:func:`ladder_chunk`).
    Any chunk gives the same bits for a batch-invariant kernel, so this is purely a
    speed/memory choice — and one of how many shapes the kernel is fed.
    """
    spare = budget(max_memory) - FIXED_BYTES_PER_ELEMENT * n_rows * n_cols
    room = max(1, spare // _bytes_per_element(dtype))
    dev = torch.device(device)
    if dev.type == "cpu":
        room = min(room, CPU_CHUNK_ELEMENTS)
    elif dev.type == "cuda" and torch.cuda.is_available():  # the budget is host-derived
        room = min(room, cuda_room(dev, _bytes_per_element(dtype)))
    return ladder_chunk(room // n_cols, n_rows, n_cols, stencil.points, ladder_base(dev))


def ladder_chunk(room_rows: int, n_rows: int, n_cols: int, points: int,
                 base: int | None = LADDER) -> tuple[int, int]:
    """``(columns, rows)`` of a chunk padded to a ladder step (:func:`batch_rows`) within
    ``room_rows`` (8 at least: :func:`memory_estimate` counts them): of the largest step
    the check fills and the one that holds the whole check, the cheaper — rows fed to the
    kernel in all (padding included) plus :data:`CALL_ELEMENTS` per call. Without a ladder
    (``base=None``) the chunk fills ``room_rows``. Columns (or, when one column of every
    row does not fit, rows) are split evenly over the chunks.

    >>> ladder_chunk(1 << 20, 16, 256, 6)  # (2, 8, 256) with a GPU's room: 7 calls of 4096
    (37, 16)
    >>> ladder_chunk(2048, 16, 256, 6, base=None)  # on CPU: 13 calls of 1920 rows
    (20, 16)
    """
    total = points * n_cols * n_rows
    per_call = CALL_ELEMENTS // n_cols
    if base is None:
        steps = {max(points, min(room_rows, total))}
    else:
        most = MIN_BATCH
        while most * base <= min(room_rows, total):
            most *= base
        steps = {most, batch_rows(total, base)}
    best: tuple[int, int, tuple[int, int]] | None = None
    for batch in steps:
        if batch > max(room_rows, MIN_BATCH):
            continue
        if points * n_rows > batch:  # one column of every row does not fit: split the rows
            shape = 1, _even(n_rows, max(1, batch // points))
        else:
            shape = _even(n_cols, batch // (points * n_rows)), n_rows
        calls = -(-n_cols // shape[0]) * -(-n_rows // shape[1])
        if best is None or (calls * (batch + per_call), calls) < best[:2]:
            best = calls * (batch + per_call), calls, shape
    assert best is not None
    return best[2]


def _even(n: int, most: int) -> int:
    """The size of ``ceil(n / most)`` near-equal parts of ``n``."""
    parts = -(-n // most)
    return -(-n // parts)


# The driver's free memory plus what torch's caching allocator holds, per device: the
# allocator's growth moves memory from one to the other, so the sum stays until another
# process takes or frees memory. Asking the driver costs ~1 ms, host time a GPU waits out
# before a check's first call (once a check on an H100, docs/benchmarks.md); the sum is
# kept this many seconds. Another process can take memory between a reading and the
# allocation it sizes however fresh the reading is.
DRIVER_READ_S = 2.0
_driver_reads: dict[int, tuple[float, int]] = {}


def cuda_free(dev: torch.device) -> int:
    """Bytes this process could take on ``dev``: what the driver reports free plus what
    torch's caching allocator holds that no tensor uses, so the answer does not depend on
    what earlier checks in this process left cached (the driver's figure read at most
    :data:`DRIVER_READ_S` seconds ago)."""
    # "cuda" is whichever device is current: kept under its index (CUDA runs here already)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    now = time.monotonic()
    kept = _driver_reads.get(index)
    if kept is None or now - kept[0] > DRIVER_READ_S:
        free = int(torch.cuda.mem_get_info(index)[0])
        kept = (now, free + int(torch.cuda.memory_reserved(index)))
        _driver_reads[index] = kept
    return kept[1] - int(torch.cuda.memory_allocated(index))


def cuda_room(dev: torch.device, bytes_per_element: int) -> int:
    """Elements of ``bytes_per_element`` that ``MEMORY_FRACTION`` of ``dev``'s free memory
    holds (at least 1)."""
    return max(1, int(cuda_free(dev) * MEMORY_FRACTION) // bytes_per_element)


def memory_estimate(n_rows: int, n_cols: int, stencil: Stencil, dtype: torch.dtype) -> int:
    """Bytes a finite-difference check of an ``(n_rows, n_cols)`` input needs at least.

    The floor under any memory budget: the arrays held for the whole check plus the
    smallest chunk (one perturbed column of one row, at every stencil point, padded to
    :func:`batch_rows`).
    """
    fixed = FIXED_BYTES_PER_ELEMENT * n_rows * n_cols
    return fixed + MIN_BATCH * n_cols * _bytes_per_element(dtype)


def check_budget(shape: tuple[int, ...], stencil: Stencil, dtype: torch.dtype,
                 max_memory: int | None) -> None:
    """Raise :class:`MemoryBudgetError` (with the estimate) if ``shape`` cannot fit."""
    n_cols = shape[-1] if shape else 1
    n_rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    need = memory_estimate(n_rows, n_cols, stencil, dtype)
    if need > budget(max_memory):
        raise over_budget(shape, dtype, need, max_memory)


def over_budget(shape: tuple[int, ...], dtype: torch.dtype, need: int,
                max_memory: int | None) -> MemoryBudgetError:
    """The refusal of a check of ``shape`` that needs ``need`` bytes, with the estimate."""
    return MemoryBudgetError(
        f"a finite-difference check of shape {tuple(shape)} in {str(dtype).split('.')[-1]} "
        f"needs at least {format_bytes(need)}, over the memory budget of "
        f"{format_bytes(budget(max_memory))}; raise --max-memory or check a smaller shape")


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
