"""Say what is slow: a kernel's first call at a shape that takes longer than a second.

Triton kernels compile (and autotune) per shape on their first call; a run over many shapes
can spend most of its time there, silently. While a first call at a (kernel, shape, dtype,
device) has run for :data:`SLOW_AFTER_S`, the listener the command line installed (its
progress bar: on a terminal only, never in logs) is told, so the progress line can say
"compiling / autotuning <kernel> at <shape>". Nothing is told when no listener is installed.

>>> import time
>>> heard = []
>>> listen(lambda fn, shape: heard.append(shape))
>>> with first_call("k", (2, 8), "float32", "cpu", slow_after_s=0.01):
...     time.sleep(0.1)
>>> with first_call("k", (2, 8), "float32", "cpu", slow_after_s=0.01):  # not the first call
...     time.sleep(0.1)
>>> listen(None); heard
[(2, 8)]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SLOW_AFTER_S = 1.0
Listener = Callable[[Any, tuple[int, ...]], None]

_seen: set[tuple[int, tuple[int, ...], str, str]] = set()
_listener: Listener | None = None
_lock = threading.Lock()


def listen(listener: Listener | None) -> None:
    """Install (or, with ``None``, remove) the one listener for slow first calls."""
    global _listener
    _listener = listener


def listener() -> Listener | None:
    """The listener installed (for a worker process's messages, told here)."""
    return _listener


@contextmanager
def first_call(fn: Any, shape: tuple[int, ...], dtype: str, device: str,
               slow_after_s: float | None = None) -> Iterator[None]:
    """Around a kernel call: if it is the first at this key and a listener is installed,
    tell the listener once the call has run ``slow_after_s`` seconds."""
    key = (id(fn), tuple(shape), dtype, device)
    with _lock:
        first = key not in _seen
        _seen.add(key)
    listener = _listener
    if not first or listener is None:
        yield
        return
    after = SLOW_AFTER_S if slow_after_s is None else slow_after_s
    timer = threading.Timer(after, listener, (fn, tuple(shape)))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
