"""Points measured in worker processes: whatever a kernel does to its process costs one point.

A kernel can end the process that runs it — ``os._exit``, a signal (a read past a block
boundary, the abort of a failed device assert, an out-of-memory kill) — or never return;
measured in the process that writes the report, that ended the run with no report at all
(``sys.exit(0)`` with exit 0: a gate read as green). So this process only hands out the
points and collects the results, and worker processes measure them:

* the CPU points go to one worker **forked** from this process: it inherits the loaded
  kernels (nothing to import again) and starts in milliseconds;
* the CUDA points go to one worker per GPU, which measures there until it dies — with two
  or more GPUs, this spreads the points over all of them. It is **forked** too while this
  process never started CUDA (:mod:`gradcheck_bi.gpu`): it inherits torch, the kernel, its
  library and its recognition, and pays only its own CUDA context (and Triton's compiled
  kernels, read from Triton's cache). Where this process runs CUDA already (the API in a
  user's process), or a forked worker finds it cannot start CUDA (it says so before its
  first point, which then goes to the next worker), the worker is **spawned**: it imports
  and loads the kernels by reference again (seconds). A kernel handed over as an object
  (the API) cannot be loaded by a spawned process: its CUDA points then run here;
* one process for recognition and measurement: a kernel that runs on CUDA only is
  recognised in a forked child that starts CUDA for it
  (:mod:`gradcheck_bi.kernels.adapting.sandbox`), and that child is **kept**: it becomes the
  first worker of the CUDA lane (:func:`_adopt`), so the CUDA context, the Triton kernels
  its forward loaded and its recognition are paid once, as in a run without isolation. It
  gets the points as references (its own kernel is the one it built; a bundled one costs
  nothing), so it takes the lane only where the lane measures its kernel and no other but
  bundled ones, and nothing only this process holds; else it is released and the worker
  forked as above. If it dies, the next worker is forked as any other;
* a worker takes one point at a time and sends back its :class:`~gradcheck_bi.vocab.Result`
  (with the warnings it raised); one that dies leaves its point an ``error`` that names how
  it died and what the kernel was running (:mod:`gradcheck_bi.kernels.calling.phase`); a point past
  its sweep's ``timeout`` is an ``error`` and its worker is killed (:class:`Hangs`: the
  kernel's other points at that shape, dtype and device that would run the phase it hung
  in are ``error`` at once, not each a timeout again); a CUDA worker whose
  context a point left unusable (an illegal address, a device assert) reports that point
  and stops. A fresh worker takes the next point either way, so every other point runs;
* a CPU worker told to stop ends itself: the caller returns without waiting for its exit
  (:func:`reap_ended` reaps it at the next run), and gives its own freed heap back to the
  OS once while the worker measures, so the next fork copies no page tables of free memory
  (:func:`gradcheck_bi.fd.budget.release_freed_memory`).

Each point's inputs come from its own seed, so its result does not depend on which process
measured it or what ran there before: the report is the one a single process writes.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from gradcheck_bi import gpu
from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.fd.budget import release_freed_memory
from gradcheck_bi.gate import expected, judge
from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.adapting.loader import Crashed
from gradcheck_bi.kernels.adapting.sandbox import ctrl_c_after_start, main_module_hidden
from gradcheck_bi.kernels.calling import phase, watch
from gradcheck_bi.measure import PointMeasurer
from gradcheck_bi.point import public, weight_words
from gradcheck_bi.serve import Point, serve
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, Result

OnResult = Callable[[Result, int, int], None]
_STOP_WAIT_S = 10.0  # a worker told to stop (all points done) gets this long to exit
# Points handed to a worker ahead of the one it measures: the next index already waits in
# the pipe when a point ends (a round trip per point cost ~0.4 ms of idle worker, 3 % of
# cases/ci.toml), while a worker that dies gives back what it had not started.
DEPTH = 2


class WorkerFailure(RuntimeError):
    """gradcheck-bi's own error inside a worker process (exit 4), with its traceback."""


Loadable = tuple[str, tuple[tuple[str, Any], ...]]


def references(points: list[Point]) -> list[Loadable | None]:
    """Each point's kernel as a reference and the kernel arguments a fresh process loads it
    with (``None``: an object handed to the API, which only this process holds)."""
    return [None if spec.source == "api" or isinstance(spec.fn, Crashed)  # not again
            else (spec.ref, spec.loaded_with) for spec, _, _ in points]


