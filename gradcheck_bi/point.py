"""A point of a sweep, described once: one :class:`Axis` per field of a
:class:`~gradcheck_bi.vocab.Config`.

In the spirit of an OpInfo record, each axis says once what every other place would
otherwise spell again: its Config field, its public name (the :class:`~gradcheck_bi.vocab.
Result` field and JSON key: ``weight`` for the field ``control``), its case-file key (also the
API keyword; plural for an axis a sweep crosses: ``weights``, ``shapes``), how a value is
checked and converted (the same rule and message for a case file, the API and the command
line), its choices, its default (Config's), whether the JSON carries it (always, only for the
ops that have it, or never), whether it sets the check's tolerance (a *setting*,
``None`` in a result where it does not act) and its ``run`` option. The table is in the
JSON's order. The engine lists its own axes here; an op's (its parameters' controls, the
options its JSON carries) come from its record (:attr:`~gradcheck_bi.ops.record.Op.
point_axes`), so a new one costs the op's module only. Derived from the table:

* :func:`public` — the point's fields of a Result (:func:`gradcheck_bi.gate.judge.judge`);
* :data:`KEY_NAMES` (a baseline's key), :data:`SETTING_NAMES`; ``vocab.OP_FIELDS`` (below
  this module, it writes the JSON) is checked against the table;
* :func:`spelled`, :func:`op_words` — an axis as the reports write it (``γ=randn``);
  :func:`key_words` — an op's own fields as a baseline's drift lines write them;
* :data:`CASE_KEYS` — the case-file keys of the point (:mod:`gradcheck_bi.cases`), the API's
  keywords (:mod:`gradcheck_bi.api`) and the command line's overrides
  (:func:`gradcheck_bi.cli.options.read`).

>>> AXIS["control"].name, AXIS["control"].key, AXIS["control"].cli
('weight', 'weights', '--weight')
>>> SETTING_NAMES
('atol', 'rtol', 'mode', 'stencil', 'step_rel')
>>> CASE_KEYS["weights"](["randn", "ones"])
['randn', 'ones']
>>> CASE_KEYS["weights"](["rand"])
Traceback (most recent call last):
...
gradcheck_bi.ops.fields.BadValue: a non-empty list of γ controls (randn, ones, zeros)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gradcheck_bi import fd
from gradcheck_bi.kernels.calling.layout import LAYOUTS
from gradcheck_bi.ops import ALL_CHECKS, DEFAULT_OP, OPS, ROWS, SHAPED
from gradcheck_bi.ops.fields import BadValue, chosen, nonnegative, positive
from gradcheck_bi.ops.fields import PointAxis as Axis

# Re-exported: the rules a case file, the API and the command line check values with.
from gradcheck_bi.ops.fields import boolean as boolean
from gradcheck_bi.ops.fields import choice as choice
from gradcheck_bi.ops.fields import list_of as list_of
from gradcheck_bi.vocab import (
    DEVICES,
    DTYPES,
    OP_FIELDS,
    PRECISIONS,
    ROW_ONLY,
    Config,
)

MODES = ("full", "directional")


# --- value rules: each returns the converted value or raises BadValue(what was expected);
# the shared ones live with the Axis (gradcheck_bi.ops.fields), below the op records ---


def seed(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadValue("an integer >= 0")
    return v


def count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BadValue("an integer >= 1")
    return v


def shape(v: Any) -> tuple[int, ...]:
    if (not isinstance(v, list) or not v
            or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in v)):
        raise BadValue("a shape: a list of positive integers")
    return tuple(v)


def dims(text: str) -> list[int]:
    """A shape as the command line writes it: ``"2,8,256"``."""
    try:
        out = [int(p) for p in text.split(",")]
    except ValueError:
        out = []
    if not out or any(d <= 0 for d in out):
        raise BadValue("comma-separated positive integers, e.g. 2,8,256")
    return out


def memory(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    if isinstance(v, str):
        try:
            return fd.parse_bytes(v)
        except ValueError:
            pass
    raise BadValue("bytes: a positive integer or a string such as '512M' or '2G'")


# --- the table ----------------------------------------------------------------------------


def _declared(json: str) -> tuple[Axis, ...]:
    """The point's fields the op records declare (a parameter's controls, an option the JSON
    carries) whose JSON presence is ``json``, once each, in the order of :data:`ROWS`."""
    found: dict[str, Axis] = {}
    for op in ROWS.values():
        for a in op.point_axes:
            if a.json == json:
                found.setdefault(a.field, a)
    return tuple(found.values())


# The ops' own fields: those every result carries (γ's) after the seed, those only an op
# that has them carries after the op.
OP_AXES_ALWAYS, OP_AXES_OWN = _declared("always"), _declared("op")
AXES: tuple[Axis, ...] = (
    chosen("check", ALL_CHECKS, "checks", "checks", cli="--check"),
    chosen("device", DEVICES, None, cli="--device"),
    chosen("dtype", tuple(DTYPES), None, cli="--dtype"),
    Axis("shape", shape, "shapes", "shapes (lists of positive integers)", cli="--shape",
         word=dims, whole=True),
    Axis("eps", positive, "eps", "finite numbers > 0", cli="--eps"),
    Axis("seed", seed, "seeds", "integers >= 0", cli="--seed"),
    *OP_AXES_ALWAYS,
    Axis("input_scale", positive, "input_scales", "finite numbers > 0", label="x-scale"),
    Axis("weight_scale", positive, "weight_scales", "finite numbers > 0", label="γ-scale"),
    chosen("layout", (*LAYOUTS, *dict.fromkeys(  # an op of any shape's: its roles strided
        layout for op in SHAPED.values() for layout in (
            *(f"{r.name}-strided" for r in op.roles if r.kind == "float"), "grad-expanded")
        if layout not in LAYOUTS)), "layouts", "layouts", cli="--layout"),
    Axis("atol", nonnegative, "atol", setting=True, cli="--atol"),
    Axis("rtol", nonnegative, "rtol", setting=True, cli="--rtol"),
    chosen("mode", MODES, "mode", setting=True, cli="--mode"),
    chosen("stencil", tuple(fd.STENCILS), "stencil", setting=True),
    Axis("step_rel", positive, "step_rel", setting=True),
    Axis("max_memory", memory, "max_memory", json="never", cli="--max-memory"),
    Axis("directions", count, "directions", json="never", cli="--directions"),
    chosen("op", tuple(OPS), None, json="op", cli="--op"),  # every op `ops` lists
    *OP_AXES_OWN,
    # Not in the JSON as a point field: a result says the precision it was judged at
    # (Result.working_precision) only where that is coarser than its dtype.
    chosen("precision", PRECISIONS, "precision", json="never", cli="--precision"),
    chosen("working_precision", tuple(DTYPES), None, json="never"),
    # An op of any shape's own axes at the point (layout, reduction, the cotangent control):
    # a result carries them as ``variant`` (judge), never as point fields of their own.
    Axis("variant", tuple, None, json="never"),
)
AXIS = {a.field: a for a in AXES}
BY_KEY = {a.key: a for a in AXES if a.key is not None}
# The case keys of the ops' own fields a sweep crosses only where an op has them (a Sweep
# holds their lists in ``options``).
OP_KEYS = frozenset(a.key for a in OP_AXES_OWN if a.key is not None)

# Derived: what a baseline keys on (after the kernel), the tolerance settings, the fields
# an RMSNorm result's JSON leaves out, and the case files' (and the API's) point keys.
KEY_NAMES = tuple(a.public for a in AXES if a.json != "never")
SETTING_NAMES = tuple(a.public for a in AXES if a.setting)
CASE_KEYS: dict[str, Callable[[Any], Any]] = {k: a.rule for k, a in BY_KEY.items()}
assert OP_FIELDS == tuple(a.public for a in AXES if a.json == "op"), "vocab.OP_FIELDS"
# What a result of an op of any shape leaves out of its JSON (vocab.ROW_ONLY), read back
ROW_DEFAULTS = {a.public: a.default for a in AXES if a.public in ROW_ONLY}


def public(cfg: Config, acting: Iterable[str]) -> dict[str, Any]:
    """The point's fields of a :class:`~gradcheck_bi.vocab.Result`, by public name: every
    axis the JSON carries; a setting not among ``acting`` (those that act on the check:
    :data:`gradcheck_bi.checks.TOLERANCE_SETTINGS`) is ``None``."""
    acting = set(acting)
    out = {}
    for a in AXES:
        if a.json == "never":
            continue
        v = getattr(cfg, a.field)
        out[a.public] = (None if a.setting and a.field not in acting
                         else list(v) if isinstance(v, tuple) else v)
    return out


def spelled(axis: Axis, value: Any) -> str:
    """An axis at a value as the reports write it: ``γ=randn``, ``zcg=on``, ``β=zeros``."""
    shown = (("on" if value else "off") if isinstance(value, bool)
             else f"{value:g}" if isinstance(value, float) else value)
    return f"{axis.label or axis.public}={shown}"


def _op(row: dict[str, Any]) -> Any:
    return ROWS.get(row.get("op", DEFAULT_OP))


def weight_words(row: dict[str, Any]) -> list[str]:
    """The controls of its op's parameters that every result carries, as a result (``row``:
    by public name) has them: ``["γ=randn", "zcg=off"]``; none for an op of any shape
    (log_softmax, swiglu, …), whose controls are its variant's.

    >>> weight_words({"op": "log_softmax", "weight": "randn"})
    []
    """
    op = _op(row)
    if op is None:
        return []
    return [spelled(a, row[a.public]) for a in op.point_axes if a.json == "always"]


def key_words(row: dict[str, Any]) -> list[str]:
    """The fields only some ops have, as a baseline's drift line writes them (a result,
    ``row``, by public name): β's control as the reports do, each option its record declares
    by its name and value; none the op lacks or the point leaves unset.

    >>> key_words({"op": "rms_norm_gated", "bias": "randn", "group_size": 64,
    ...            "norm_before_gate": False})
    ['β=randn', 'group 64', 'norm_before_gate False']
    """
    op = _op(row)
    axes = [a for a in (op.point_axes if op is not None else ())
            if a.json == "op" and row.get(a.public) is not None]
    return [f"{a.key_word or a.public} {row[a.public]}" if a.option
            else f"{a.label or a.public}={row[a.public]}" for a in axes]


def has_eps(row: dict[str, Any]) -> bool:
    """Whether a result's op takes an eps (no op of any shape here does)."""
    op = _op(row)
    return op is not None and op.has("eps")


def op_words(row: dict[str, Any]) -> list[str]:
    """The axes only some ops have, as a result (``row``: by public name) has them: β's
    control and the options its op declares as point fields (``["β=zeros", …]``), then its
    own options (``variant``); none for a result of the default op."""
    own = [f"{k}={'on' if v is True else 'off' if v is False else v}"
           for k, v in (row.get("variant") or {}).items()]
    return [spelled(a, row[a.public]) for a in AXES
            if a.json == "op" and a.field != "op" and row.get(a.public) is not None] + own
