"""A point of a sweep, described once: one :class:`Axis` per field of a
:class:`~gradcheck_bi.vocab.Config`.

In the spirit of an OpInfo record, each axis says once what every other place would
otherwise spell again: its Config field, its public name (the :class:`~gradcheck_bi.vocab.
Result` field and JSON key: ``weight`` for the field ``control``), its case-file key (also the
API keyword; plural for an axis a sweep crosses: ``weights``, ``shapes``), how a value is
checked and converted (the same rule and message for a case file, the API and the command
line), its choices, its default (Config's), whether the JSON carries it (always, only for the
ops other than rms_norm, or never), whether it sets the check's tolerance (a *setting*,
``None`` in a result where it does not act) and its ``run`` option. The table is in the
JSON's order; derived from it:

* :func:`public` — the point's fields of a Result (:func:`gradcheck_bi.gate.judge.judge`);
* :data:`KEY_NAMES` (a baseline's key), :data:`SETTING_NAMES`; ``vocab.OP_FIELDS`` (below
  this module, it writes the JSON) is checked against the table;
* :func:`spelled`, :func:`op_words` — an axis as the reports write it (``γ=randn``);
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
gradcheck_bi.point.BadValue: a non-empty list of γ controls (randn, ones, zeros)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from gradcheck_bi import fd
from gradcheck_bi.kernels.calling.layout import LAYOUTS
from gradcheck_bi.ops import ALL_CHECKS, BIAS_CONTROLS, OPS
from gradcheck_bi.vocab import (
    CONTROLS,
    DEVICES,
    DTYPES,
    NORM_ONLY,
    OP_FIELDS,
    PRECISIONS,
    Config,
    did_you_mean,
)

MODES = ("full", "directional")


# --- value rules: each returns the converted value or raises BadValue(what was expected) ---


class BadValue(Exception):
    """A value an axis does not take; ``str()`` is what was expected."""

    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(what)
        self.hint = hint  # " (did you mean 'randn'?)" for a near miss


def _number(v: Any, what: str, ok: Callable[[float], bool]) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(float(v)):
        raise BadValue(what)
    return float(v)


def positive(v: Any) -> float:
    return _number(v, "a finite number > 0", lambda f: math.isfinite(f) and f > 0)


def nonnegative(v: Any) -> float:
    return _number(v, "a finite number >= 0", lambda f: math.isfinite(f) and f >= 0)


def list_of(item: Callable[[Any], Any], what: str) -> Callable[[Any], list[Any]]:
    """A rule for a non-empty list of ``item`` s (``what``: what the list holds)."""
    def convert(v: Any) -> list[Any]:
        if not isinstance(v, list) or not v:
            raise BadValue(f"a non-empty list of {what}")
        try:
            return [item(x) for x in v]
        except BadValue as exc:
            raise BadValue(f"a non-empty list of {what}", exc.hint) from None

    return convert


def choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        if not isinstance(v, str) or v not in options:
            raise BadValue("one of " + ", ".join(repr(o) for o in options),
                           did_you_mean(v, options))
        return v

    return convert


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadValue("true or false")
    return v


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


def group_size(v: Any) -> int | None:
    if v == "D":
        return None  # one group per row
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BadValue("an integer >= 1, or D (one group per row)")
    return v


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


@dataclass(frozen=True)
class Axis:
    """One field of a point. ``value`` checks and converts one value of it; ``plural`` (an
    axis a sweep crosses) says what its case key's list holds, ``""`` for one setting per
    sweep. ``key`` is the case-file key and API keyword, ``None`` where a case does not set
    it (``device``/``dtype`` come as ``targets``, ``op`` from the kernel)."""

    field: str
    value: Callable[[Any], Any]
    key: str | None
    plural: str = ""
    name: str = ""  # the Result field and JSON key; "" = the field's own name
    json: str = "always"  # "always", "op" (only for ops other than rms_norm), "never"
    setting: bool = False  # sets the check's tolerance (checks.TOLERANCE_SETTINGS)
    cli: str | None = None  # the `run` option that overrides it
    choices: tuple[str, ...] = ()
    # How a word of the command line reads as a value (None: as the option typed it), and
    # whether a whole flag is one value though it holds commas (a shape).
    word: Callable[[str], Any] | None = None
    whole: bool = False
    label: str = ""  # how the reports name it ("γ", "β"); "" = the public name

    @property
    def public(self) -> str:
        return self.name or self.field

    @property
    def default(self) -> Any:
        f = next(f for f in fields(Config) if f.name == self.field)
        return f.default if f.default is not MISSING else None

    @property
    def rule(self) -> Callable[[Any], Any]:
        """The case key's rule: a list of values for a crossed axis, else one value."""
        return list_of(self.value, self.plural) if self.plural else self.value


def _listed(noun: str, options: tuple[str, ...]) -> str:
    return f"{noun} ({', '.join(options)})"