def measure(points: list[Point], on_result: OnResult | None = None,
            gpus: list[str] | None = None, cpu_start: str = "fork") -> list[Result]:
    """Measure every point in worker processes; the results in the order of ``points``.

    ``gpus``: the devices of the CUDA workers (default: one, on the current GPU);
    ``cpu_start``: ``"fork"`` or ``"spawn"`` (where fork is missing) for the CPU worker, and
    for the CUDA workers while this process has not started CUDA (else ``"spawn"``)."""
    reap_ended()
    refs = references(points)
    lanes = {"cpu": _Lane("cpu", cpu_start, [None]),
             "cuda": _Lane("cuda", cpu_start if gpu.forkable() else "spawn",
                           list(gpus) if gpus else [None])}
    queue: dict[str, collections.deque[int]] = {k: collections.deque() for k in (*lanes, "here")}
    present = gpu.present()

    def route(i: int) -> str:
        kind = "cuda" if points[i][1].device.startswith("cuda") else "cpu"
        # No GPU: a CUDA point is "unsupported here" at once; no worker needed to say so.
        local = (lanes[kind].start == "spawn" and refs[i] is None) or (kind == "cuda"
                                                                        and not present)
        return "here" if local else kind

    for i in range(len(points)):
        queue[route(i)].append(i)
    _adopt(sandbox.take_kept(), lanes, queue, points, refs)
    results: list[Result | None] = [None] * len(points)
    count = 0

    def record(i: int, result: Result) -> None:
        nonlocal count
        results[i], count = result, count + 1
        if on_result is not None:
            on_result(result, count, len(points))

    here = PointMeasurer()
    hangs = Hangs()
    tasks = [(ref, cfg, sweep) for ref, (_, cfg, sweep) in zip(refs, points, strict=True)]
    running: list[_Worker] = []
    released = False
    try:
        while count < len(points):
            for kind, lane in lanes.items():  # every worker (or free slot) is topped up
                for slot in lane.slots():
                    if not queue[kind]:
                        break
                    worker = lane.worker(slot, points, tasks)
                    if worker not in running:
                        running.append(worker)
                    while queue[kind] and len(worker.assigned) < DEPTH:
                        worker.give(queue[kind].popleft(), points)
            if not released and lanes["cpu"].workers and lanes["cpu"].start == "fork":
                released = True  # once the worker is fed: the next fork is cheap (fd.budget)
                release_freed_memory()
            if queue["here"]:  # what no worker can load is measured here, between polls
                i = queue["here"].popleft()
                record(i, here(*points[i]))
            busy = [w for w in running if w.point is not None]
            if busy:
                hung = False
                for worker, message in _next_messages(busy, block=not queue["here"]):
                    if message == "late" and worker.point is not None:
                        hangs.add(points[worker.point], phase.read(worker.phase))
                        hung = True
                    _take(worker, message, points, record)
                    if not worker.alive:  # what it had not started goes back, in order
                        kind = worker.lane.kind
                        queue[kind].extendleft(reversed(worker.assigned))
                        worker.assigned.clear()
                        for i in [i for i in queue[kind] if route(i) != kind]:
                            queue[kind].remove(i)  # a lane now spawned: objects run here
                            queue["here"].append(i)
                if hung:  # what would wait for the hang again is an error now
                    for waiting in queue.values():
                        for i in list(waiting):
                            if (excused := hangs.excuse(points[i])) is not None:
                                waiting.remove(i)
                                record(i, excused)
    finally:
        for worker in running:
            worker.stop()
        for lane in lanes.values():
            if lane.kept is not None:  # never needed
                lane.kept.release()
    return [r for r in results if r is not None]


def _adopt(kept: sandbox.Kept | None, lanes: dict[str, _Lane],
           queue: dict[str, collections.deque[int]], points: list[Point],
           refs: list[Loadable | None]) -> None:
    """The kernel's kept recording child becomes the first worker of its device's lane where
    that lane measures the kernel and nothing it would have to load anew (other kernels
    than the bundled ones, or an object only this process holds); else it is released."""
    if kept is None:
        return
    lane, mine = lanes.get(kept.kind), queue.get(kept.kind, collections.deque())
    specs = [points[i][0] for i in mine]
    if (lane is not None and lane.start == "fork" and all(refs[i] is not None for i in mine)
            and any(s.ref == kept.ref for s in specs)
            and all(s.ref == kept.ref or s.source == "bundled" for s in specs)):
        lane.kept = kept
    else:
        kept.release()


