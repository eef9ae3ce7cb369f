"""Points measured in worker processes: whatever a kernel does to its process costs one point.

A kernel can end the process that runs it — ``os._exit``, a signal (a read past a block
boundary, the abort of a failed device assert, an out-of-memory kill) — or never return;
measured in the process that writes the report, that ended the run with no report at all
(``sys.exit(0)`` with exit 0: a gate read as green). So this process only hands out the
points and collects the results, and worker processes measure them:

* the CPU points go to one worker **forked** from this process: it inherits the loaded
  kernels (nothing to import again) and starts in milliseconds;
* the CUDA points go to one worker **spawned** per GPU (a CUDA context does not survive
  fork), which loads the kernels by reference once and measures there until it dies —
  with two or more GPUs, this spreads the points over all of them. A kernel handed over as
  an object (the API) cannot be loaded by a fresh process: its CUDA points run here;
* a worker takes one point at a time and sends back its :class:`~gradcheck_bi.vocab.Result`
  (with the warnings it raised); one that dies leaves its point an ``error`` that names how
  it died and what the kernel was running (:mod:`gradcheck_bi.kernels.phase`); a point past
  its sweep's ``timeout`` is an ``error`` and its worker is killed; a CUDA worker whose
  context a point left unusable (an illegal address, a device assert) reports that point
  and stops. A fresh worker takes the next point either way, so every other point runs.

Each point's inputs come from its own seed, so its result does not depend on which process
measured it or what ran there before: the report is the one a single process writes.
"""

from __future__ import annotations

import collections
import faulthandler
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import torch

from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.fd.chunks import main_module_hidden
from gradcheck_bi.gate import expected, judge
from gradcheck_bi.kernels import phase, resolve, trace, watch
from gradcheck_bi.measure import PointMeasurer
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec, Result

Point = tuple[KernelSpec, Config, Sweep]
OnResult = Callable[[Result, int, int], None]
_STOP_WAIT_S = 10.0  # a worker told to stop (all points done) gets this long to exit


class WorkerFailure(RuntimeError):
    """gradcheck-bi's own error inside a worker process (exit 4), with its traceback."""


def references(points: list[Point]) -> list[str | None]:
    """Each point's kernel as a reference a fresh process can load (``None``: an object
    handed to the API, which only this process holds)."""
    return [None if spec.source == "api" else spec.source if spec.source != "bundled"
            else spec.name for spec, _, _ in points]


def measure(points: list[Point], on_result: OnResult | None = None,
            gpus: list[str] | None = None, cpu_start: str = "fork") -> list[Result]:
    """Measure every point in worker processes; the results in the order of ``points``.

    ``gpus``: the devices of the CUDA workers (default: one, on the current GPU);
    ``cpu_start``: ``"fork"`` or ``"spawn"`` (where fork is missing) for the CPU worker."""
    refs = references(points)
    lanes = {"cpu": _Lane("cpu", cpu_start, [None]),
             "cuda": _Lane("cuda", "spawn", list(gpus) if gpus else [None])}
    queue: dict[str, collections.deque[int]] = {k: collections.deque() for k in (*lanes, "here")}
    gpu = torch.cuda.is_available()
    for i, (_, cfg, _) in enumerate(points):
        kind = "cuda" if cfg.device.startswith("cuda") else "cpu"
        spawned = lanes[kind].start == "spawn"
        # No GPU: a CUDA point is "unsupported here" at once; no worker needed to say so.
        local = (spawned and refs[i] is None) or (kind == "cuda" and not gpu)
        queue["here" if local else kind].append(i)
    results: list[Result | None] = [None] * len(points)
    count = 0

    def record(i: int, result: Result) -> None:
        nonlocal count
        results[i], count = result, count + 1
        if on_result is not None:
            on_result(result, count, len(points))

    here = PointMeasurer()
    tasks = [(ref, cfg, sweep) for ref, (_, cfg, sweep) in zip(refs, points, strict=True)]
    running: list[_Worker] = []
    try:
        while count < len(points):
            for kind, lane in lanes.items():  # every idle worker (or free slot) gets a point
                for slot in lane.slots():
                    if not queue[kind]:
                        break
                    worker = lane.worker(slot, points, tasks)
                    if worker not in running:
                        running.append(worker)
                    worker.give(queue[kind].popleft(), points)
            if queue["here"]:  # what no worker can load is measured here, between polls
                i = queue["here"].popleft()
                record(i, here(*points[i]))
            busy = [w for w in running if w.point is not None]
            if busy:
                for worker, message in _next_messages(busy, block=not queue["here"]):
                    _take(worker, message, points, record)
    finally:
        for worker in running:
            worker.stop()
    return [r for r in results if r is not None]


