"""``gradcheck-bi ops``: the ops a kernel can compute, what each takes and is checked for,
and the parameter names by which a kernel's signature is recognised as one of them."""

from __future__ import annotations

import sys
import textwrap

from gradcheck_bi.ops import DEFAULT_OP, ROWS, SHAPED, Op
from gradcheck_bi.ops.names import ROLE_NAMES, names_of
from gradcheck_bi.ops.shaped import Axis, Role, ShapedOp

WIDTH = 80


def _marked_by(op: Op) -> str:
    """``a required residual``; ``a z (required, or with group_size / norm_before_gate)``."""
    if op.optional_marks:
        return (f"a {' / '.join(op.marks)} (required, or with "
                f"{' / '.join(op.optional_marks)})")
    return f"a required {' / '.join(op.marks)}"


def rules() -> str:
    """How a kernel's op is read: its parameter names (each op's marks), then its own name,
    then its output (kernels/adapting/recognise.py)."""
    marked = "; ".join(f"{_marked_by(op)} → {op.name}" for op in ROWS.values()
                       if op.marks and "bias" not in op.marks)
    biased = " or ".join(op.name + (" with a bias" if op.param("bias").optional else "")
                         for op in ROWS.values() if op.has("bias") and not op.has("z")
                         and not op.inputs[1:])
    return "\n".join(_wrap(
        f"A kernel's op is read from its parameter names: {marked}; a required bias → a "
        f"norm with one ({biased}). Among the ops they leave, the kernel's own name (its "
        f"function's or class's: layer_norm, rms, gated, add_rms) decides, else one call "
        f"of its forward against each op's fp64 reference, which also finds the variant "
        f"(no weight, a bias, γ = 1 + w, a gated norm's fixed groups, gate order and "
        f"activation). An output matching no op is refused in one line; {DEFAULT_OP} only "
        f"where its names or its output say so, or its forward cannot run here to tell. "
        f"An optional residual=None or prenorm=False keeps its default. --op NAME says "
        f"the op instead.", "", "")) + "\n"


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False)


def _options(op: Op) -> list[str]:
    """``eps``, …, and the op's own options with their values (the blind one marked)."""
    own = [f"{a.name} ({'/'.join(str(v) for v in a.values)}"
           + (f", {a.blind} blind" if a.blind is not None else "") + ")" for a in op.axes]
    return [*op.options, *own]


def _role(r: Role) -> str:
    how = ", ".join(w for w in ("integer" if r.kind == "index" else
                                "no gradient" if not r.grad else "",
                                "optional" if r.optional else "") if w)
    names = ", ".join(dict.fromkeys((r.name, *r.names)))
    return f"{r.name} ({', '.join(r.axes)}{'; ' + how if how else ''}; names {names})"


def _axis(a: Axis) -> str:
    blind = f", {a.blind} blind" if a.blind is not None or a.values[0] is None else ""
    return (f"{a.name} ({'/'.join(str(v) for v in a.values)}{blind}"
            f"{'' if a.passed else ', a control'})")


def _shaped(op: ShapedOp) -> list[str]:
    """An op of any shape: its tensors with their axes and names, its options and controls
    (the blind value of each), outputs, checks, default shape."""
    outputs = ", ".join(f"{o.name} ({', '.join(o.axes) or 'scalar'})" for o in op.outputs)
    lines = [op.name]
    lines += _wrap(op.summary, "  ", "  ")
    lines += _wrap(f"tensors {', '.join(_role(r) for r in op.roles)}; options "
                   f"{', '.join(_axis(a) for a in op.axes) or 'none'}; outputs {outputs}",
                   "  ", "    ")
    shape = ",".join(str(n) for n in op.default_shape)
    lines += _wrap(f"checks {', '.join(op.checks)}; default --shape {shape} "
                   f"{op.shape_words}", "  ", "    ")
    return lines


def ops_command() -> int:
    """List the ops, their inputs, parameters, outputs and checks, and the parameter names
    that recognise them."""
    out: list[str] = []
    for op in ROWS.values():
        params = ", ".join(f"{p.name} ({'optional, ' if p.optional else ''}"
                           f"{'γ' if p.name == 'weight' else 'β'} controls "
                           f"{'/'.join(p.controls)})" for p in op.params)
        out += [op.name]
        out += _wrap(op.summary, "  ", "  ")
        out += _wrap(f"inputs {', '.join(op.inputs)}; parameters {params or 'none'}; "
                     f"options {', '.join(_options(op)) or 'none'}; outputs "
                     f"{', '.join(op.outputs)}", "  ", "    ")
        out += _wrap(f"checks {', '.join(op.checks)}", "  ", "    ")
        out += [""]
    for shaped in SHAPED.values():  # a generic check's op (registered by a run) is none
        if shaped.independent:
            out += [*_shaped(shaped), ""]
    out += ["Parameter names, by role (case-insensitive):"]
    for role in ROLE_NAMES:
        out += _wrap(names_of(role), f"  {role:<17} ", " " * 20)
    sys.stdout.write("\n".join(out) + "\n\n" + rules())
    return 0