def _chosen(field: str, options: tuple[str, ...], key: str | None, noun: str = "",
            **kw: Any) -> Axis:
    return Axis(field, choice(options), key, _listed(noun, options) if noun else "",
                choices=options, **kw)


AXES: tuple[Axis, ...] = (
    _chosen("check", ALL_CHECKS, "checks", "checks", cli="--check"),
    _chosen("device", DEVICES, None, cli="--device"),
    _chosen("dtype", tuple(DTYPES), None, cli="--dtype"),
    Axis("shape", shape, "shapes", "shapes (lists of positive integers)", cli="--shape",
         word=dims, whole=True),
    Axis("eps", positive, "eps", "finite numbers > 0", cli="--eps"),
    Axis("seed", seed, "seeds", "integers >= 0", cli="--seed"),
    _chosen("control", CONTROLS, "weights", "γ controls", name="weight", cli="--weight",
            label="γ"),
    Axis("zero_centered_gamma", boolean, "zcg", "booleans", cli="--zcg", label="zcg"),
    Axis("input_scale", positive, "input_scales", "finite numbers > 0", label="x-scale"),
    Axis("weight_scale", positive, "weight_scales", "finite numbers > 0", label="γ-scale"),
    _chosen("layout", LAYOUTS, "layouts", "layouts", cli="--layout"),
    Axis("atol", nonnegative, "atol", setting=True, cli="--atol"),
    Axis("rtol", nonnegative, "rtol", setting=True, cli="--rtol"),
    _chosen("mode", MODES, "mode", setting=True, cli="--mode"),
    _chosen("stencil", tuple(fd.STENCILS), "stencil", setting=True),
    Axis("step_rel", positive, "step_rel", setting=True),
    Axis("max_memory", memory, "max_memory", json="never", cli="--max-memory"),
    Axis("directions", count, "directions", json="never", cli="--directions"),
    _chosen("op", tuple(OPS), None, json="op", cli="--op"),
    _chosen("bias", BIAS_CONTROLS, "biases", "β controls", json="op", cli="--bias",
            label="β"),
    Axis("group_size", group_size, "group_sizes", "group sizes (integers >= 1, or \"D\")",
         json="op", cli="--group-size", word=lambda w: int(w) if w.isdigit() else w),
    Axis("norm_before_gate", boolean, "norm_before_gate", "booleans", json="op",
         cli="--norm-before-gate"),
    # Not in the JSON as a point field: a result says the precision it was judged at
    # (Result.working_precision) only where that is coarser than its dtype.
    _chosen("precision", PRECISIONS, "precision", json="never", cli="--precision"),
    _chosen("working_precision", tuple(DTYPES), None, json="never"),
    # An op of any shape's own axes at the point (layout, reduction, the cotangent control):
    # a result carries them as ``variant`` (judge), never as point fields of their own.
    Axis("variant", tuple, None, json="never"),
)
AXIS = {a.field: a for a in AXES}
BY_KEY = {a.key: a for a in AXES if a.key is not None}

# Derived: what a baseline keys on (after the kernel), the tolerance settings, the fields
# an RMSNorm result's JSON leaves out, and the case files' (and the API's) point keys.
KEY_NAMES = tuple(a.public for a in AXES if a.json != "never")
SETTING_NAMES = tuple(a.public for a in AXES if a.setting)
CASE_KEYS: dict[str, Callable[[Any], Any]] = {k: a.rule for k, a in BY_KEY.items()}
assert OP_FIELDS == tuple(a.public for a in AXES if a.json == "op"), "vocab.OP_FIELDS"
# What a result of an op of any shape leaves out of its JSON (vocab.NORM_ONLY), read back
NORM_DEFAULTS = {a.public: a.default for a in AXES if a.public in NORM_ONLY}


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


def weight_words(row: dict[str, Any]) -> list[str]:
    """``["γ=randn", "zcg=off"]`` as a result (``row``: by public name) has them; none for
    an op without a weight (log_softmax, swiglu, …), whose one point carries no γ meaning.

    >>> weight_words({"op": "swiglu", "weight": "randn", "zero_centered_gamma": False})
    []
    """
    op = OPS.get(row.get("op", "rms_norm"))
    if op is None or not op.has("weight"):
        return []
    return [spelled(AXIS[f], row[AXIS[f].public]) for f in ("control", "zero_centered_gamma")]


def has_eps(row: dict[str, Any]) -> bool:
    """Whether a result's op takes an eps (swiglu and silu_and_mul do not)."""
    op = OPS.get(row.get("op", "rms_norm"))
    return op is not None and op.has("eps")


def op_words(row: dict[str, Any]) -> list[str]:
    """The axes only the other ops have, as a result (``row``: by public name) has them:
    ``["β=zeros", "group_size=8", "norm_before_gate=on"]``; none for an RMSNorm result."""
    own = [f"{k}={'on' if v is True else 'off' if v is False else v}"
           for k, v in (row.get("variant") or {}).items()]
    return [spelled(a, row[a.public]) for a in AXES
            if a.json == "op" and a.field != "op" and row.get(a.public) is not None] + own
