"""The Typer app: the three commands, ``--version``, ``-h``, and the exit codes in the help."""

from __future__ import annotations

import typer

from gradcheck_bi._version import __version__
from gradcheck_bi.cli.kernels import kernels_command
from gradcheck_bi.cli.plot import plot_command
from gradcheck_bi.cli.run import run_command

EXIT_CODES = (
    "Exit codes: 0 every result as expected · 1 a result not as expected (a defect where none "
    "was declared, a declared defect missed, a kernel raising, baseline drift) · 2 bad usage "
    "or input · 3 nothing wrong found, but something asked for could not run here "
    "(unsupported) · 125 with --bisect: could not run or bad input (git bisect's skip) · "
    "130 interrupted."
)
HELP = "Prove a batch-invariant RMSNorm's hand-written backward right or wrong."

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help=HELP,
    epilog=EXIT_CODES,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gradcheck-bi {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Prove a batch-invariant RMSNorm's hand-written backward right or wrong."""


app.command("run", epilog=EXIT_CODES)(run_command)
app.command("plot", epilog=EXIT_CODES)(plot_command)
app.command("kernels")(kernels_command)