class Hangs:
    """Where a point ran past its timeout: ``(kernel, shape, dtype, device)`` → the phase it
    hung in and the point. A kernel that hangs at a shape hangs at its other points there;
    waiting out the timeout at each of them made one hang cost a timeout per point (18 × 20
    s at ``cases/ci.toml``'s D = 1025). So a point at a hung key is an ``error`` without
    running — unless it never enters the phase that hung: a ``forward`` check never runs a
    backward, so a hang in backward leaves it to run. Other shapes, dtypes and devices run.

    >>> from gradcheck_bi.sweep import Sweep
    >>> from gradcheck_bi.vocab import Config, KernelSpec
    >>> k, s = KernelSpec("k", None, source="k.py:K"), Sweep(timeout=2)
    >>> hangs = Hangs()
    >>> hangs.add((k, Config(check="dx", shape=(2, 300)), s), "backward")
    >>> hangs.excuse((k, Config(check="forward", shape=(2, 300)), s)) is None
    True
    >>> hangs.excuse((k, Config(check="dw", shape=(2, 300)), s)).message
    'not run: the kernel hung at this shape in point dx γ=randn zcg=off (backward past 2 s)'
    """

    def __init__(self) -> None:
        self.seen: dict[tuple[str, tuple[int, ...], str, str], tuple[str, Config, Sweep]] = {}

    @staticmethod
    def _key(point: Point) -> tuple[str, tuple[int, ...], str, str]:
        spec, cfg, _ = point
        return spec.name, tuple(cfg.shape), cfg.dtype, cfg.device

    def add(self, point: Point, doing: str) -> None:
        """``point`` ran past its timeout in ``doing`` (the phase: ``"backward"``, …)."""
        self.seen.setdefault(self._key(point), (doing, point[1], point[2]))

    def excuse(self, point: Point) -> Result | None:
        """The ``error`` result ``point`` gets instead of running, if a hang excuses it."""
        hung = self.seen.get(self._key(point))
        spec, cfg, sweep = point
        if hung is None or (hung[0].startswith("backward") and cfg.check == "forward"):
            return None
        doing, at, late = hung
        words = [at.check, *weight_words(public(at, ())),  # γ's control and mode, if any
                 f"layout {at.layout}" * (at.layout != "contiguous"),
                 f"x·{at.input_scale:g}" * (at.input_scale != 1.0),
                 f"γ·{at.weight_scale:g}" * (at.weight_scale != 1.0),
                 f"seed {at.seed}" * bool(at.seed)]
        label = " ".join(w for w in words if w)
        why = (f"not run: the kernel hung at this shape in point {label} "
               f"({doing or 'between calls'} past {late.timeout:g} s)")
        return judge(spec.name, expected(spec, cfg, sweep), cfg, status="error", message=why,
                     details={"not_run": "hung", "hung_in": label,
                              "phase": doing or "between calls", "timeout_s": late.timeout})


class _Lane:
    """The workers of one device kind: one slot per device (``None``: the default one)."""

    def __init__(self, kind: str, start: str, devices: list[str | None]) -> None:
        self.kind, self.start, self.devices = kind, start, devices
        self.workers: dict[int, _Worker] = {}
        self.kept: sandbox.Kept | None = None  # a recording child to be its first worker

    def slots(self) -> list[int]:
        """The slots whose worker has room for a point, is dead or not started yet."""
        return [s for s in range(len(self.devices)) if s not in self.workers
                or not self.workers[s].alive or len(self.workers[s].assigned) < DEPTH]

    def worker(self, slot: int, points: list[Point], tasks: list[Any]) -> _Worker:
        w = self.workers.get(slot)
        if w is None or not w.alive:
            kept, self.kept = self.kept, None
            w = self.workers[slot] = _Worker(self, self.devices[slot], points, tasks, kept)
        return w