class _Lane:
    """The workers of one device kind: one slot per device (``None``: the default one)."""

    def __init__(self, kind: str, start: str, devices: list[str | None]) -> None:
        self.kind, self.start, self.devices = kind, start, devices
        self.workers: dict[int, _Worker] = {}

    def slots(self) -> list[int]:
        """The slots whose worker is idle, dead or not started yet."""
        return [s for s in range(len(self.devices))
                if s not in self.workers or self.workers[s].point is None]

    def worker(self, slot: int, points: list[Point], tasks: list[Any]) -> _Worker:
        w = self.workers.get(slot)
        if w is None or not w.alive:
            w = self.workers[slot] = _Worker(self, self.devices[slot], points, tasks)
        return w


class _Worker:
    """One worker process, the pipe to it and the point it measures now."""

    def __init__(self, lane: _Lane, device: str | None, points: list[Point],
                 tasks: list[Any]) -> None:
        import multiprocessing as mp

        ctx: Any = mp.get_context(lane.start)
        self.lane, self.device = lane, device
        self.phase = ctx.RawArray("c", phase.SIZE)
        self.conn, theirs = ctx.Pipe()
        forked = lane.start == "fork"
        args = (theirs, self.phase, lane.kind, device, fd_threads.fixed_threads(),
                forked and fd_threads.fork_keeps_threads(), points if forked else None,
                None if forked else tasks)
        self.process = ctx.Process(target=_serve, args=args, daemon=True)
        sys.stdout.flush()  # a forked child must not write this process's buffers again
        sys.stderr.flush()
        with warnings.catch_warnings():  # Python >= 3.12 warns of fork with threads alive
            warnings.simplefilter("ignore", DeprecationWarning)
            if forked:
                self.process.start()
            else:
                with main_module_hidden():
                    self.process.start()
        theirs.close()
        self.point: int | None = None
        self.deadline: float | None = None
        self.alive = True

    def give(self, i: int, points: list[Point]) -> None:
        timeout = points[i][2].timeout
        self.point = i
        self.deadline = time.monotonic() + timeout if timeout else None  # 0: no limit
        phase.clear(self.phase)
        try:
            self.conn.send(i)
        except (BrokenPipeError, OSError):  # died between points: seen on the next poll
            pass

    def stop(self) -> None:
        if self.alive and self.point is None:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(_STOP_WAIT_S)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.alive = False
        self.conn.close()


def _next_messages(busy: list[_Worker], block: bool) -> list[tuple[_Worker, Any]]:
    """What the busy workers sent (``None``: the worker died), waiting up to the nearest
    deadline (not at all when ``block`` is false); a worker past its deadline: ``"late"``."""
    deadlines = [w.deadline for w in busy if w.deadline is not None]
    wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
    ready = wait([w.conn for w in busy], timeout=wait_s if block else 0)
    out: list[tuple[_Worker, Any]] = []
    for w in busy:
        if w.conn in ready:
            try:
                out.append((w, w.conn.recv()))
            except (EOFError, OSError):
                out.append((w, None))
        elif w.deadline is not None and time.monotonic() >= w.deadline:
            out.append((w, "late"))
    return out


