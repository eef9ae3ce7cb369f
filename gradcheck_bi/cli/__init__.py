"""The ``gradcheck-bi`` command: one Typer app, one module per command, one error handler.

* :mod:`.commands` — the Typer app (``--version``, ``-h``, exit codes in the help);
* :mod:`.run` — ``gradcheck-bi run``, the checks and the gate;
* :mod:`.plot` — ``gradcheck-bi plot``, FD error against step size;
* :mod:`.kernels` — ``gradcheck-bi kernels``, what ``--kernel`` takes;
* :mod:`.options` — option choices, parsers and output writing they share;
* :mod:`.early` — what is refused before torch is imported (paths that cannot be written).

:func:`main` maps every failure to one line on stderr and the contract's exit code;
``--debug`` shows tracebacks. It imports the commands (and torch) only after
:func:`.early.preflight`, so bad usage and Ctrl-C during start-up are one line too.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

from gradcheck_bi.cli import early
from gradcheck_bi.cli.early import UsageError, preflight

# As in gradcheck_bi.gate.verdict (which imports torch, not yet loaded here). `git bisect run`
# reads 125 as "skip this commit" and anything above 127 as "stop bisecting".
EXIT_USAGE, EXIT_UNSUPPORTED, EXIT_INTERNAL, EXIT_INTERRUPTED = 2, 3, 4, 130
EXIT_BISECT_SKIP, EXIT_BISECT_ABORT = 125, 255


def __getattr__(name: str) -> Any:
    """``cli.app`` and ``cli.run_command`` load the commands (and torch) on first use."""
    if name in ("app", "run_command", "plot_command"):
        from gradcheck_bi.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module 'gradcheck_bi.cli' has no attribute {name!r}")


def _err_line(text: str) -> None:  # one line, never wrapped to the terminal width
    sys.stderr.write(" ".join(text.split()) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the Typer app and map every failure to one line and an exit code."""
    early.running_as_program(argv is None)
    if argv is None:  # before torch and the kernel's library ask (gradcheck_bi.gpu)
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    # Imports (torch, the kernel's library) make little garbage but trigger many full
    # collections over a heap that keeps growing: 0.37 of 2.85 s importing torch and the
    # commands here. The collector is off until the kernels are loaded (cli.execute.measuring
    # turns it on again around run's points and plot's steps, with what was loaded frozen),
    # and back as found after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        code = _main(args, debug)
    except KeyboardInterrupt:  # also while torch is still being imported
        _err_line("gradcheck-bi: interrupted; partial results discarded")
        return EXIT_INTERRUPTED
    finally:
        (gc.enable if collecting else gc.disable)()
    if "--bisect" in args and code in (EXIT_USAGE, EXIT_UNSUPPORTED):
        return EXIT_BISECT_SKIP  # git bisect run: this commit cannot be judged, skip it
    if "--bisect" in args and code == EXIT_INTERNAL:
        return EXIT_BISECT_ABORT  # a bug in gradcheck-bi must stop the bisection, not judge
    return code


def _main(args: list[str], debug: bool) -> int:
    try:
        preflight(args)
    except UsageError as exc:
        _err_line(f"gradcheck-bi: error: {exc}")
        return EXIT_USAGE
    import typer

    from gradcheck_bi.cli.commands import app
    from gradcheck_bi.vocab import KernelLoadError

    try:  # typer >= 0.24 vendors click; older releases (e.g. on GPU images) depend on it
        from typer._click.exceptions import UsageError as ClickUsageError
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
            UsageError as ClickUsageError,
        )

    try:
        rv = app(args=args, prog_name="gradcheck-bi", standalone_mode=False)
    except ClickUsageError as exc:
        _err_line(f"gradcheck-bi: error: {exc.format_message()}")
        return EXIT_USAGE
    except (UsageError, KernelLoadError) as exc:
        if debug:
            raise
        _err_line(f"gradcheck-bi: error: {exc}")
        return EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        _err_line("gradcheck-bi: interrupted; partial results discarded")
        return EXIT_INTERRUPTED
    except Exception as exc:  # not the kernel's (an `error` result), not the input's: ours
        if debug:
            raise
        text = str(exc).strip().splitlines()
        _err_line(f"gradcheck-bi: internal error: {type(exc).__name__}"
                  f"{': ' + text[0] if text else ''} — a bug in gradcheck-bi, not in your "
                  "kernel or input; run again with --debug for the traceback and report it")
        return EXIT_INTERNAL
    if rv == EXIT_INTERRUPTED:
        # Typer >= 0.2x turns Ctrl-C inside a command into a silent Exit(130) that returns
        # here (older releases raise Abort, handled above); no command returns 130 itself.
        _err_line("gradcheck-bi: interrupted; partial results discarded")
    return rv if isinstance(rv, int) else 0