class _Worker:
    """One worker process, the pipe to it and the points handed to it, in order: the first
    (:attr:`point`) is the one it measures now, its clock started when it began."""

    def __init__(self, lane: _Lane, device: str | None, points: list[Point],
                 tasks: list[Any], kept: sandbox.Kept | None = None) -> None:
        import multiprocessing as mp

        ctx: Any = mp.get_context(lane.start)
        self.lane, self.device = lane, device
        forked = lane.start == "fork"
        # keeps_threads: whether torch may run on several threads there (a fresh process, or
        # a fork of a process that never had a thread pool: fd.threads)
        settings = (lane.kind, device, fd_threads.fixed_threads(),
                    not forked or fd_threads.fork_keeps_threads())
        if kept is not None:  # the kernel's recording child, waiting: it loads by reference
            self.process, self.conn, self.phase = kept.process, kept.conn, kept.phase
            kept.hand_over(serve, (*settings, None, tasks))
        else:
            self.phase = ctx.RawArray("c", phase.SIZE)
            self.conn, theirs = ctx.Pipe()
            args = (theirs, self.phase, *settings, points if forked else None,
                    None if forked else tasks)
            self.process = ctx.Process(target=serve, args=args, daemon=True)
            sys.stdout.flush()  # a forked child must not write this process's buffers again
            sys.stderr.flush()
            with warnings.catch_warnings(), ctrl_c_after_start(self.process):
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads
                if forked:
                    self.process.start()
                else:
                    with main_module_hidden():
                        self.process.start()
            theirs.close()
        self.assigned: collections.deque[int] = collections.deque()
        self.deadline: float | None = None
        self.alive = True
        self.points = points

    @property
    def point(self) -> int | None:
        return self.assigned[0] if self.assigned else None

    def give(self, i: int, points: list[Point]) -> None:
        self.assigned.append(i)
        if len(self.assigned) == 1:
            self.started()
        try:
            self.conn.send(i)
        except (BrokenPipeError, OSError):  # died between points: seen on the next poll
            pass

    def started(self) -> None:
        """The first point handed over starts now: its deadline (0 or None: no limit)."""
        timeout = self.points[self.assigned[0]][2].timeout if self.assigned else None
        self.deadline = time.monotonic() + timeout if timeout else None

    def finished(self) -> None:
        self.assigned.popleft()
        self.started()

    def stop(self) -> None:
        if self.alive and not self.assigned:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            if self.lane.kind == "cpu":  # it ends itself: reaped later, not waited for
                _ending.append((self.process, time.monotonic() + _STOP_WAIT_S))
                self.alive = False
                self.conn.close()
                return
            self.process.join(_STOP_WAIT_S)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.alive = False
        self.conn.close()


# CPU workers told to stop, with the time by which they must have exited. A worker ends
# with ``os._exit`` as soon as it reads the stop; tearing down a process forked from one
# that holds torch took 20–35 ms of an (8, 1024) check's ~0.25 s when the parent waited
# for it. So the parent returns at once and reaps them at its next run (a zombie until
# then); one still alive past its time is killed there.
_ending: list[tuple[Any, float]] = []
os.register_at_fork(after_in_child=_ending.clear)  # a child cannot reap its siblings


def reap_ended(wait: bool = False) -> None:
    """Reap the stopped CPU workers that have exited (``wait``: wait for each to exit, as
    a benchmark that reads its children's CPU time does); kill those past their time."""
    now = time.monotonic()
    for process, deadline in list(_ending):
        if wait:
            process.join(max(0.0, deadline - now))
        elif process.is_alive() and now < deadline:
            continue
        if process.is_alive():
            process.kill()
        process.join()
        _ending.remove((process, deadline))


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
    if isinstance(message, tuple) and message[0] == "unforkable":  # before its first point
        warnings.warn(f"CUDA did not start in a worker forked from this process "
                      f"({message[1]}): the CUDA workers are spawned, each importing and "
                      "loading the kernels again (seconds each). A fork needs CUDA never "
                      "started here before the run: torch.cuda.is_available() starts the "
                      "driver unless PYTORCH_NVML_BASED_CUDA_CHECK=1", RuntimeWarning,
                      stacklevel=2)
        worker.lane.start = "spawn"
        worker.kill()  # its points go to the next worker
        return
    if isinstance(message, tuple) and message[0] == "slow":
        listener = watch.listener()
        if listener is not None:
            listener(_Named(message[1]), message[2])
        return
    if isinstance(message, tuple) and message[0] == "result":
        _, result, caught, stopping = message
        for text, category in caught:
            warnings.warn(text, category, stacklevel=2)
        worker.finished()
        record(i, result)
        if stopping:  # its CUDA context is unusable: the next point gets a fresh worker
            worker.kill()
        return
    if isinstance(message, tuple) and message[0] == "internal":
        raise WorkerFailure(f"worker on {worker.device or worker.lane.kind}: {message[1]}\n"
                            f"{message[2]}")
    doing = phase.read(worker.phase) or "between calls"
    spec, cfg, sweep = points[i]
    worker.kill()  # late (killed now) or dead (reaped now, its exit code read below)
    if message == "late":
        why = (f"did not finish in {sweep.timeout:g} s: {doing} at shape {cfg.shape} "
               "(the worker was stopped; the other points ran)")
        details = {"timeout_s": sweep.timeout, "phase": doing}
    else:
        code = worker.process.exitcode
        how = sandbox.death(code)
        why = f"the kernel {how} in {doing} at shape {cfg.shape}"
        details = {"exit": how, "phase": doing}
    worker.assigned.popleft()
    record(i, judge(spec.name, expected(spec, cfg, sweep), cfg, status="error",
                    message=why, details=details))


class _Named:
    """A slow first call's kernel, by name, for the progress line's listener."""

    def __init__(self, name: str) -> None:
        self.__name__ = name
