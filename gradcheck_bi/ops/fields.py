"""A field of a point, described once, and the rules that check its values; an axis of an
op's sweep (:class:`Axis`).

A :class:`PointAxis` is one field of a :class:`~gradcheck_bi.vocab.Config`: its public name,
its case-file key, how a value is checked and converted, how the reports spell it. The
engine's own fields (check, shape, eps, …) are listed in :mod:`gradcheck_bi.point`; the
fields that belong to an op — a parameter's controls (γ, its zero-centred mode, β), an
option the JSON carries (a statistic's group size, the order of a gate) — are declared by
the op's record (:attr:`~gradcheck_bi.ops.record.Param.axes`,
:attr:`~gradcheck_bi.ops.record.Op.point_options`) and collected from there, so that a new
option of an op costs its module only.

>>> boolean(True), choice(("a", "b"))("b")
(True, 'b')
>>> list_of(boolean, "booleans")([1])
Traceback (most recent call last):
...
gradcheck_bi.ops.fields.BadValue: a non-empty list of booleans
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from gradcheck_bi.vocab import Config, did_you_mean

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


def _asked(values: list[Any] | None, d: int) -> list[Any]:
    return list(values or ())


@dataclass(frozen=True)
class PointAxis:
    """One field of a point. ``value`` checks and converts one value of it; ``plural`` (an
    axis a sweep crosses) says what its case key's list holds, ``""`` for one setting per
    sweep. ``key`` is the case-file key and API keyword, ``None`` where a case does not set
    it (``device``/``dtype`` come as ``targets``, ``op`` from the kernel).

    An op's own axis also says how a sweep crosses it (``swept(asked, d)``: the values at
    row length ``d``, ``asked`` the case's list or ``None``), the value an op's options take
    where a point leaves it unset (``unset``: also the value a plot's point takes), and
    whether it is one of those options (``option``: passed to the op's reference and the
    kernel) or a control of a parameter. A baseline's drift line writes a control as the
    reports do (``β=randn``), an option by ``key_word`` (``""``: its public name) and value."""

    field: str
    value: Callable[[Any], Any]
    key: str | None
    plural: str = ""
    name: str = ""  # the Result field and JSON key; "" = the field's own name
    json: str = "always"  # "always", "op" (only for ops other than the default one), "never"
    setting: bool = False  # sets the check's tolerance (checks.TOLERANCE_SETTINGS)
    cli: str | None = None  # the `run` option that overrides it
    choices: tuple[str, ...] = ()
    # How a word of the command line reads as a value (None: as the option typed it), and
    # whether a whole flag is one value though it holds commas (a shape).
    word: Callable[[str], Any] | None = None
    whole: bool = False
    label: str = ""  # how the reports name it ("γ", "β"); "" = the public name
    swept: Callable[[list[Any] | None, int], list[Any]] = _asked
    unset: Any = None
    option: bool = False
    key_word: str = ""  # how a baseline's drift line names the option ("group 64")

    @property
    def public(self) -> str:
        return self.name or self.field

    @property
    def default(self) -> Any:
        f = next(f for f in fields(Config) if f.name == self.field)
        return f.default if f.default is not MISSING else None

    def unset_at(self, d: int) -> Any:
        """The value a point that leaves this field unset takes, at row length ``d``."""
        return self.swept([self.unset], d)[0]

    @property
    def rule(self) -> Callable[[Any], Any]:
        """The case key's rule: a list of values for a crossed axis, else one value."""
        return list_of(self.value, self.plural) if self.plural else self.value


def listed(noun: str, options: tuple[str, ...]) -> str:
    return f"{noun} ({', '.join(options)})"


def chosen(field: str, options: tuple[str, ...], key: str | None, noun: str = "",
           **kw: Any) -> PointAxis:
    """An axis whose values are ``options`` (a list of them where ``noun`` names it)."""
    return PointAxis(field, choice(options), key, listed(noun, options) if noun else "",
                     choices=options, **kw)


def all_of(*values: Any) -> Callable[[list[Any] | None, int], list[Any]]:
    """``swept`` for an axis a sweep crosses at ``values`` unless a case names its own."""
    return lambda asked, d: list(asked) if asked is not None else list(values)


@dataclass(frozen=True)
class Axis:
    """One axis of the op's sweep: an option given to the kernel (``passed``) or a control
    of the data it gets (the cotangent, a rank, whether a bias is there).

    ``values``: every value swept by default, the first the op's default. ``blind``: the
    value that hides a defect (a cotangent of 1.0, γ = ones for a norm, a multiplier at 1);
    swept like the others, and named in the table. ``names``: parameter names that bind a
    kernel's argument to this option. ``fixed_ok``: a kernel without the parameter is
    checked at the values it computes (its forward decides which, one probe each).
    """

    name: str
    values: tuple[Any, ...]
    passed: bool = False
    blind: Any = None
    names: tuple[str, ...] = ()
    words: str = ""

    @property
    def default(self) -> Any:
        return self.values[0]
