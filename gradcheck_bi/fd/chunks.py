"""The chunk loop of the full dx estimate: one batched forward and its level sums per chunk,
here or spread over processes.

A chunk is ``points × columns × rows`` copies of a block of rows, each perturbed in one
column, padded with unperturbed copies to a ladder step
(:func:`~gradcheck_bi.fd.budget.batch_rows`: every chunk of a check, the last too, is one
shape for the kernel, whose padding rows' outputs are ignored); its level sums land in their
own slice of ``sums``. Chunks are independent and a
batch-invariant kernel gives each the same bits wherever it runs, so a large CPU check can
hand chunks to worker processes (:func:`run_chunks`): each process runs the kernel on one
torch thread, all take the next chunk from one shared counter, and the sums are written
into shared memory. Processes, not threads: a kernel with a global workspace stays correct,
and no OpenMP pool fights another for the cores (docs/benchmarks.md, "Why threads in one
process could not do it").
A chunk a worker did not finish (it failed, died or was late) is computed here.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gradcheck_bi.fd.budget import batch_rows, keep_freed_memory, ladder_base
from gradcheck_bi.fd.reduce import sums_into
from gradcheck_bi.fd.threads import run_steps
from gradcheck_bi.kernels.reduction import forced_backend, use_backend

Forward = Callable[[torch.Tensor], torch.Tensor]


class ChunkLoop:
    """Everything a process needs to compute any chunk: ``run(r0, c0)`` fills
    ``sums[:, c0 : c0 + n_c, r0 : r0 + n_r]``. ``delta[p, r]``: the step of stencil point
    ``p`` for row ``r``. Every forward call gets ``batch`` rows."""

    def __init__(self, forward: Forward, x2: torch.Tensor, g2: torch.Tensor, y0: torch.Tensor,
                 delta: torch.Tensor, chunk: tuple[int, int], sums: torch.Tensor,
                 native: bool) -> None:
        self.forward, self.x2, self.g2, self.y0 = forward, x2, g2, y0
        self.delta, self.chunk, self.sums, self.native = delta, chunk, sums, native
        self.batch = batch_rows(delta.shape[0] * chunk[0] * chunk[1], ladder_base(x2.device))
        self._blocks: dict[int, tuple[torch.Tensor, Any]] = {}

    def tasks(self) -> list[tuple[int, int]]:
        """Every chunk's ``(r0, c0)``, row block by row block."""
        (n_rows, n_cols), (n_c, n_r) = self.x2.shape, self.chunk
        return [(r0, c0) for r0 in range(0, n_rows, n_r) for c0 in range(0, n_cols, n_c)]

    def _block(self, r0: int) -> tuple[torch.Tensor, Any]:
        """The row block's buffer (``batch`` rows: unperturbed copies of its rows, repeated;
        any prefix is whole rows) and its sums function, made once per block. Only the current
        block's are kept (chunks come block by block): a buffer is as large as the memory
        budget lets a chunk be."""
        if r0 not in self._blocks:
            self._blocks.clear()
            n_r_max = self.chunk[1]
            rows = self.x2[r0 : r0 + n_r_max]
            self._blocks[r0] = (
                rows.repeat(-(-self.batch // rows.shape[0]), 1)[: self.batch],
                sums_into(self.y0[r0 : r0 + n_r_max], self.g2[r0 : r0 + n_r_max],
                          native=self.native),
            )
        return self._blocks[r0]

    def run(self, r0: int, c0: int) -> None:
        n_rows, n_cols = self.x2.shape
        n_c_max, n_r_max = self.chunk
        points = self.delta.shape[0]
        buf, reduce_into = self._block(r0)
        n_r, n_c = min(n_r_max, n_rows - r0), min(n_c_max, n_cols - c0)
        xs = buf[: points * n_c * n_r].view(points, n_c, n_r, n_cols)
        # The perturbed elements xs[p, c, r, c0 + c] as one strided view (a diagonal across
        # column copy c and the row's columns): plain copies, no index tensors.
        hit = xs.as_strided((points, n_c, n_r), (xs.stride(0), xs.stride(1) + 1, xs.stride(2)),
                            xs.storage_offset() + c0)
        base = self.x2[r0 : r0 + n_r, c0 : c0 + n_c].T  # (n_c, n_r): x[r, c0 + c]
        hit.copy_(base[None] + self.delta[:, None, r0 : r0 + n_r])
        with torch.no_grad():
            ys = self.forward(buf)  # the perturbed rows, then the padding's
        if tuple(ys.shape) != tuple(buf.shape):
            raise ValueError(f"forward returned shape {tuple(ys.shape)} for a batch of "
                             f"{tuple(buf.shape)}")
        reduce_into(ys[: points * n_c * n_r].reshape(points, n_c, n_r, n_cols),
                    self.sums[:, c0 : c0 + n_c, r0 : r0 + n_r])
        # Free this chunk's outputs before the next forward allocates its own: the next
        # call then reuses the same (cache-warm) memory.
        del ys
        hit.copy_(base[None].expand(points, n_c, n_r))


def pad_rows(rows: torch.Tensor, batch: int) -> torch.Tensor:
    """``rows`` ``(n, D)`` followed by copies of its own rows up to ``batch`` rows (the
    padding of a chunk: its outputs are ignored)."""
    n = rows.shape[0]
    if n >= batch:
        return rows
    return torch.cat([rows, rows.repeat(-(-(batch - n) // n), 1)[: batch - n]])


def loadable_elsewhere(forward: Forward) -> bool:
    """Whether a fresh process can receive ``forward`` and run it: it pickles, and its kernel
    comes from a module an import finder locates by name (not ``__main__``, not a file our
    loader read under a made-up name)."""
    fn = getattr(forward, "fn", None)
    module = getattr(fn, "__module__", None) or ""
    top = module.split(".")[0]
    if not top or top == "__main__" or not _importable(top):
        return False
    try:
        pickle.dumps(forward)
    except Exception:
        return False
    return True


def _importable(name: str) -> bool:
    """Whether an import system finder (``sys.path``, an editable install's hook) finds
    the top-level module ``name``; ``sys.modules``, where the loader's files live, is not
    asked."""
    for finder in sys.meta_path:
        try:
            if finder.find_spec(name, None) is not None:  # type: ignore[union-attr]
                return True
        except Exception:
            continue
    return False


def run_chunks(loop: ChunkLoop, processes: int = 1,
               worker_forward: Forward | None = None) -> None:
    """Fill ``loop.sums`` for every chunk: here alone, or with ``processes - 1`` spawned
    workers running ``worker_forward`` (``loop.forward`` where :func:`loadable_elsewhere`;
    a test may hand them another)."""
    tasks = loop.tasks()
    if processes < 2 or worker_forward is None or len(tasks) < 2 * processes:
        run_steps([functools.partial(loop.run, r0, c0) for r0, c0 in tasks], loop.x2.device)
        return
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    loop.sums.share_memory_()
    claim, done = ctx.Value("q", 0), ctx.Array("b", len(tasks))
    # Tensors travel as shared-memory handles and the chunk list is rebuilt there, so what
    # is written to a worker's start-up pipe stays far below a pipe's buffer: a worker that
    # dies at start can never leave this process blocked writing to it.
    args = (worker_forward, loop.x2, loop.g2, loop.y0, loop.delta, loop.chunk, loop.sums,
            loop.native, forced_backend(), claim, done)
    workers = [ctx.Process(target=_worker, args=args, daemon=True)
               for _ in range(processes - 1)]
    with main_module_hidden():
        for w in workers:
            w.start()
    slowest = 0.0
    try:
        while (i := _claim(claim)) < len(tasks):
            t = time.perf_counter()
            done[i] = _CLAIMED
            loop.run(*tasks[i])
            done[i], slowest = _DONE, max(slowest, time.perf_counter() - t)
    finally:
        with claim.get_lock():
            claim.value = 1 << 62  # nothing more is handed out
        # A worker mid-chunk needs about one chunk's time to finish it; one that claimed
        # nothing (still starting) is stopped at once.
        deadline = time.perf_counter() + 1.0 + 5 * slowest
        while _CLAIMED in done[:] and time.perf_counter() < deadline:
            time.sleep(0.001)
        for w in workers:
            if w.is_alive():
                w.terminate()
            w.join()
    left = [i for i, state in enumerate(done[:]) if state != _DONE]
    failed = [w.exitcode for w in workers if w.exitcode not in (0, -signal.SIGTERM)]
    if left and failed:  # a worker stopped late by us is no news; one that failed is
        warnings.warn(f"gradcheck-bi: a finite-difference worker stopped (exit codes "
                      f"{failed}) and left {len(left)} chunk(s) unfinished; they ran here",
                      RuntimeWarning, stacklevel=3)
    for i in left:
        loop.run(*tasks[i])


_CLAIMED, _DONE = 1, 2  # states of a chunk in the shared ``done`` array (0: not taken)


def _claim(counter: Any) -> int:
    with counter.get_lock():
        i = int(counter.value)
        counter.value = i + 1
    return i


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start spawned workers without the caller's main script: a spawned process otherwise
    runs it again (as ``__mp_main__``), and a script without a ``__main__`` guard would run
    its whole check a second time. For workers that need nothing from it (their kernel
    comes from an importable module, :func:`loadable_elsewhere`; or, in
    :func:`gradcheck_bi.runner.spread`, from a reference)."""
    main = sys.modules.get("__main__")
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__")
                             if main and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _worker(forward: Forward, x2: torch.Tensor, g2: torch.Tensor, y0: torch.Tensor,
            delta: torch.Tensor, chunk: tuple[int, int], sums: torch.Tensor, native: bool,
            backend: str | None, claim: Any, done: Any) -> None:
    """A spawned worker: one torch thread, the caller's reduction backend, chunks claimed
    until none is left."""
    torch.set_num_threads(1)
    keep_freed_memory()
    try:
        with use_backend(backend):
            loop = ChunkLoop(forward, x2, g2, y0, delta, chunk, sums, native)
            tasks = loop.tasks()
            while (i := _claim(claim)) < len(tasks):
                done[i] = _CLAIMED
                loop.run(*tasks[i])
                done[i] = _DONE
    except BaseException:  # the chunk stays unfinished; the parent computes it and reports
        raise SystemExit(1) from None
