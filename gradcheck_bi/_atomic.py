"""Write a file whole or not at all: a temporary file in the same folder, then a rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[str]:
    fd, tmp = tempfile.mkstemp(dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path``; on any failure ``path`` is left as it was."""
    with _temporary_beside(Path(path)) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


def save_atomically(path: str | os.PathLike[str], save: Callable[[str], None]) -> None:
    """Let ``save(tmp_path)`` write the file, then move it to ``path`` in one rename."""
    with _temporary_beside(Path(path)) as tmp:
        save(tmp)
