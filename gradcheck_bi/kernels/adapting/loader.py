"""User kernels: ``PATH.py:ATTR`` or ``package.module:ATTR`` → a :class:`KernelSpec`.

``ATTR`` names an autograd Function, a plain function or an nn.Module class or factory;
:mod:`gradcheck_bi.kernels.adapting.adapters` turns it into Megatron's
``apply(x, weight, eps, zero_centered_gamma) -> y``. ``ATTR`` may be dotted
(``module:Outer.Fn``).
A path is loaded as a module of its own (Megatron-Core's ``batch_invariant_kernels.py``
loads straight from a checkout, with no ``megatron`` package installed); the file's folder
is on ``sys.path`` while it runs, so it may import its neighbours.

Three ways a kernel can go wrong here, three outcomes:

* it cannot be found or loaded at all (no such file or module, a syntax error, an
  exception at import, a missing or unusable ``ATTR``) → :class:`KernelLoadError`, exit 2;
* its module imports something this machine lacks (``ImportError``) → a placeholder
  kernel whose every result is ``unsupported``, with the import's own message;
* its forward or backward raises → the sweep reports ``error`` (or ``unsupported`` when
  it refuses a device or dtype), per result, with the kernel's own message.

>>> spec = load("gradcheck_bi.kernels.bundled.rmsnorm:After")
>>> spec.name, spec.source, spec.defects
('gradcheck_bi.kernels.bundled.rmsnorm:After', 'gradcheck_bi.kernels.bundled.rmsnorm:After', ())
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from gradcheck_bi.kernels.adapting.adapters import adapt, is_apply_class
from gradcheck_bi.vocab import (
    KernelCrashed,
    KernelLoadError,
    KernelSpec,
    Unsupported,
    first_line,
)

# Modules loaded from paths, by resolved path: two attributes of one file share one module.
_FILE_MODULES: dict[Path, ModuleType] = {}


def split_ref(ref: str) -> tuple[str, str]:
    """``"a/b.py:Fn"`` → ``("a/b.py", "Fn")``; the last ``:`` separates (``C:\\`` paths work)."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise KernelLoadError(f"kernel {ref!r}: expected PATH.py:ATTR or package.module:ATTR")
    return target, attr


def is_path(target: str) -> bool:
    """A file path (ends in ``.py`` or has a path separator), not a dotted module name."""
    return target.endswith(".py") or "/" in target or "\\" in target


def normal_ref(ref: str) -> str:
    """One spelling per kernel: ``PATH.py:ATTR`` with the path resolved and made relative to
    the working directory when the file is below it (else absolute), ``/`` separated.

    ``./k.py:F``, ``k.py:F`` and ``$PWD/k.py:F`` are one kernel, so one key in a baseline.
    Bundled names, module refs and refs that do not parse are returned as given.

    >>> normal_ref("./kernels/../k.py:F"), normal_ref("k.py:F")
    ('k.py:F', 'k.py:F')
    >>> normal_ref("after"), normal_ref("gradcheck_bi.kernels.bundled.rmsnorm:After")
    ('after', 'gradcheck_bi.kernels.bundled.rmsnorm:After')
    """
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr or not is_path(target):
        return ref
    path = Path(target).expanduser().resolve()
    try:
        path = path.relative_to(Path.cwd().resolve())
    except ValueError:
        pass  # outside the working directory: keep it absolute
    return f"{path.as_posix()}:{attr}"


def _where(exc: BaseException, path: Path | None) -> str:
    """`` (file.py line N)`` for the innermost frame in the kernel's own file, if any."""
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return f" (line {exc.lineno})"
    if path is None:
        return ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve() == path:
            return f" (line {frame.lineno})"
    return ""