def _take(worker: _Worker, message: Any, points: list[Point],
          record: Callable[[int, Result], None]) -> None:
    """Act on one message of a worker: a result, a slow first call, its death or lateness."""
    i = worker.point
    assert i is not None
    if isinstance(message, tuple) and message[0] == "slow":
        listener = watch.listener()
        if listener is not None:
            listener(_Named(message[1]), message[2])
        return
    if isinstance(message, tuple) and message[0] == "result":
        _, result, caught, stopping = message
        for text, category in caught:
            warnings.warn(text, category, stacklevel=2)
        worker.point = None
        record(i, result)
        if stopping:  # its CUDA context is unusable: the next point gets a fresh worker
            worker.kill()
        return
    if isinstance(message, tuple) and message[0] == "internal":
        raise WorkerFailure(f"worker on {worker.device or worker.lane.kind}: {message[1]}\n"
                            f"{message[2]}")
    doing = phase.read(worker.phase) or "between calls"
    spec, cfg, sweep = points[i]
    if message == "late":
        worker.kill()
        why = (f"did not finish in {sweep.timeout:g} s: {doing} at shape {cfg.shape} "
               "(the worker was stopped; the other points ran)")
        details = {"timeout_s": sweep.timeout, "phase": doing}
    else:
        worker.kill()
        code = worker.process.exitcode
        how = (f"killed the process with {signal.Signals(-code).name}"
               if code is not None and code < 0 and -code in signal.valid_signals()
               else f"ended the process (exit code {code})")
        why = f"the kernel {how} in {doing} at shape {cfg.shape}"
        details = {"exit": how, "phase": doing}
    worker.point = None
    record(i, judge(spec.name, expected(spec, cfg, sweep), cfg, status="error",
                    message=why, details=details))


class _Named:
    """A slow first call's kernel, by name, for the progress line's listener."""

    def __init__(self, name: str) -> None:
        self.__name__ = name


def _serve(conn: Any, phase_buffer: Any, kind: str, device: str | None, threads: int | None,
           keeps_threads: bool, points: list[Point] | None,
           tasks: list[tuple[str | None, Config, Sweep]] | None) -> None:
    """A worker's life: measure each point index received until ``None`` or death."""
    trace.ignore_ctrl_c()
    faulthandler.disable()  # the parent names the death; no dump of our frames as well
    phase.record_into(phase_buffer)
    cuda = kind == "cuda"
    try:
        if device is not None and device.startswith("cuda"):
            torch.cuda.set_device(device)
        if points is not None and not keeps_threads:
            fd_threads.limit_threads(1)  # see fd.threads: a forked child of a parallel parent
        fd_threads.apply_policy(threads)
        watch.listen(lambda fn, shape: _send(conn, ("slow", _name_of(fn), shape)))
        measurer, specs = PointMeasurer(), {}
        while (i := conn.recv()) is not None:
            if points is not None:
                point = points[i]
            else:
                assert tasks is not None
                ref, cfg, sweep = tasks[i]
                if ref not in specs:
                    specs[ref] = resolve(ref, sweep.kernel_args)
                point = (specs[ref], cfg, sweep)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = measurer(*point)
            lost = _context_lost_by(result) if cuda else None
            stopping = lost is not None
            if lost is not None:
                result = lost
            _send(conn, ("result", result, [(str(w.message), w.category) for w in caught],
                         stopping))
            if stopping:
                break
    except BaseException as exc:  # gradcheck-bi's own failure: the parent stops (exit 4)
        _send(conn, ("internal", f"{type(exc).__name__}: {exc}",
                     "".join(traceback.format_exception(exc))))
    finally:
        os._exit(0)  # no atexit handlers, no buffers of the parent's flushed twice


_SEND_LOCK: Any = None


def _send(conn: Any, message: Any) -> None:
    """Send from the worker (its main thread and the slow-call timer share the pipe)."""
    global _SEND_LOCK
    import threading

    if _SEND_LOCK is None:
        _SEND_LOCK = threading.Lock()
    with _SEND_LOCK:
        conn.send(message)


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _context_lost_by(result: Result) -> Result | None:
    """``None`` while this worker's CUDA context still runs work; else ``result`` as an
    ``error`` (an illegal address or a failed device assert leaves the context refusing
    everything, and may surface only at a later call: the point it surfaced after cannot
    be trusted whatever it measured)."""
    if not torch.cuda.is_initialized():
        return None  # nothing ran on the GPU here
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return None
    except Exception as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if result.status != "error":
        result.status, result.as_expected = "error", False
        result.message = (f"the CUDA context was unusable after this point ({why}; CUDA "
                          "reports such errors asynchronously): this point's result cannot "
                          "be trusted")
    result.details = {**result.details, "cuda_context": f"lost ({why}); worker replaced"}
    return result
