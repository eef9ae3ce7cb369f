"""The kernel's calls at load, in a child process: a crash there costs that kernel, not the run.

Recognising a kernel (:mod:`.behaviour`, :func:`.adapters.gamma_at_zero`) calls its forward
once or twice at a small point — before any worker process exists
(:mod:`gradcheck_bi.workers`). A kernel that segfaults, calls ``os._exit`` or hangs there
ended the run with no report. So :func:`isolated` runs the whole adaptation of one kernel
twice:

* in a **child** that *records*: each load-time call (:func:`call`) runs and its outcome (the
  output as an fp64 CPU tensor, or the exception's name and first line) goes back through a
  pipe. The child is forked (milliseconds: it inherits the imported kernel) and starts CUDA
  itself when a call needs it, which it can while this process never started CUDA
  (:mod:`gradcheck_bi.gpu`; nothing here does: the calls' inputs are moved to the device
  inside them). Where the forked child cannot start CUDA, a kernel that only runs there is
  recorded again in a spawned child that loads it by reference (a kernel handed over as an
  object cannot be: it is adapted in this process, as before);
* here, *replaying*: the same code asks for the same calls in the same order and gets the
  recorded outcomes; the kernel is never called in this process at load.

A child that dies, ends or runs past the limit (:func:`limit`: the sweep's ``timeout``) is a
:class:`~gradcheck_bi.vocab.KernelCrashed` naming how and in which call.
``GRADCHECK_BI_ISOLATE=0`` (or no ``fork``) calls the kernel here.

A forked child that started CUDA is **kept** (:class:`Kept`) once it has recorded: it holds
the kernel's import, its recognition, a CUDA context and the Triton kernels its forward
loaded — what the run's CUDA worker would pay for again. It waits, and the run's worker
pool takes it (:func:`take_kept`) and makes it the worker of its device
(:mod:`gradcheck_bi.workers`), or releases it. One is kept at a time (a later one releases the
earlier). ``GRADCHECK_BI_KEEP_RECORDER`` names the device kinds a child is kept for
(``cuda`` by default; ``cpu,cuda`` exercises the hand-over on CPU; empty: none).
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import gc
import os
import pickle
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from gradcheck_bi import gpu
from gradcheck_bi.kernels.calling import phase, trace
from gradcheck_bi.kernels.calling.refusal import refusal
from gradcheck_bi.vocab import KernelCrashed, Unsupported, first_line

T = TypeVar("T")

_mode: str | None = None  # "record" (a child), "replay" (here, after a child), None: direct
_conn: Any = None  # the recording child's end of the pipe
_forked = False  # the recording child was forked: CUDA starts here only if the parent's never did
_cuda_refused: str | None = None  # why CUDA cannot start in this child ("": it can; None: untried)
_replay: collections.deque[tuple[str, Any]] = collections.deque()
_limit_s: float | None = None
_off = False
_built: tuple[Any, Any] | None = None  # in a kept child: (its kernel's key, what build() gave)
_kept: Kept | None = None  # here: the recording child kept for the run's workers
# How a spawned child loads a kernel by reference: registry.resolve, set there (it imports
# this module, not the other way round).
loader: Callable[[str, dict[str, Any]], Any] | None = None


class _NeedsCuda(BaseException):
    """A forked child asked to call the kernel on CUDA: record it in a spawned child."""


def disable() -> None:
    """Call the kernel here from now on (a worker process: already isolated)."""
    global _off
    _off = True


@contextlib.contextmanager
def limit(seconds: float | None) -> Iterator[None]:
    """Within: a recording child past ``seconds`` (``None`` or 0: no limit) is a hang."""
    global _limit_s
    before, _limit_s = _limit_s, seconds or None
    try:
        yield
    finally:
        _limit_s = before


def call(fn: Callable[[], T], what: str, device: str = "cpu") -> T:
    """``fn()``, a call of the kernel at load (``what`` it does, for the line a death gives):
    run, recorded, or replayed, as :func:`isolated` decides. What the kernel warns about
    while it is probed is not shown: the probes' inputs are the tool's, not the run's (a
    refused kernel gets its one line; the points' own warnings are reported)."""
    if _mode == "replay" and _replay:
        kind, value = _replay.popleft()
        if kind == "raised":  # a refusal of a device or dtype is replayed as one
            base = Unsupported if value[2] else Exception
            raise type(value[0], (base,), {})(value[1])
        return value  # type: ignore[no-any-return]
    fn = _quiet(fn)
    if _mode != "record":
        return fn()
    if _forked and device.startswith("cuda") and _cuda_refused_here():
        raise _NeedsCuda
    _send(_conn, "call", what)
    try:
        value = fn()
    except Exception as exc:
        text = first_line(exc).split(": ", 1)
        _send(_conn, "raised", (type(exc).__name__, text[1] if len(text) > 1 else "",
                                refusal(exc) is not None))
        raise
    _send(_conn, "ok", value)
    return value


