"""CPU threads for the finite-difference loop, chosen by the work in one chunk.

The loop runs a few dozen torch ops per chunk. Below ``PARALLEL_MIN_ELEMENTS`` perturbed
elements per chunk an op lasts a few microseconds, and handing it to a second thread costs
more than it saves; above it the ops stream megabytes and every idle core helps. "Idle" is
what the load average leaves: on a shared machine, threads that the OS keeps descheduling
make every op wait for the slowest one (measured in docs/benchmarks.md, "Threads").

The thread count never changes a bit of the result: every op of the loop is elementwise
or a fixed-order sum built from elementwise ops.

``fix_threads(n)`` pins the loop to ``n`` threads; ``fix_threads(None)`` restores the
choice by work size. :func:`apply_policy` is the whole policy, for the CLI (``--threads``),
its worker processes and the API (``check(threads=…)``, inside :func:`policy`, which gives
the caller its own settings back): ``n`` (else ``OMP_NUM_THREADS``) pins every op to ``n``;
with neither, the loop chooses and everything else runs on one thread.

>>> threads_for(1 << 10)
1
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence

import torch

# Measured (docs/benchmarks.md, "Threads"): the crossover where a second thread starts to
# pay for the chunk's ops.
PARALLEL_MIN_ELEMENTS = 1 << 18
# The 1-minute load average still counts this process's own threads for about a minute after
# a parallel loop: for that long, as many units of it are ours (else a check right after a
# parallel one took our own recent work for someone else's and ran on one thread).
OWN_LOAD_MEMORY_S = 60.0
# A loop of like steps on several threads times one step on one thread and one on all every
# this many steps, and keeps the faster (:func:`run_steps`).
PROBE_EVERY = 16
# A probe keeps all threads unless its step on them took this many times the one-thread
# step (one noisy pair of steps must not undo the threads' gain; busy cores cost 2-10x).
PROBE_MARGIN = 1.25
# A step on several threads slower than this many one-thread steps means the cores are busy
# now: the rest of the round runs on one thread.
BUSY_FACTOR = 2.0
_fixed: int | None = None
_own: tuple[float, int] = (0.0, 1)  # (until when, threads) of our last parallel loop
# GNU OpenMP's thread pool does not survive fork(): a forked child of a process that ran a
# parallel region on two or more threads waits forever in its own first one (measured:
# torch 2.13, libgomp; a child that sets one thread first is fine). So a forked worker runs
# torch on several threads only where this process is known never to have had a pool: the
# command line says so at its start (``_serial_so_far``, before any torch op) and no native
# thread has appeared since this module was imported (a pool's threads are native); any
# doubt — the API inside a user's process, a CUDA driver's threads — caps a forked worker
# at ``_ceiling`` = 1 thread.
_serial_so_far = False
_ceiling: int | None = None


def fix_threads(n: int | None) -> None:
    """Pin the finite-difference loop to ``n`` CPU threads (``None``: choose by work size)."""
    global _fixed
    if n is not None and n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    _fixed = n


def apply_policy(threads: int | None) -> None:
    """``threads`` (else ``OMP_NUM_THREADS``) for every torch op and the loop; with neither,
    one thread outside the loop and the loop's choice by work size."""
    pin_policy(threads)
    _set_torch_threads(_fixed or 1)


