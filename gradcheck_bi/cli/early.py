"""What is settled before torch is imported: bad usage found in the first second.

``main`` calls :func:`preflight` on the raw arguments before it loads the commands (and
torch with them), so that a report that could never be written — a missing folder, a
folder given as a file, a place nothing can be created in (``/proc``) — is refused at once
with one line and exit 2, instead of after a sweep whose results are then thrown away.
The commands call :func:`check_paths` again with their parsed options (the same checks,
the same messages), so they hold when the app is driven without ``main``.

Nothing here imports torch, and nothing else in the package is imported.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path


class UsageError(Exception):
    """Bad usage or input: one line on stderr, exit 2."""


def check_writable(path: Path, option: str) -> None:
    """Refuse ``path`` as a file to write unless a file can really be created beside it.

    >>> check_writable(Path("/no/such/r.json"), "--output")
    Traceback (most recent call last):
    ...
    gradcheck_bi.cli.early.UsageError: --output /no/such/r.json: folder /no/such does not exist
    """
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; name a file to write")
    if path.exists() and not path.is_file():  # /dev/null: a rename would replace the device
        raise UsageError(f"{option} {path}: not a regular file; name a file to write")
    folder = Path(os.path.abspath(path)).parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{option} {path}: folder {folder} {what}")
    try:  # the only honest test of "can a file be created here" is creating one
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".probe")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{option} {path}: cannot create a file in {folder} ({reason})"
                         ) from None
    os.close(fd)
    os.unlink(probe)


def check_paths(*, output: Path | None = None, baseline: Path | None = None,
                update_baseline: bool = False, plot: str | None = None) -> None:
    """Every path a command will write (or embed), checked before anything runs."""
    if output is not None:
        check_writable(output, "--output")
    if update_baseline and baseline is not None:
        check_writable(baseline, "--baseline")
    if plot is not None and "://" not in plot:
        image = Path(plot)
        if not image.is_file():
            raise UsageError(f"--plot {plot}: no such image; draw it first with "
                             f"`gradcheck-bi plot --output {plot}`")


def _values(args: Sequence[str], option: str) -> list[str]:
    """Every value given to ``option`` as ``--opt V`` or ``--opt=V``."""
    found = []
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            found.append(args[i + 1])
        elif arg.startswith(option + "="):
            found.append(arg[len(option) + 1:])
    return found


def preflight(args: Sequence[str]) -> None:
    """Check the paths named on the raw command line of ``run`` or ``plot``.

    Only what is unambiguous is checked (the last value of each option, as the parser keeps
    it); anything malformed is left to the parser and its own message.
    """
    if "--" in args:
        args = args[: list(args).index("--")]
    command = next((a for a in args if not a.startswith("-")), None)
    if command not in ("run", "plot") or "-h" in args or "--help" in args:
        return
    last: dict[str, str | None] = {
        opt: next(reversed(_values(args, opt)), None) for opt in ("--output", "--baseline",
                                                                   "--plot")}
    output, baseline, plot = last["--output"], last["--baseline"], last["--plot"]
    check_paths(
        output=Path(output) if output else None,
        baseline=Path(baseline) if baseline else None,
        update_baseline="--update-baseline" in args,
        plot=plot if command == "run" else None,
    )


# Whether main() runs as the program (its own process: the console script, python -m), not
# as a function called inside someone else's process: only then is the process known never
# to have run a parallel torch region (gradcheck_bi.fd.threads.start_serial).
_as_program = False


def running_as_program(yes: bool) -> None:
    global _as_program
    _as_program = yes


def as_program() -> bool:
    """Whether ``main`` was started as the program (see ``_as_program``)."""
    return _as_program
