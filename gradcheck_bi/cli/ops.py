"""``gradcheck-bi ops``: the ops a kernel can compute, what each takes and is checked for,
and the parameter names by which a kernel's signature is recognised as one of them."""

from __future__ import annotations

import sys
import textwrap

from gradcheck_bi.ops import DEFAULT_OP, OPS, Op
from gradcheck_bi.ops.names import ROLE_NAMES, names_of

WIDTH = 80


def _marked_by(op: Op) -> str:
    """``a required residual``; ``a z (required, or with group_size / norm_before_gate)``."""
    if op.optional_marks:
        return (f"a {' / '.join(op.marks)} (required, or with "
                f"{' / '.join(op.optional_marks)})")
    return f"a required {' / '.join(op.marks)}"


def rules() -> str:
    """How a kernel's op is read from its parameter names, from each op's marks."""
    marked = "; ".join(f"{_marked_by(op)} → {op.name}" for op in OPS.values() if op.marks)
    unmarked = [op.name for op in OPS.values() if not op.marks and op.name != DEFAULT_OP]
    only = f" ({', '.join(unmarked)}: by --op only)" if unmarked else ""
    return "\n".join(_wrap(
        f"A kernel's op is read from its parameter names: {marked}; none of these → "
        f"{DEFAULT_OP}. An optional parameter the op does not need (bias=None, "
        f"residual=None, prenorm=False) keeps its default. --op NAME says the op "
        f"instead{only}.", "", "")) + "\n"


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False)


def ops_command() -> int:
    """List the ops, their inputs, parameters, outputs and checks, and the parameter names
    that recognise them."""
    out: list[str] = []
    for op in OPS.values():
        params = ", ".join(f"{p.name} ({'optional, ' if p.optional else ''}"
                           f"{'γ' if p.name == 'weight' else 'β'} controls "
                           f"{'/'.join(p.controls)})" for p in op.params)
        out += [op.name]
        out += _wrap(op.summary, "  ", "  ")
        out += _wrap(f"inputs {', '.join(op.inputs)}; parameters {params or 'none'}; "
                     f"options {', '.join(op.options) or 'none'}; outputs "
                     f"{', '.join(op.outputs)}", "  ", "    ")
        out += _wrap(f"checks {', '.join(op.checks)}", "  ", "    ")
        out += [""]
    out += ["Parameter names, by role (case-insensitive):"]
    for role in ROLE_NAMES:
        out += _wrap(names_of(role), f"  {role:<17} ", " " * 20)
    sys.stdout.write("\n".join(out) + "\n\n" + rules())
    return 0