class _Unimportable:
    """Stands in for a kernel whose module needs something missing here: every point of it
    is ``unsupported`` with the import's message (nothing wrong was shown about the kernel)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def apply(self, *args: Any) -> Any:
        raise Unsupported(self.reason)


def _load_file(target: str) -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_file():
        raise KernelLoadError(f"kernel file {target} not found")
    path = path.resolve()
    if path in _FILE_MODULES:
        return _FILE_MODULES[path]
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"gradcheck_bi_user_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelLoadError(f"kernel file {target}: not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered before running: dataclasses, pickling and Triton's source lookup need it.
    sys.modules[name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        del sys.modules[name]
        raise
    except Exception as exc:
        del sys.modules[name]
        # A SyntaxError's str() already ends "(file.py, line N)": name the line once.
        what = f"SyntaxError: {exc.msg}" if isinstance(exc, SyntaxError) else first_line(exc)
        raise KernelLoadError(
            f"kernel file {target} failed to import: {what}{_where(exc, path)}"
        ) from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    _FILE_MODULES[path] = module
    return module


def _load_module(target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        # The module itself (or its package) missing means the ref is wrong: exit 2.
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise KernelLoadError(f"kernel module {target} not found") from exc
        raise
    except ImportError:
        raise
    except Exception as exc:
        raise KernelLoadError(
            f"kernel module {target} failed to import: {first_line(exc)}"
        ) from exc


def _attribute(module: ModuleType, attr: str, target: str) -> Any:
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_")
                            and is_apply_class(getattr(module, n)))
            hint = f" (it defines {', '.join(public)})" if public else ""
            raise KernelLoadError(f"kernel {target} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return obj


def functions_in(target: str) -> list[str]:
    """The Functions a kernel file defines itself (not ones it imports), by name."""
    module = _load_file(target)
    return sorted(
        n for n, obj in vars(module).items()
        if not n.startswith("_") and is_apply_class(obj) and obj.__module__ == module.__name__)



def complete_ref(ref: str) -> str:
    """``PATH.py`` with no ``:ATTR`` → ``PATH.py:NAME`` for the one Function the file defines.

    Any other reference is returned as it is. A file defining several Functions (or none)
    is a :class:`KernelLoadError` that lists them, so the user can pick; a file whose imports
    fail here is left for :func:`load` to report as ``unsupported``.
    """
    if ":" in ref or not ref.endswith(".py"):
        return ref
    try:
        names = functions_in(ref)
    except ImportError:
        return ref
    if len(names) == 1:
        return f"{ref}:{names[0]}"
    if not names:
        raise KernelLoadError(f"kernel file {ref} defines no autograd Function "
                              "(an object with apply(x, weight, eps, zero_centered_gamma))")
    raise KernelLoadError(f"kernel file {ref} defines {len(names)} Functions "
                          f"({', '.join(names)}): pick one with {ref}:NAME")


def load(ref: str, kernel_args: dict[str, Any] | None = None) -> KernelSpec:
    """Load ``PATH.py:ATTR`` or ``package.module:ATTR`` as a kernel with no declared defects.

    ``ATTR`` may be any shape :func:`~gradcheck_bi.kernels.adapting.adapters.adapt` takes (an
    autograd Function, a plain function, an nn.Module class or factory). The spec's
    name and source are :func:`normal_ref` of ``ref``. Raises
    :class:`KernelLoadError` (exit 2) when the kernel cannot be loaded at all; an
    ``ImportError`` inside the kernel's module gives a kernel whose results are all
    ``unsupported`` with that message.
    """
    target, attr = split_ref(ref)
    name = normal_ref(ref)  # how results, baselines and case rules name it
    try:
        module = _load_file(target) if is_path(target) else _load_module(target)
    except ImportError as exc:
        return unimportable(name, f"kernel {ref} cannot be imported here: {first_line(exc)}")
    return adapt(_attribute(module, attr, target), name, name, kernel_args)


class Crashed:
    """Stands in for a kernel that crashed or hung while it was recognised at load
    (:mod:`.sandbox`): it is never called again; its one point is an ``error`` saying how."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def apply(self, *args: Any) -> Any:
        raise KernelCrashed(self.reason)


def crashed(ref: str, reason: str) -> KernelSpec:
    """A kernel that crashed at load: one ``error`` result, ``reason`` (see
    :func:`gradcheck_bi.runner.sweep_points`); the other kernels run."""
    return KernelSpec(normal_ref(ref), Crashed(f"{reason}; none of its points ran"), (),
                      "crashed at load", source=normal_ref(ref))


def unimportable(ref: str, reason: str) -> KernelSpec:
    """A kernel that needs something missing here: every result ``unsupported``, ``reason``."""
    return KernelSpec(ref, _Unimportable(reason), (), "import failed", source=ref)