def _quiet(fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()

    return run


def _cuda_refused_here() -> bool:
    """In a forked recording child: whether CUDA cannot start here (tried once)."""
    global _cuda_refused
    if _cuda_refused is None:
        _cuda_refused = gpu.start_in_child() or ""
    return bool(_cuda_refused)


def _send(conn: Any, kind: str, value: Any) -> None:
    # Plain pickle: multiprocessing's own would pass a tensor as shared memory that the
    # child, gone by then, must still serve.
    conn.send_bytes(pickle.dumps((kind, value)))


def isolated(build: Callable[[], T], name: str, ref: str | None,
             kernel_args: dict[str, Any] | None) -> T:
    """``build()`` (a kernel's adaptation) with its kernel calls recorded in a child first;
    ``ref``, ``kernel_args``: how a spawned child loads the kernel (``ref`` ``None``: it
    cannot). Raises :class:`KernelCrashed` when the child dies or hangs."""
    global _mode
    key = (name, ref, repr(kernel_args or {}))  # as a worker resolves it: loaded_with
    if _built is not None and _built[0] == key:  # a kept child, now a worker: built here
        return _built[1]  # type: ignore[no-any-return]
    if _mode is not None or _off or os.environ.get("GRADCHECK_BI_ISOLATE", "1") == "0" \
            or not hasattr(os, "fork"):
        return build()
    outcomes = _record("fork", build, name, None, key)
    if outcomes is None and ref is not None and loader is not None:
        outcomes = _record("spawn", None, name, (loader, ref, dict(kernel_args or {})))
    if outcomes is None:  # only CUDA runs it, and no fresh process can load it
        return build()
    _replay.clear()
    _replay.extend(outcomes)
    _mode = "replay"
    try:
        return build()
    finally:
        _mode = None
        _replay.clear()


def _record(start: str, build: Callable[[], Any] | None, name: str,
            loadable: tuple[Any, str, dict[str, Any]] | None, key: Any = None
            ) -> list[tuple[str, Any]] | None:
    """The outcomes of a child's kernel calls, in order; ``None``: it asked for CUDA.
    ``key`` (``(name, ref, kernel args)``, forked only): the child may be kept (:class:`Kept`)."""
    import multiprocessing as mp

    ctx: Any = mp.get_context(start)
    mine, theirs = ctx.Pipe()
    kinds = _keep_for() if key is not None and start == "fork" else frozenset()
    keep = (key, ctx.RawArray("c", phase.SIZE), os.getpid(), kinds) if kinds else None
    child = ctx.Process(target=_child, args=(theirs, build, loadable, start == "fork", keep),
                        daemon=True)
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings(), main_module_hidden(), ctrl_c_after_start(child):
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads alive
        child.start()
    theirs.close()
    outcomes: list[tuple[str, Any]] = []
    doing, end = "", None if _limit_s is None else time.monotonic() + _limit_s
    kept = None
    try:
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not mine.poll(left):
                raise KernelCrashed(f"kernel {name}: did not finish in {_limit_s:g} s while it "
                                    f"was recognised at load ({doing or 'loading'})")
            try:
                kind, value = pickle.loads(mine.recv_bytes())
            except (EOFError, OSError):
                child.join()
                raise KernelCrashed(f"kernel {name}: the kernel {death(child.exitcode)} while "
                                    f"it was recognised at load ({doing or 'loading'})") from None
            if kind == "call":
                doing = value
            elif kind in ("ok", "raised"):
                outcomes.append((kind, value))
            elif kind == "ended":
                raise KernelCrashed(f"kernel {name}: the kernel raised {value} while it was "
                                    f"recognised at load ({doing or 'loading'})")
            elif kind == "done":
                if value is not None and keep is not None:  # it waits to be a worker
                    kept = Kept(value, child, mine, keep[1], keep[0][1])
                return outcomes
            else:
                return None
    finally:
        if kept is not None:
            _hold(kept)
        else:
            if child.is_alive():
                child.kill()
            child.join()
            mine.close()


def death(code: int | None) -> str:
    """How a process that ran the kernel ended, from its exit code, as "the kernel …" goes
    on. SIGKILL is no signal a kernel sends itself: the system's out-of-memory killer does
    (the kernel's memory or the check's), or a person."""
    if code == -signal.SIGKILL:
        return ("ran when the process was killed with SIGKILL (the out-of-memory killer's "
                "signal: memory ran out)")
    if code is not None and code < 0 and -code in signal.valid_signals():
        return f"killed the process with {signal.Signals(-code).name}"
    return f"ended the process (exit code {code})"


def _child(conn: Any, build: Callable[[], Any] | None,
           loadable: tuple[Any, str, dict[str, Any]] | None, forked: bool,
           keep: tuple[Any, Any, int, frozenset[str]] | None) -> None:
    """A recording child's life: adapt the kernel (``build``, or load it by reference); then,
    if it is kept, wait to serve as a worker (``keep``: the kernel's key, the phase buffer,
    the parent's pid, the device kinds a child is kept for)."""
    global _mode, _conn, _forked, _built
    trace.ignore_ctrl_c()  # the user's Ctrl-C stops the parent
    faulthandler.disable()
    _mode, _conn, _forked = "record", conn, forked
    if forked:  # a parent's OpenMP pool does not survive fork: one thread (as fd.threads)
        import torch

        torch.set_num_threads(1)
        gc.freeze()  # the inherited heap is out of this child's collections (as a worker's)
    built = None
    try:
        if build is not None:
            built = build()
        else:
            assert loadable is not None
            load, ref, kernel_args = loadable
            load(ref, kernel_args)
        kind = "cuda" if _cuda_refused == "" else "cpu"  # "": CUDA started here
        kept = (keep is not None and build is not None and kind in keep[3]
                and (kind != "cuda" or gpu.unusable() is None))  # a context the probe broke
        _send(conn, "done", kind if kept else None)
    except _NeedsCuda:
        _send(conn, "cuda", None)
    except Exception:  # refused as a kernel: the replay raises it again, here
        _send(conn, "done", None)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: the kernel's own
        _send(conn, "ended", first_line(exc))
    else:
        if kept and keep is not None:
            _mode, _conn, _built = None, None, (keep[0], built)
            _serve_when_asked(conn, keep[1], keep[2])
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        os._exit(0)


def _serve_when_asked(conn: Any, phase_buffer: Any, parent: int) -> None:
    """A kept child: wait for ``(target, args)`` and run ``target(conn, phase_buffer, *args)``
    (a worker's life); ``None``, or the parent gone, ends the wait."""
    while not conn.poll(1.0):
        if os.getppid() != parent:
            return
    message = conn.recv()
    if message is not None:
        target, args = message
        target(conn, phase_buffer, *args)


def _keep_for() -> frozenset[str]:
    kinds = os.environ.get("GRADCHECK_BI_KEEP_RECORDER", "cuda")
    return frozenset(k.strip() for k in kinds.split(",") if k.strip())


class Kept:
    """A forked recording child that recorded a kernel and waits to become the worker of
    ``kind`` (``"cuda"``: it started CUDA; ``"cpu"``: kept by ``GRADCHECK_BI_KEEP_RECORDER``):
    its process, this process's end of its pipe, the phase buffer it will write
    (:mod:`gradcheck_bi.kernels.calling.phase`) and the kernel's ``ref`` (``None``: an object
    handed to the API)."""

    def __init__(self, kind: str, process: Any, conn: Any, phase_buffer: Any,
                 ref: str | None) -> None:
        self.kind, self.process, self.conn, self.phase, self.ref = (
            kind, process, conn, phase_buffer, ref)

    def hand_over(self, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Make it a worker: it runs ``target(its conn, its phase buffer, *args)``."""
        self.conn.send((target, args))

    def release(self) -> None:
        """Tell it to end, and reap it."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(None)
        self.process.join(10.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _hold(kept: Kept) -> None:
    global _kept
    if _kept is not None:
        _kept.release()
    _kept = kept


def take_kept() -> Kept | None:
    """The recording child kept since the last call, if any: the caller makes it a worker
    (:meth:`Kept.hand_over`) or releases it (:meth:`Kept.release`)."""
    global _kept
    kept, _kept = _kept, None
    return kept


@contextlib.contextmanager
def ctrl_c_after_start(child: Any) -> Iterator[None]:
    """A Ctrl-C while ``child`` (a process) starts takes effect once it has started. Forking
    runs Python's at-fork handlers (logging's among them), and a ``KeyboardInterrupt`` raised
    in one is printed as "Exception ignored" and dropped: the run went on to exit 0.
    Meanwhile SIGINT only marks itself pressed; the handler found is restored and, if it was
    pressed, the signal raised again against it — Python's own handler (a
    ``KeyboardInterrupt``) after the child is killed and reaped: no caller holds it yet.
    Outside the main thread (where no handler can be set) or under a handler installed
    outside Python nothing changes."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):
        yield
        return
    pressed: list[int] = []
    found = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, found)
        if pressed:
            if found is signal.default_int_handler and child.pid is not None:
                child.kill()
                child.join()
            signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start spawned processes without the caller's main script: a spawned process otherwise
    runs it again (as ``__mp_main__``), and a script without a ``__main__`` guard would run
    its whole check a second time. For children that need nothing from it (their kernel
    comes from a reference: this module's recording child, :mod:`gradcheck_bi.workers`)."""
    main = sys.modules.get("__main__")
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__")
                             if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)
