"""Help and terminal output at 80 columns: no word or metavar cut in two, no line wider than
the terminal, no ``<bool>`` on a flag, and each command's own exit codes.

A word Rich had to cut shows as two tokens that the same help at 200 columns does not have
(``batch_invari`` / ``ance``); the comparison is per option row, so a cut is named with its
option.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from functools import cache

import pytest
from typer.testing import CliRunner

from gradcheck_bi.cli import app

COMMANDS = ["", "run", "plot", "kernels"]


@cache
def _run(*args: str, columns: int) -> str:
    result = CliRunner().invoke(app, list(args), prog_name="gradcheck-bi",
                                env={"COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _help(command: str, columns: int) -> str:
    return _run(*([command] if command else []), "-h", columns=columns)


def _blocks(text: str) -> dict[str, Counter[str]]:
    """The words of each option (or command) row inside the panels, and of the text around
    them, keyed by the row's first word ('' for the text outside the panels)."""
    blocks: dict[str, Counter[str]] = {"": Counter()}
    key = ""
    for line in text.splitlines():
        inside = line.startswith("│") and line.endswith("│")
        if not inside:
            key = ""
            if not line.startswith(("╭", "╰")):
                blocks[""].update(line.split())
            continue
        body = line[1:-1]
        if body[1:2].strip():  # a new row: its first column is not blank
            key = body.split()[0]
            blocks.setdefault(key, Counter())
        blocks[key].update(body.split())
    return blocks


def _cut_words(narrow: str, wide: str) -> list[str]:
    cuts = []
    wide_blocks = _blocks(wide)
    for key, words in _blocks(narrow).items():
        extra = words - wide_blocks.get(key, Counter())
        if extra:
            cuts.append(f"{key or '(text)'}: {' '.join(sorted(extra))}")
    return cuts


# A line of text outside the panels that starts an entry of its own (not a continuation).
ENTRY = re.compile(r"(\d+ |Exit codes:|With |Usage:|gradcheck-bi |Each command)")


def _broken_twice(text: str, width: int) -> list[str]:
    """Lines outside the panels broken before Rich had to: the next line's first word would
    have fitted (a line break in the source, then Rich's own)."""
    prose = [ln.strip() for ln in text.splitlines() if not ln.startswith(("│", "╭", "╰"))]
    return [f"{a!r} / {b!r}" for a, b in itertools.pairwise(prose)
            if a and b and not ENTRY.match(b) and len(a) + 1 + len(b.split()[0]) <= width - 2]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_prose_breaks_only_where_rich_wraps(command: str) -> None:
    ragged = _broken_twice(_help(command, 80), 80)
    assert not ragged, f"{command or 'gradcheck-bi'} -h breaks lines twice: {ragged}"


def test_the_ragged_detector_sees_a_source_line_break() -> None:
    assert _broken_twice(" 1 a result not as expected: a defect missed,\n a kernel that "
                         "raised.\n 2 bad usage.\n", 80) == [
        "'1 a result not as expected: a defect missed,' / 'a kernel that raised.'"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_without_cutting_a_word(command: str) -> None:
    narrow, wide = _help(command, 80), _help(command, 200)
    long = [ln for ln in narrow.splitlines() if len(ln) > 80]
    assert not long, f"{command or 'gradcheck-bi'} -h: {len(long)} lines over 80: {long[0]!r}"
    cuts = _cut_words(narrow, wide)
    assert not cuts, f"{command or 'gradcheck-bi'} -h at 80 columns cuts " + "; ".join(cuts)
    typed_flags = [ln.strip("│ ") for ln in narrow.splitlines() if "<bool>" in ln]
    assert not typed_flags, f"a flag shows a type: {typed_flags}"


def test_the_cut_detector_sees_a_cut_metavar() -> None:
    wide = "╭─ x ─╮\n│ --check   forward|dx|dw|batch_invariance   Which. │\n╰─╯\n"
    narrow = ("╭─ x ─╮\n│ --check   forward|dx|dw|batch_invari   Which. │\n"
              "│           ance                              │\n╰─╯\n")
    assert _cut_words(narrow, wide) == ["--check: ance forward|dx|dw|batch_invari"]
    assert _cut_words(wide, wide) == []


@pytest.mark.parametrize(("command", "has", "lacks"), [
    ("run", ["0 every", "1 a result", "2 bad", "3 nothing wrong", "4 internal error",
             "130 interrupted", "125", "255"], []),
    ("plot", ["0 drawn", "2 bad", "3 could not run", "4 internal error", "130"],
     ["--bisect", "125", "255", "--strict", "baseline"]),
    ("kernels", ["0 listed", "4 internal error"], ["--bisect", "125", "1 a result"]),
    ("", ["gradcheck-bi COMMAND -h"], ["125", "--bisect"]),
])
def test_each_command_lists_its_own_exit_codes(command: str, has: list[str],
                                               lacks: list[str]) -> None:
    text = " ".join(_help(command, 200).split())
    epilog = text[text.rindex("╯") + 1:]
    for needle in has:
        assert needle in epilog, f"{command} -h: no {needle!r} in {epilog!r}"
    for needle in lacks:
        assert needle not in epilog, f"{command} -h: {needle!r} is not its own: {epilog!r}"


@pytest.mark.parametrize("args", [
    ["plot", "--shape", "2,16", "--steps", "-20:-2"],
    ["kernels"],
])
def test_terminal_output_fits_80_columns(args: list[str]) -> None:
    out = _run(*args, columns=80)
    long = [ln for ln in out.splitlines() if len(ln) > 80]
    assert not long, f"{' '.join(args)}: {len(long)} lines over 80, e.g. {long[0]!r}"


def test_no_option_is_named_after_its_metavar() -> None:
    # typer 0.27 (the GPU image's) names an option declared without "--name" after its
    # metavar when the metavar is the name upper-cased: `--op` was registered as `--OP`
    # there, and `run --op log_softmax` failed with "No such option: --op".
    import ast
    from pathlib import Path

    cli = Path(__file__).resolve().parent.parent / "gradcheck_bi" / "cli"
    risky = []
    for path in sorted(cli.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for arg in fn.args.args + fn.args.kwonlyargs:
                for call in ast.walk(arg.annotation) if arg.annotation else ():
                    if not (isinstance(call, ast.Call)
                            and getattr(call.func, "attr", "") == "Option"):
                        continue
                    named = any(isinstance(a, ast.Constant) and str(a.value).startswith("-")
                                for a in call.args)
                    metavar = next((k.value.value for k in call.keywords if k.arg == "metavar"
                                    and isinstance(k.value, ast.Constant)), None)
                    if not named and metavar == arg.arg.upper():
                        risky.append(f"{path.name}: {arg.arg} (metavar {metavar!r})")
    assert not risky, f"give these options their name explicitly: {risky}"
