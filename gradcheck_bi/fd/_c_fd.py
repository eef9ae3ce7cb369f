"""The finite-difference level sums on CPU in one pass, compiled from C with the system's
compiler and loaded with ctypes.

The same sums as the torch path of :func:`gradcheck_bi.fd.reduce.level_sums`, bit for bit
(``_level_sums.c`` says how: each term rounded once in fp64, the fixed order of
:func:`~gradcheck_bi.sums.reduction.row_sum`, no fused multiply-add, no reassociation), and as
numba's (:mod:`gradcheck_bi.fd._numba_fd`), at numba's speed without its start: a process
loads the built library in well under a millisecond where numba's import and cached code
take ~0.5 s, so every CPU check uses it, an (8, 1024) one included.

Built once per machine on first use (~0.25 s with gcc) into a cache directory
(``GRADCHECK_BI_CACHE``, else ``$XDG_CACHE_HOME/gradcheck-bi``, else
``~/.cache/gradcheck-bi``) under a name that hashes the source, the flags and the compiler,
written to a temporary file and renamed (processes that build at once each write their
own); a build that fails leaves the compiler's messages beside it (``.failed``) and is not
tried again with those flags. On x86-64
with AVX2 (all of x86-64-v3 in ``/proc/cpuinfo``) it is built for that level: 1.4× faster
than the baseline vectors here, the same bits. The compiler is ``$CC`` or ``cc``;
``GRADCHECK_BI_CC=0`` turns this path off. Before its first use a process checks the loaded
library against the torch path on a small chunk of random outputs (fp32 and fp64, a padded
block); a library that differs in one bit, a compiler missing or failing, an unwritable
cache: the path is off for the process (numba or the torch ops take the sums, same bits;
:func:`gradcheck_bi.fd.reduce.c_ready`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from gradcheck_bi.fd._one_pass import chunk_rows, result_for
from gradcheck_bi.sums.blocking import MAX_BLOCK_D

SOURCE = Path(__file__).with_name("_level_sums.c")
FLAGS = ("-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
# x86-64-v3's features as /proc/cpuinfo names them (lzcnt is "abm")
_V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "abm", "xsave"}
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# ys, levels, M, R, D, y0, g, odd, even, max block, out and its three strides
_ARGS: list[Any] = [_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, ctypes.c_int, ctypes.c_int,
                    _I64, _PTR, _I64, _I64, _I64]


def allowed() -> bool:
    """``GRADCHECK_BI_CC=0`` turns the compiled C sums off."""
    return os.environ.get("GRADCHECK_BI_CC", "1") != "0"


def _flag_sets() -> list[tuple[str, ...]]:
    """The flags to try, best first: x86-64-v3 where this CPU has all of it, then baseline."""
    if platform.machine() in ("x86_64", "AMD64"):
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line.split(":", 1)[1].split() for line in f
                              if line.startswith("flags")), [])
        except OSError:
            flags = []
        if _V3 <= set(flags):
            return [(*FLAGS, "-march=x86-64-v3"), FLAGS]
    return [FLAGS]


def cache_dir() -> Path:
    """Where built libraries are kept (see the module docstring)."""
    given = os.environ.get("GRADCHECK_BI_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradcheck-bi"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def _target(flags: tuple[str, ...]) -> Path:
    """The library's path for ``flags``: the source, the flags and the compiler hashed."""
    said = " ".join([*flags, str(_compiler())]).encode()
    key = hashlib.sha256(SOURCE.read_bytes() + said).hexdigest()[:16]
    return cache_dir() / f"level_sums-{platform.machine()}-{key}.so"


def built() -> Path | None:
    """The library this machine would load, if it is built already (nothing is compiled)."""
    if not allowed():
        return None
    for flags in _flag_sets():
        path = _target(flags)
        if path.is_file():
            return path
    return None


def _build(flags: tuple[str, ...], path: Path) -> bool:
    """Compile to ``path``; a compiler that refuses these flags leaves its messages in
    ``path`` + ``.failed``, and no process of this machine tries them with it again."""
    compiler = _compiler()
    failed = path.with_suffix(".failed")
    if compiler is None or failed.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, "-o", tmp, str(SOURCE)], capture_output=True,
                              timeout=120, check=False)
        if done.returncode != 0:
            failed.write_bytes(done.stdout + done.stderr)
            return False
        os.replace(tmp, path)
        return True
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, built first if needed; ``None`` where it cannot be built or
    loaded. (Whether a check uses it — ``GRADCHECK_BI_CC``, a forced backend, its bits
    against the torch path's — is :func:`gradcheck_bi.fd.reduce.c_ready`'s to say: this
    answer is kept for the process, so it reads no setting that may change.)"""
    for flags in _flag_sets():
        path = _target(flags)
        try:
            if not path.is_file() and not _build(flags, path):
                continue
            lib = ctypes.CDLL(str(path))
        except (OSError, subprocess.SubprocessError):
            continue
        for fn in (lib.level_sums_double, lib.level_sums_float):
            fn.argtypes, fn.restype = _ARGS, ctypes.c_int
        return lib
    return None


def _call(lib: ctypes.CDLL, ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor, odd: bool,
          even: bool, out: torch.Tensor) -> None:
    n_r, n_cols = g.shape
    rows = chunk_rows(ys, n_r, n_cols)
    view = out.view(out.shape[0], rows.shape[1], n_r)
    fn = lib.level_sums_double if ys.dtype == torch.float64 else lib.level_sums_float
    if fn(rows.data_ptr(), ys.shape[0] // 2, rows.shape[1], n_r, n_cols, y0.data_ptr(),
          g.data_ptr(), int(odd), int(even), MAX_BLOCK_D, view.data_ptr(), *view.stride()):
        raise MemoryError("the compiled level sums could not allocate their accumulator")


def level_sums(ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor, odd: bool, even: bool,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``(odd·L + even·L, *ys.shape[1:-1])`` fp64 sums of a CPU ``ys`` ``(2L, ..., R, D)``
    in fp32 or fp64, with ``y0`` and ``g`` of ``(R, D)``; see the module docstring. With
    ``out`` (fp64 CPU, that shape, any strides) the sums are written there, no copy."""
    out = result_for(ys, odd, even, out)
    if y0.shape != g.shape:
        raise ValueError(f"y0 {tuple(y0.shape)} and g {tuple(g.shape)} must be the same (rows, D)")
    lib = library()
    if lib is None:
        raise RuntimeError("the compiled C level sums are not available here")
    _call(lib, ys, y0.detach().to(torch.float64).contiguous(),
          g.detach().to(torch.float64).contiguous(), odd, even, out)
    return out
