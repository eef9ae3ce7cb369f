"""A kernel's signature, where ``inspect`` cannot read it from a compiled builtin's docstring.

torch's C++ functions (``torch.nn.functional.linear``, ``torch.mm``) carry no
``__signature__`` and no ``__text_signature__``, so :func:`inspect.signature` refuses them;
their docstring's first line states it (``linear(input, weight, bias=None) -> Tensor``).
:func:`signature` reads that line when ``inspect`` cannot, and only when every default in it
is a literal (``None``, a number, a string): a default it cannot read would be called as
something else, so such a kernel stays unreadable.

>>> import torch.nn.functional as F
>>> str(signature(F.linear))
'(input, weight, bias=None)'
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from typing import Any

_LINE = re.compile(r"^\s*([A-Za-z_]\w*)\((.*)\)\s*(->.*)?$")


def signature(fn: Callable[..., Any]) -> inspect.Signature:
    """:func:`inspect.signature` of ``fn``, else the one its docstring's first line states
    under its own name; raises as ``inspect`` did where neither can be read."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        found = _from_doc(fn)
        if found is None:
            raise
        return found


def _from_doc(fn: Any) -> inspect.Signature | None:
    lines = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    match = _LINE.match(lines[0]) if lines else None
    if match is None or match.group(1) != getattr(fn, "__name__", None):
        return None
    try:
        tree = ast.parse(f"def _({match.group(2)}): pass").body[0]
    except SyntaxError:
        return None
    assert isinstance(tree, ast.FunctionDef)
    args = tree.args
    if args.vararg is not None or args.kwarg is not None:
        return None
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    kinds = ([inspect.Parameter.POSITIONAL_ONLY] * len(args.posonlyargs)
             + [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(args.args))
    params = []
    try:
        for a, kind, d in [*zip(positional, kinds, defaults, strict=True),
                           *((a, inspect.Parameter.KEYWORD_ONLY, d)
                             for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True))]:
            default = inspect.Parameter.empty if d is None else ast.literal_eval(d)
            params.append(inspect.Parameter(a.arg, kind, default=default))
        return inspect.Signature(params)
    except ValueError:  # a default that is no literal (torch.float32), or out of order
        return None


__all__ = ["signature"]
