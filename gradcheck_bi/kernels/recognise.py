"""Which op a kernel computes, read from its parameter names (:mod:`gradcheck_bi.ops.names`).

The roles a kernel's parameters fill decide the op (each op's ``marks``,
:mod:`gradcheck_bi.ops`):

* a required ``residual`` (residual, R, res) → ``fused_add_rms_norm``;
* a required ``bias`` (bias, B, b, beta) → ``layer_norm``;
* a ``z`` (z, gate) that is required, or comes with ``group_size`` / ``norm_before_gate``
  → ``rms_norm_gated``;
* none of these → ``rms_norm``.

An optional parameter the op does not need (``bias=None`` on an RMSNorm function,
``residual=None``, ``prenorm=False``) selects nothing: it keeps its default. Two ops selected
at once is a :class:`KernelLoadError` naming the parameters (exit 2); an op whose other
roles are missing (``f(a, b, c, d)``: ``b`` alone says bias) is left to RMSNorm's rules,
which name what they cannot fill. ``--op NAME`` (``forced``) decides instead.

>>> def fused(X, R, W, eps=1e-6): ...
>>> r = recognise(fused, "fused")
>>> r.op
'fused_add_rms_norm'
>>> r.note
"recognised fused_add_rms_norm from its parameters (X, R, W, eps): 'R' is a residual"
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradcheck_bi.ops import DEFAULT_OP, OPS
from gradcheck_bi.ops.names import ROLE_OF, ROLE_WORDS
from gradcheck_bi.vocab import KernelLoadError

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass(frozen=True)
class Recognition:
    """The op, the roles each parameter fills (``None``: unknown name) and the note line."""

    op: str
    roles: dict[str, str | None]
    note: str


def _params(fn: Callable[..., Any], skip_first: bool) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    params = [p for p in sig.parameters.values() if p.kind not in _VARIADIC]
    return params[1:] if skip_first else params


def roles_of(params: list[inspect.Parameter], op: str | None = None
             ) -> dict[str, str | None]:
    """Each parameter's role by its name (``op``'s own names first); with no parameter
    named as an input, the first is ``x`` (the RMSNorm convention)."""
    own = {n: role for role, names in (OPS[op].names if op else {}).items() for n in names}
    roles: dict[str, str | None] = {p.name: own.get(p.name.lower(), ROLE_OF.get(p.name.lower()))
                                    for p in params}
    if params and "x" not in roles.values() and roles[params[0].name] is None:
        roles[params[0].name] = "x"
    return roles


def recognise(fn: Callable[..., Any], what: str, forced: str | None = None,
              extra: list[inspect.Parameter] | None = None,
              skip_first: bool = False) -> Recognition:
    """The op ``fn`` computes (``forced`` if given), from its parameters' names.

    ``extra``: more parameters that mark the op (a module constructor's ``group_size``);
    ``skip_first`` drops ``ctx`` from an autograd Function's ``forward``.
    """
    params = _params(fn, skip_first)
    roles = roles_of(params)
    every = params + list(extra or [])
    named = list(dict.fromkeys(p.name for p in extra or []
                               if ROLE_OF.get(p.name.lower()) is not None
                               and p.name not in {q.name for q in params}))
    listing = f"({', '.join(p.name for p in params)}{'; ' if named else ''}{', '.join(named)})"
    if forced is not None:
        if forced not in OPS:
            raise KernelLoadError(f"--op {forced!r}: expected one of {', '.join(OPS)}")
        return Recognition(forced, roles_of(params, forced),
                           f"op {forced} (given by --op) for {what}{listing}")
    required = {ROLE_OF.get(p.name.lower()) for p in every
                if p.default is inspect.Parameter.empty}
    present = {ROLE_OF.get(p.name.lower()) for p in every}
    chosen = [op for op in OPS.values()
              if any(m in required for m in op.marks) or any(m in present
                                                            for m in op.optional_marks)]
    if len(chosen) > 1:
        raise KernelLoadError(
            f"kernel {what}{listing}: its parameters fit {' and '.join(o.name for o in chosen)}"
            f"; say which with --op NAME (`gradcheck-bi ops` lists the ops)")
    op = chosen[0] if chosen else OPS[DEFAULT_OP]
    if op.name == DEFAULT_OP:
        return Recognition(op.name, roles, f"recognised {op.name} from its parameters "
                           f"{listing}")
    missing = [r for r in op.needs if r not in present and r not in roles.values()]
    why = "; ".join(dict.fromkeys(
        f"{p.name!r} is {ROLE_WORDS[ROLE_OF[p.name.lower()]]}" for p in every
        if ROLE_OF.get(p.name.lower()) in (*op.marks, *op.optional_marks)))
    if missing:  # a mark among names that say nothing else (f(a, b, c, d)): RMSNorm's rules
        return Recognition(DEFAULT_OP, roles, f"recognised {DEFAULT_OP} from its parameters "
                           f"{listing} (no {', '.join(missing)} for {op.name})")
    return Recognition(op.name, roles,
                       f"recognised {op.name} from its parameters {listing}: {why}")