def pin_policy(threads: int | None) -> None:
    """Record :func:`apply_policy`'s pin (``threads``, else ``OMP_NUM_THREADS``) without
    touching torch's thread count: for a process that hands its measurements to workers
    (each applies ``apply_policy(fixed_threads())``) and stays on one thread itself."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    env = os.environ.get("OMP_NUM_THREADS", "")
    if threads is None and env.isdigit() and int(env) >= 1:
        threads = int(env)
    fix_threads(threads)


def start_serial(fresh: bool) -> None:
    """At the command line's start, before any torch op: torch on one thread here; with
    ``fresh`` (the program's own process, not a function called inside another one) this
    process is taken never to have run a parallel region (:func:`fork_keeps_threads`)."""
    global _serial_so_far
    torch.set_num_threads(1)
    _serial_so_far = fresh and _native_threads() <= _NATIVE_AT_IMPORT


def _native_threads() -> int:
    """This process's threads that Python did not start (a thread pool's, a driver's)."""
    import threading

    try:
        return len(os.listdir("/proc/self/task")) - threading.active_count()
    except OSError:  # no /proc: unknown, so as many as can be
        return 1 << 30


_NATIVE_AT_IMPORT = _native_threads()  # torch just imported: no pool yet in a fresh process


def fork_keeps_threads() -> bool:
    """Whether a child forked now may run torch on several threads (see ``_serial_so_far``)."""
    return (_serial_so_far and torch.get_num_threads() == 1
            and _native_threads() <= _NATIVE_AT_IMPORT)


def limit_threads(n: int | None) -> None:
    """Cap torch's thread count in this process at ``n`` (``None``: no cap)."""
    global _ceiling
    _ceiling = n
    if n is not None and torch.get_num_threads() > n:
        torch.set_num_threads(n)


def _set_torch_threads(n: int) -> None:
    global _serial_so_far
    n = min(n, _ceiling or n)
    if n > 1:
        _serial_so_far = False
    torch.set_num_threads(n)


@contextlib.contextmanager
def policy(threads: int | None) -> Iterator[None]:
    """:func:`apply_policy` inside the block; torch's thread count and the loop's pin as
    they were after it (an API caller's own settings survive a check)."""
    before = (torch.get_num_threads(), _fixed)
    apply_policy(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        fix_threads(before[1])


def fixed_threads() -> int | None:
    """The number :func:`fix_threads` pinned, or ``None``."""
    return _fixed


def usable_cores() -> int:
    """Cores this process may run on that the 1-minute load average leaves idle (≥ 1).

    The load average counts this process too: one unit of it is ours, or as many as the
    threads of our last parallel loop if that ran within ``OWN_LOAD_MEMORY_S``.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        until, threads = _own
        ours = threads if time.monotonic() < until else 1
        busy = max(0.0, os.getloadavg()[0] - ours)
    except (AttributeError, OSError):
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


def threads_for(chunk_elements: int) -> int:
    """Threads for a chunk of ``chunk_elements`` perturbed elements: the pinned number, else
    one below ``PARALLEL_MIN_ELEMENTS``, else every usable core."""
    wanted = _wanted(chunk_elements)
    return wanted if _ceiling is None else min(wanted, _ceiling)


def _wanted(chunk_elements: int) -> int:
    if _fixed is not None:
        return _fixed
    if chunk_elements < PARALLEL_MIN_ELEMENTS:
        return 1
    return usable_cores()


def _count_as_ours(n: int) -> None:
    """Remember that this process now runs ``n`` threads (see
    :func:`usable_cores`)."""
    global _own
    if n > 1:
        _own = (time.monotonic() + OWN_LOAD_MEMORY_S, n)


@contextlib.contextmanager
def cpu_threads(device: torch.device, chunk_elements: int) -> Iterator[int]:
    """Run the body with :func:`threads_for` torch threads on CPU; restore them after."""
    if device.type != "cpu":
        yield torch.get_num_threads()
        return
    previous, wanted = torch.get_num_threads(), threads_for(chunk_elements)
    _count_as_ours(wanted)
    if wanted != previous:
        _set_torch_threads(wanted)
    try:
        yield wanted
    finally:
        if wanted != previous:
            torch.set_num_threads(previous)


def run_steps(steps: Sequence[Callable[[], None]], device: torch.device) -> None:
    """Run like steps (the chunks of one loop) on torch's thread count, or on one thread
    while one proves faster.

    The load average lags: cores idle when a loop starts can be taken by another process a
    second later, and then every op on two threads waits for the descheduled one (on 2
    shared cores, (8, 1024) checks ran up to 10× slower on two threads than on one:
    docs/benchmarks.md). So one step runs on one thread and the next on all; the
    faster setting — all threads unless :data:`PROBE_MARGIN` times slower — runs until the
    next such probe (:data:`PROBE_EVERY` steps on; twice as far each time one thread wins,
    up to 8×), and a step on all threads slower than :data:`BUSY_FACTOR` one-thread steps
    falls back to one at once. Only the speed changes: every op of the loop gives the same
    bits on any number of threads. Pinned threads (``--threads``), one thread and non-CPU
    loops run the steps as they are.
    """
    wanted = torch.get_num_threads()
    if device.type != "cpu" or wanted < 2 or _fixed is not None or len(steps) < 4:
        for step in steps:
            step()
        return
    current, one, every, probe = wanted, None, PROBE_EVERY, 1  # the first step warms up
    try:
        for i, step in enumerate(steps):
            n = 1 if i == probe else wanted if i == probe + 1 else current
            _set_torch_threads(n)
            t0 = time.perf_counter()
            step()
            dt = time.perf_counter() - t0
            if i == probe:
                one = dt
            elif i == probe + 1:
                current = wanted if one is None or dt <= PROBE_MARGIN * one else 1
                every = PROBE_EVERY if current > 1 else min(2 * every, 8 * PROBE_EVERY)
                probe += every
            elif n > 1 and one is not None and dt > BUSY_FACTOR * one:
                current = 1
    finally:
        torch.set_num_threads(wanted)
