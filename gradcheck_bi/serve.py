"""A worker process's life: measure each point index it is sent, send back the result.

Started by :mod:`gradcheck_bi.workers` (forked, with the points in memory; or spawned, with
the points as references to load; or handed to a kernel's kept recording child,
:mod:`gradcheck_bi.kernels.adapting.sandbox`, with the points as references, its own kernel
loaded and recognised already). SIGINT is ignored (the user's Ctrl-C stops the parent,
which stops the worker), so a ``KeyboardInterrupt`` here is the kernel's; the phase the
kernel is in is written where the parent can read it after a death
(:mod:`gradcheck_bi.kernels.calling.phase`); a forked CUDA worker starts CUDA before its first point
and says ``"unforkable"`` if it cannot (:mod:`gradcheck_bi.gpu`: the parent spawns instead);
a CUDA worker checks its context after each point and stops when a point left it unusable.
gradcheck-bi's own failure goes back as ``"internal"`` (exit 4 in the parent). The process
ends with ``os._exit``: no atexit handler of the parent, no buffer of the parent's flushed a
second time.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import threading
import traceback
import warnings
from typing import Any

import torch

from gradcheck_bi import gpu
from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.calling import phase, trace, watch
from gradcheck_bi.measure import PointMeasurer
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec, Result

Point = tuple[KernelSpec, Config, Sweep]


def serve(conn: Any, phase_buffer: Any, kind: str, device: str | None, threads: int | None,
           keeps_threads: bool, points: list[Point] | None,
           tasks: list[tuple[str | None, Config, Sweep]] | None) -> None:
    """A worker's life: measure each point index received until ``None`` or death."""
    trace.ignore_ctrl_c()
    # A forked worker inherits the parent's heap (torch, the kernel's library: ~170 k
    # tracked objects) and its collector's counts, so it ran the full collection the parent
    # had due at every fork — 0.1 s of an (8, 1024) check, and a copy of every page it
    # wrote a header on. What was loaded before the worker started is out of its passes.
    gc.freeze()
    faulthandler.disable()  # the parent names the death; no dump of our frames as well
    phase.record_into(phase_buffer)
    sandbox.disable()  # already isolated: a kernel loaded here is called here
    cuda = kind == "cuda"
    try:
        if cuda and points is not None and (why := gpu.start_in_child(device)) is not None:
            _send(conn, ("unforkable", why))
            return
        if device is not None and device.startswith("cuda"):
            torch.cuda.set_device(device)
        if not keeps_threads:
            fd_threads.limit_threads(1)  # see fd.threads: a forked child of a parallel parent
        fd_threads.apply_policy(threads)
        watch.listen(lambda fn, shape: _send(conn, ("slow", _name_of(fn), shape)))
        measurer, specs = PointMeasurer(), {}
        while (i := conn.recv()) is not None:
            phase.now("")  # between calls until the kernel is handed control
            if points is not None:
                point = points[i]
            else:
                assert tasks is not None
                (ref, args), cfg, sweep = tasks[i]
                key = f"{ref} {args!r}"
                if key not in specs:
                    specs[key] = resolve(ref, dict(args))
                point = (specs[key], cfg, sweep)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = measurer(*point)
            stopping = cuda and _context_lost_by(result)
            _send(conn, ("result", result, [(str(w.message), w.category) for w in caught],
                         stopping))
            if stopping:
                break
    except BaseException as exc:  # gradcheck-bi's own failure: the parent stops (exit 4)
        _send(conn, ("internal", f"{type(exc).__name__}: {exc}",
                     "".join(traceback.format_exception(exc))))
    finally:
        os._exit(0)  # no atexit handlers, no buffers of the parent's flushed twice


_SEND_LOCK = threading.Lock()  # the main thread and a slow-call timer share the pipe


def _send(conn: Any, message: Any) -> None:
    with _SEND_LOCK:
        conn.send(message)


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _context_lost_by(result: Result) -> bool:
    """Whether this worker's CUDA context stopped running work after ``result``'s point (an
    illegal address or a failed device assert leaves it refusing everything, and may
    surface only at a later call); if so ``result`` is made an ``error`` in place: the point
    it surfaced after cannot be trusted whatever it measured."""
    if not torch.cuda.is_initialized():
        return False  # nothing ran on the GPU here
    why = gpu.unusable()
    if why is None:
        return False
    if result.status != "error":
        result.status, result.as_expected = "error", False
        result.message = (f"the CUDA context was unusable after this point ({why}; CUDA "
                          "reports such errors asynchronously): this point's result cannot "
                          "be trusted")
    result.details = {**result.details, "cuda_context": f"lost ({why}); worker replaced"}
    return True
