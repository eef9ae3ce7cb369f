"""The Typer app: the three commands, ``--version``, ``-h``, and each command's exit codes."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from gradcheck_bi._version import __version__
from gradcheck_bi.cli.kernels import kernels_command
from gradcheck_bi.cli.merge import merge_command
from gradcheck_bi.cli.ops import ops_command
from gradcheck_bi.cli.plot import plot_command
from gradcheck_bi.cli.run import run_command


def _exit_codes(*entries: str) -> str:
    """One code per line (Typer >= 0.2x keeps an epilog's line breaks; older releases join
    the lines, hence each entry ends in a full stop). Rich wraps each entry to the width."""
    return "\n".join(("Exit codes:", *entries))


RUN_EXIT_CODES = _exit_codes(
    "0 every result as expected.",
    "1 a result not as expected: a defect where none was declared, a declared defect missed, "
    "a kernel that raised, baseline drift; with --strict also unsupported results and a run "
    "that checked nothing.",
    "2 bad usage or input.",
    "3 nothing wrong found, but something could not run here (unsupported), or nothing was "
    "checked at all.",
    "4 internal error of gradcheck-bi (one line; --debug for the traceback).",
    "130 interrupted.",
    "With --bisect: 2, 3 and nothing checked exit 125 (git bisect's skip); 4 exits 255 "
    "(stops the bisection).",
)
PLOT_EXIT_CODES = _exit_codes(
    "0 drawn (the plot judges nothing).",
    "1 the kernel raised (one line naming where, in its own file).",
    "2 bad usage or input (a PNG without matplotlib too).",
    "3 could not run here (no GPU, a kernel refusing the device or dtype).",
    "4 internal error of gradcheck-bi (one line; --debug for the traceback).",
    "130 interrupted.",
)
KERNELS_EXIT_CODES = _exit_codes("0 listed.", "4 internal error of gradcheck-bi.")
MERGE_EXIT_CODES = _exit_codes(
    "0, 1, 3: as the unsharded run would have exited (see run -h).",
    "2 files that are not every shard of one run, or bad usage.",
    "4 internal error of gradcheck-bi (one line; --debug for the traceback).",
)
ROOT_EPILOG = "Each command lists its exit codes: gradcheck-bi COMMAND -h."
HELP = ("Prove a kernel's hand-written backward right or wrong: every gradient against "
        "finite differences of its own forward, per element, at its noise floor.")


def _one_line_per_paragraph(text: str) -> str:
    """A help text whose source lines are joined, so that Rich wraps it to the terminal
    (Typer >= 0.2x keeps the source's line breaks; the lines then break twice)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _flags_show_no_type(params: list[Any]) -> list[Any]:
    """A flag takes no value, so its help shows none (Typer >= 0.2x would print ``<bool>``)."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_show_no_type(super().get_params(ctx))


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_show_no_type(super().get_params(ctx))


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help=HELP,
    epilog=ROOT_EPILOG,
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
    """Prove a kernel's hand-written backward right or wrong."""


def _register(name: str, command: Callable[..., int], epilog: str) -> None:
    app.command(name, cls=_Command, help=_one_line_per_paragraph(command.__doc__ or ""),
                epilog=epilog)(command)


_register("run", run_command, RUN_EXIT_CODES)
_register("plot", plot_command, PLOT_EXIT_CODES)
_register("kernels", kernels_command, KERNELS_EXIT_CODES)
_register("ops", ops_command, _exit_codes("0 listed.", "4 internal error of gradcheck-bi."))
_register("merge", merge_command, MERGE_EXIT_CODES)
