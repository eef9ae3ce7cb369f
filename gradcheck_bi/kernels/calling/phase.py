"""What the kernel is running now: the last words of a worker process that died in it.

A point measured in a worker process (:mod:`gradcheck_bi.workers`) can end that process —
a signal, ``os._exit``, a failed device assert — with no exception to say where. So every
place that hands control to the kernel says what it runs (:func:`now`: ``"forward"``,
``"backward"``, ``"forward (probe)"``), and a worker writes the word into a small buffer it
shares with its parent (:func:`record_into`); the parent reads it after the death
(:func:`read`) and the report says "… in backward at shape (2, 1025)".

>>> buf = bytearray(SIZE)
>>> record_into(buf)
>>> now("backward")
>>> read(buf)
'backward'
>>> record_into(None)
"""

from __future__ import annotations

from typing import Any

SIZE = 64  # bytes: the longest phase name, NUL-terminated
_buffer: Any = None  # a writable buffer shared with the parent process, or None


def record_into(buffer: Any) -> None:
    """Write each phase into ``buffer`` from now on (``None``: stop)."""
    global _buffer
    _buffer = buffer


def now(phase: str) -> None:
    """Say that the kernel's ``phase`` starts (free when no buffer is recorded into)."""
    if _buffer is not None:
        data = phase.encode()[: SIZE - 1] + b"\0"
        _buffer[: len(data)] = data


def read(buffer: Any) -> str:
    """The phase last written into ``buffer`` (``""`` if none)."""
    return bytes(buffer[:SIZE]).split(b"\0", 1)[0].decode(errors="replace")
