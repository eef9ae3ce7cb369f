"""The ``gradcheck-bi`` command: one Typer app, one module per command, one error handler.

* :mod:`.run` — ``gradcheck-bi run``, the checks and the gate;
* :mod:`.plot` — ``gradcheck-bi plot``, FD error against step size;
* :mod:`.options` — option choices, parsers and output writing they share.

:func:`main` maps every failure to one line on stderr and the contract's exit code;
``--debug`` shows tracebacks.
"""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.24 vendors click; older releases (e.g. on GPU images) depend on it
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[no-redef]

from gradcheck_bi.cli.options import UsageError
from gradcheck_bi.cli.plot import plot_command
from gradcheck_bi.cli.run import run_command
from gradcheck_bi.gate import EXIT_INTERRUPTED, EXIT_USAGE
from gradcheck_bi.vocab import KernelLoadError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Prove a batch-invariant RMSNorm's hand-written backward right or wrong.",
)


@app.callback()
def _root() -> None:
    """Prove a batch-invariant RMSNorm's hand-written backward right or wrong."""


app.command("run")(run_command)
app.command("plot")(plot_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the Typer app and map every failure to one line and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args

    def err_line(text: str) -> None:  # one line, never wrapped to the terminal width
        sys.stderr.write(" ".join(text.split()) + "\n")

    try:
        rv = app(args=args, prog_name="gradcheck-bi", standalone_mode=False)
    except ClickUsageError as exc:
        err_line(f"gradcheck-bi: error: {exc.format_message()}")
        return EXIT_USAGE
    except (UsageError, KernelLoadError) as exc:
        if debug:
            raise
        err_line(f"gradcheck-bi: error: {exc}")
        return EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        err_line("gradcheck-bi: interrupted; partial results discarded")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        err_line(f"gradcheck-bi: error: {type(exc).__name__}: {exc}")
        return EXIT_USAGE
    if rv == EXIT_INTERRUPTED:
        # Typer >= 0.2x turns Ctrl-C inside a command into a silent Exit(130) that returns
        # here (older releases raise Abort, handled above); no command returns 130 itself.
        err_line("gradcheck-bi: interrupted; partial results discarded")
    return rv if isinstance(rv, int) else 0
