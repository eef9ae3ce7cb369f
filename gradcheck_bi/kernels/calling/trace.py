"""Where a kernel crashed: the frames of a traceback that are the kernel's own code.

A kernel's exception becomes an ``error`` result; a reviewer needs the file and line, not
only ``NameError: name 'wieght' is not defined``. A frame is the **kernel's** when its file
is neither gradcheck-bi's machinery (the adapters, the checks, the finite differences …) nor
torch's, triton's or Python's own library — with one exception: the kernels bundled in
:mod:`gradcheck_bi.kernels` count as kernels. An exception with no kernel frame at all
raised from gradcheck-bi's machinery by a programming slip (a ``NameError``, an
``AttributeError`` …) is gradcheck-bi's own bug (:func:`is_internal`): the CLI turns it into
exit 4, never an ``error`` blamed on the kernel.

>>> try:
...     exec(compile("undefined_name", "my_norm.py", "exec"))
... except NameError as exc:
...     kernel_frames(exc)
['my_norm.py:1 in <module>']
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path

from gradcheck_bi.vocab import first_line

_PACKAGE = Path(__file__).resolve().parents[2]  # gradcheck_bi/
_BUNDLED = {_PACKAGE / "kernels" / "bundled" / name for name in (
    "rmsnorm.py", "_triton_rmsnorm.py")} | {
    _PACKAGE / "sums" / name for name in ("reduction.py", "_triton.py", "blocking.py")}
# Python's own library, and the libraries a kernel is written with.
_LIBRARIES = tuple(str(Path(p).resolve()) for p in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
_FOREIGN_PACKAGES = ("torch", "triton", "typer", "click", "rich", "numpy", "numba")
# Slips of our own code; any other exception from our machinery is the kernel's doing
# (a kernel returning a tuple where a tensor belongs breaks our code with a TypeError).
# AttributeError: what a kernel returns is checked for a tensor before any attribute is
# read, so one raised in our code is ours (86eb384: plot called `apply` on an op kernel).
_SLIPS = (NameError, UnboundLocalError, ImportError, SyntaxError, AttributeError)


def _is_library(path: Path) -> bool:
    text = str(path)
    if text.startswith(_LIBRARIES) and "site-packages" not in text:
        return True
    return any(part in _FOREIGN_PACKAGES for part in path.parts[-4:-1]) and (
        "site-packages" in text or "dist-packages" in text)


def _is_machinery(path: Path) -> bool:
    return path.is_relative_to(_PACKAGE) and path not in _BUNDLED


def _shown(filename: str) -> str:
    """The path as a reviewer wants it: relative to the working directory when below it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if rel.startswith("..") else rel


def kernel_frames(exc: BaseException) -> list[str]:
    """``path.py:LINE in function`` for each frame of the kernel's own code, outermost first."""
    frames = []
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename.startswith("<"):  # <string>, <frozen …>: no file to point at
            continue
        path = Path(fs.filename).resolve()
        if _is_machinery(path) or _is_library(path):
            continue
        frames.append(f"{_shown(fs.filename)}:{fs.lineno} in {fs.name}")
    return frames


def full_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def is_internal(exc: BaseException) -> bool:
    """gradcheck-bi's own bug: a programming slip raised in its machinery, no kernel frame."""
    if not isinstance(exc, _SLIPS) or kernel_frames(exc):
        return False
    tb = traceback.extract_tb(exc.__traceback__)
    ours = [fs for fs in tb if not fs.filename.startswith("<")
            and _is_machinery(Path(fs.filename).resolve())]
    return bool(ours) and ours[-1] is tb[-1]


# Set in a worker process, whose SIGINT is ignored (the user's Ctrl-C stops its parent,
# which stops it): there a KeyboardInterrupt can only be the kernel's own doing.
_ctrl_c_ignored = False


def ignore_ctrl_c() -> None:
    """In a worker process: SIGINT ignored, so every KeyboardInterrupt is the kernel's."""
    global _ctrl_c_ignored
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _ctrl_c_ignored = True


def stops_the_run(exc: BaseException) -> bool:
    """Whether ``exc`` stops the whole run rather than being one point's ``error``: memory
    exhausted, or the user's Ctrl-C (a ``KeyboardInterrupt`` where it cannot be the kernel's
    own, i.e. outside a worker process). ``SystemExit``, ``GeneratorExit`` and every other
    exception the kernel raises are its point's result."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, KeyboardInterrupt) and not _ctrl_c_ignored


def located(exc: BaseException) -> str:
    """``"NameError: … (at my_norm.py:6 in forward)"``: the exception's first line and the
    innermost frame of the kernel's own code, where there is one."""
    frames = kernel_frames(exc)
    return first_line(exc) + (f" (at {frames[-1]})" if frames else "")
