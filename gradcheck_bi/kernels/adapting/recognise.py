"""Which op a kernel computes, and which variant: read from everything the kernel shows.

Three things are read, in this order of authority:

* its **parameters** (:mod:`gradcheck_bi.ops.names`): a required ``residual`` (residual, R,
  res) → ``fused_add_rms_norm``; a ``z`` (z, gate) that is required, or comes with
  ``group_size`` / ``norm_before_gate`` → ``rms_norm_gated``; a required ``bias`` → a norm
  with a bias (``layer_norm``, or an RMSNorm with a bias); a weight → an op with one. They
  decide which ops the kernel **may** compute (:func:`allowed`); two ops marked at once is a
  :class:`KernelLoadError` naming the parameters (exit 2);
* its **own names** (the function's or class's, then its module's; ``OP_WORDS``): among the
  ops allowed, the one its name says (``CohereLayerNorm`` → layer_norm);
* its **output** (:mod:`.behaviour`): one forward call at a small random fp64 point, which
  decides what the names leave open (RMSNorm or LayerNorm; a bias used or not; γ or 1 + γ;
  the groups and gate order of a gated norm without those parameters).

A wrong op is never explained away: where the names decide one op and the output matches
another (an ``RMSNorm`` whose forward subtracts the mean), the kernel is checked as the named
op, and :attr:`Recognition.mismatch` says what its output matches and how to check it as that
(``--op layer_norm``), for its failed forward to say. An output matching no known op is one
line of the note — a defect of the named op — where it moves as every op's does; where it
moves otherwise (:func:`.behaviour.unlike`: x·w + b, rms_norm(x·(1 + w))) it is another
function, :attr:`Recognition.unmatched` as an unnamed one is, and refused. ``--op NAME``
(``forced``) decides instead, read from the names alone.

>>> def fused(X, R, W, eps=1e-6): ...
>>> r = recognise(fused, "fused")
>>> r.op
'fused_add_rms_norm'
>>> r.note
"recognised fused_add_rms_norm from its parameters (X, R, W, eps): 'R' is a residual"
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradcheck_bi.kernels.adapting.behaviour import Seen, Variant
from gradcheck_bi.kernels.adapting.signature import VARIADIC
from gradcheck_bi.kernels.calling.textsig import signature
from gradcheck_bi.ops import DEFAULT_OP, ROWS, Op
from gradcheck_bi.ops.names import GENERIC_NAMES, OP_WORDS, ROLE_OF, ROLE_WORDS, TENSOR_ROLES
from gradcheck_bi.vocab import KernelLoadError

_KEPT = ("residual", "prenorm")  # roles an optional parameter keeps its default for


@dataclass(frozen=True)
class Recognition:
    """The op, the roles each parameter fills (``None``: unknown name) and the note line."""

    op: str
    roles: dict[str, str | None]
    note: str
    # The variant its output matched (its weight, bias, γ or 1 + γ, fixed options), if any.
    variant: Variant | None = None
    # Where the output matches another op than ``op``: what a failed forward adds.
    mismatch: str = ""
    # The op's parameters (weight, bias) the kernel takes: a parameter of that role, a bias
    # only where required or its output uses it; ``None`` where that was not read (--op).
    takes: frozenset[str] | None = None
    # The op was only the default reading (no --op, no name, no parameter marking one) and
    # the output matched no variant of any op: the nearest, and how far (for a refusal).
    unmatched: str = ""
    # Whether the probe's output required grad (:attr:`.behaviour.Seen.grad`).
    grad: bool | None = None
    # What its forward raised at the probe, where it ran nowhere (:attr:`.behaviour.Seen.raised`)
    # and neither its names nor its parameters say the op (a mark, Megatron's own call): the
    # op would be a guess.
    raised: str = ""
    # Its required parameters no role of any op fills (:attr:`.behaviour.Seen.unfilled`),
    # where neither its names nor its parameters say the op and its output (read in
    # Megatron's order) matched none: no op here takes it.
    unfilled: tuple[str, ...] = ()
    # A boolean parameter, the value under which its output matches an op, that op's
    # variant, and the closest at its default, where it matches none there
    # (:attr:`.behaviour.Seen.flip`).
    flip: tuple[str, bool, str, str] | None = None
    # Where ``unmatched`` though its name or parameters say an op: how its output moves
    # unlike every op's here (:attr:`.behaviour.Seen.unlike`) — none of them with a defect.
    unlike: str = ""


def _params(fn: Callable[..., Any], skip_first: bool) -> list[inspect.Parameter]:
    try:
        sig = signature(fn)
    except (TypeError, ValueError):
        return []
    params = [p for p in sig.parameters.values() if p.kind not in VARIADIC]
    return params[1:] if skip_first else params


def roles_of(params: list[inspect.Parameter], op: str | None = None
             ) -> dict[str, str | None]:
    """Each parameter's role by its name (``op``'s own options first: the gated norm's
    ``activation``); with no parameter named as an input, the first is ``x`` (the RMSNorm
    convention)."""
    own = {n: a.name for a in ROWS[op].axes for n in (a.name, *a.names)} if op else {}
    roles: dict[str, str | None] = {p.name: own.get(p.name.lower(), ROLE_OF.get(p.name.lower()))
                                    for p in params}
    if params and "x" not in roles.values() and roles[params[0].name] is None:
        roles[params[0].name] = "x"
    return roles


def snake(name: str) -> str:
    """``CohereLayerNorm`` → ``cohere_layer_norm``, ``RMSNorm`` → ``rms_norm``.

    >>> snake("Qwen3NextRMSNormGated"), snake("fused_add_rms_norm")
    ('qwen3_next_rms_norm_gated', 'fused_add_rms_norm')
    """
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


def named_op(names: list[str]) -> tuple[str, str] | None:
    """``(op, the name that says it)`` from the first of ``names`` whose words name an op."""
    for name in names:
        for pattern, op in OP_WORDS:
            if re.search(pattern, snake(name)):
                return op, name
    return None


def _marked(every: list[inspect.Parameter]) -> tuple[list[Op], set[str | None]]:
    """The ops whose marks the parameters carry, and the roles present."""
    required = {ROLE_OF.get(p.name.lower()) for p in every
                if p.default is inspect.Parameter.empty}
    present = {ROLE_OF.get(p.name.lower()) for p in every}
    chosen = [op for op in ROWS.values()
              if any(m in required for m in op.marks)
              or any(m in present for m in op.optional_marks)]
    # A bias marks a norm with a bias: no second op where another marked one has a bias
    # (mamba's rmsnorm_fn(x, weight, bias, z, eps, group_size, norm_before_gate)).
    return [op for op in chosen if "bias" not in op.marks
            or not any(o.has("bias") for o in chosen if o is not op)], present


def allowed(chosen: list[Op], roles: set[str]) -> tuple[str, ...]:
    """The ops a kernel taking ``roles`` may compute, its marked op first: all its inputs
    taken, a weight where it takes one, eps where it takes one; a bias mark allows any norm
    with a bias (an RMSNorm's is optional)."""
    if chosen and "bias" not in chosen[0].marks:
        return (chosen[0].name,)
    fits = [op.name for op in ROWS.values() if set(op.inputs) <= roles
            and (op.has("weight") or "weight" not in roles)
            and (op.has("eps") or "eps" not in roles)
            and (op.has("bias") or not chosen)]
    first = [chosen[0].name] if chosen else [n for n in fits if n == DEFAULT_OP]
    return tuple(dict.fromkeys(first + fits))


def recognise(fn: Callable[..., Any], what: str, forced: str | None = None,
              extra: list[inspect.Parameter] | None = None,
              skip_first: bool = False, names: list[str] | None = None,
              seen: Seen | None = None, tensors: set[str] | None = None) -> Recognition:
    """The op ``fn`` computes (``forced`` if given), from its parameters' names, then its
    own ``names`` and what its forward was ``seen`` to match (:mod:`.behaviour`).

    ``extra``: more parameters that mark the op (a module constructor's ``group_size``);
    ``skip_first`` drops ``ctx`` from an autograd Function's ``forward``; ``tensors``: a
    module's (D,) parameters by role, where it could be built.
    """
    params = _params(fn, skip_first)
    roles = roles_of(params)
    every = params + list(extra or [])
    named = list(dict.fromkeys(p.name for p in extra or []
                               if ROLE_OF.get(p.name.lower()) is not None
                               and p.name not in {q.name for q in params}))
    listing = f"({', '.join(p.name for p in params)}{'; ' if named else ''}{', '.join(named)})"
    required = {ROLE_OF.get(p.name.lower()) for p in every
                if p.default is inspect.Parameter.empty}
    # An optional residual or prenorm keeps its default (an RMSNorm with residual=None).
    taken = {r for p in params if (r := roles[p.name]) is not None
             and (r not in _KEPT or p.default is inspect.Parameter.empty)}
    taken |= {r for p in extra or [] if (r := ROLE_OF.get(p.name.lower())) is not None
              and r not in TENSOR_ROLES} | (tensors or set())
    unread = not params or (extra is not None and tensors is None)  # not read here
    if forced is not None:
        if forced not in ROWS:
            raise KernelLoadError(f"--op {forced!r}: expected one of {', '.join(ROWS)}")
        return Recognition(forced, roles_of(params, forced),
                           f"op {forced} (given by --op) for {what}{listing}",
                           takes=None if unread else frozenset({"weight", "bias"} & taken))
    by_name = named_op(names or [])
    if seen is not None and seen.unfilled and (
            megatron := seen.match(DEFAULT_OP)) is not None:  # names that say nothing
        return Recognition(DEFAULT_OP, roles, f"recognised {megatron.words} from its output, "
                           f"its parameters {listing} read in Megatron's order (x, weight, eps, "
                           "zero_centered_gamma)", megatron, grad=seen.grad)
    chosen, present = _marked(every)
    if len(chosen) > 1:  # the output decides; one without a backward is refused for that
        found = next((v for v in ((seen or Seen()).match(o.name) for o in chosen)
                      if v is not None), None)
        if found is None and (seen is None or seen.grad is not False):
            closest = f" ({seen.closest})" if seen is not None and seen.closest else ""
            raise KernelLoadError(
                f"kernel {what}{listing}: its parameters fit "
                f"{' and '.join(o.name for o in chosen)}, and its output matches neither"
                f"{closest}; say which with --op NAME (`gradcheck-bi ops` lists the ops)")
        chosen = [ROWS[found.op]] if found is not None else chosen[:1]
    op = chosen[0] if chosen else ROWS[DEFAULT_OP]
    if [r for r in op.needs if r not in present and r not in roles.values()]:
        # a mark among names that say nothing else (f(a, b, c, d), f(x, y, weight, bias)):
        # no op is marked, the output decides
        chosen, op = [], ROWS[DEFAULT_OP]
    why = "; ".join(dict.fromkeys(
        f"{p.name!r} is {ROLE_WORDS[ROLE_OF[p.name.lower()]]}" for p in every
        if ROLE_OF.get(p.name.lower()) in (*op.marks, *op.optional_marks)))
    op_name, note, variant, mismatch = _decide(
        allowed(chosen, taken), by_name, seen or Seen(),
        f"its parameters {listing}" + (f": {why}" if why and chosen else ""), bool(chosen))
    used = {"bias"} if "bias" in required | (tensors or set()) or (
        variant is not None and variant.bias) else set()
    seen = seen or Seen()
    # The op is said by its name, by parameters marking one op alone, or by Megatron's own
    # call. A bias marks any norm with one: a forward that only raises then says nothing
    # of which (PolyNorm's (X, W, B, eps) asserts a W of 3); one that runs with the marked
    # op's every input and matches none is checked as it (a layer norm's defect fails).
    said = by_name is not None or _native(params, roles) or (
        bool(chosen) and len(allowed(chosen, taken)) == 1)
    unmatched = ""
    # (an output that is not finite anywhere near a variant is a broken kernel, which its
    # forward check reports, not another op). Names or parameters saying an op hold an
    # output matching none to that op — its forward fails — unless it moves unlike every
    # op here (``seen.unlike``): then it is another function, refused as the unnamed are.
    # Megatron's own call (x, weight, eps, zero_centered_gamma) says RMSNorm.
    if ((by_name is None and not chosen and not _native(params, roles)) or seen.unlike) \
            and seen.errors \
            and seen.match() is None and seen.errors[0][0] < float("inf"):
        e, nearest = seen.errors[0]
        unmatched = f"{nearest.words} (max relative error {e:.2g})"
    return Recognition(op_name, roles_of(params, op_name), note, variant, mismatch,
                       None if unread else frozenset(({"weight"} & taken)
                                                     | ({"bias"} & taken & used)),
                       unmatched, seen.grad, "" if said else seen.raised,
                       () if said or seen.match() is not None else seen.unfilled,
                       None if seen.flip is None else (*seen.flip, seen.closest),
                       seen.unlike if unmatched and (by_name or chosen) else "")


def _native(params: list[inspect.Parameter], roles: dict[str, str | None]) -> bool:
    """Megatron's ``apply(x, weight, eps, zero_centered_gamma)``, the RMSNorm call this tool
    was written for: its parameters say the op."""
    return [roles[p.name] for p in params] == ["x", "weight", "eps", "zcg"]


def _decide(ops: tuple[str, ...], by_name: tuple[str, str] | None, seen: Seen,
            by_params: str, marked: bool) -> tuple[str, str, Variant | None, str]:
    """The op among ``ops`` its name says, else the one its output matches, else the first;
    the note says from what, and the mismatch what else the output matches."""
    basis = [by_params] if len(ops) == 1 or not ops or marked else []
    seen_wider = None
    if by_name is not None and (wider := GENERIC_NAMES.get(by_name[0])) in ops:
        seen_wider = seen.match(wider) if seen.match(by_name[0]) is None else None
    if by_name is not None and seen_wider is not None and not seen_wider.bias:
        op, basis = seen_wider.op, [*basis, f"its name ({by_name[1]}) taken as the wider "
                                    f"family — no mean subtracted, no bias; --op {by_name[0]} "
                                    "holds it to the name —"]
    elif by_name is not None and by_name[0] in ops:
        op, basis = by_name[0], [*basis, f"its name ({by_name[1]})"]
    elif len(ops) == 1:
        op = ops[0]
    else:
        found = next((v for v in (seen.match(o) for o in ops) if v is not None), None)
        op = found.op if found is not None else (ops[0] if ops else DEFAULT_OP)
        basis = basis if found is not None else [by_params]
    variant = seen.match(op)
    if variant is not None:
        basis.append("its output")
    other = seen.match()
    mismatch = ""
    if variant is None and other is not None:
        mismatch = (f"its output matches {other.words}, not {op}: check it as that with "
                    f"--op {other.op}")
    elif variant is None and seen.errors:
        mismatch = ("its output at a small random fp64 point matches no known op "
                    f"({seen.closest})")
    words = variant.words if variant is not None else op
    said = ", ".join(basis[:-1]) + " and " + basis[-1] if len(basis) > 1 else (
        basis[0] if basis else "its parameters")
    note = f"recognised {words} from {said}"
    if mismatch or seen.why:
        note += f"; {mismatch or seen.closest}"
    # RMSNorm is the default reading: no note for a plain one the output confirms.
    quiet = by_name is None and variant is not None and variant.words == DEFAULT_OP
    return op, "" if quiet else note, variant, mismatch
