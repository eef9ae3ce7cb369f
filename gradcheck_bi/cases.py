"""Case files: TOML data → a list of :class:`~gradcheck_bi.sweep.Sweep`, validated strictly.

Parsing only; :func:`gradcheck_bi.runner.run_sweeps` runs a case's sweeps.

A case is data, never code: it is parsed with ``tomllib`` and every key is checked against
the schema below. An unknown key or a wrong type is a :class:`CaseError` naming the file
and the key (the CLI turns it into one line and exit 2). ``cases/README.md`` documents the
schema for users; this module is its executable form.

Layout of a case file::

    description = "what this case is for"          # optional text
    skip_missing_devices = true                    # drop cuda targets when no GPU is seen
    kernels = ["after"]                            # any sweep key: the defaults of every block
    kernel_args = {casting_mode = "gemma"}         # top level only: for the user's kernels
    targets = ["cpu/fp64", "cuda/fp32"]

    [[sweep]]                                      # zero or more blocks; none = one sweep
    name = "awkward shapes"                        # from the top-level keys alone
    shapes = [[1, 1], [2, 3, 1000]]

    [[expectation]]                                # optional rules, last match wins
    kernel = "after"
    check = "batch_invariance"
    status = "pass"

Every block is the top-level keys overridden by the block's own, then one :class:`Sweep`;
the case runs its blocks in order, and a point two blocks share runs once.

>>> case = parse_case('kernels = ["after"]\\n[[sweep]]\\nshapes = [[4, 1]]', "demo.toml")
>>> case.sweeps[0].kernels, case.sweeps[0].shapes
(['after'], [(4, 1)])
>>> parse_case("shape = [2, 8]", "demo.toml")
Traceback (most recent call last):
...
gradcheck_bi.cases.CaseError: demo.toml: unknown key 'shape' at top level (did you mean 'shapes'?)
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from gradcheck_bi import gpu
from gradcheck_bi.kernels.adapting.loader import normal_ref
from gradcheck_bi.kernels.calling.writes import MUTABLE
from gradcheck_bi.point import (
    AXIS,
    CASE_KEYS,
    OP_KEYS,
    BadValue,
    boolean,
    choice,
    list_of,
    nonnegative,
)
from gradcheck_bi.sweep import CASE_TIMEOUT_S, Sweep, sweep_of
from gradcheck_bi.vocab import EXPECTED_STATUSES, Expectation, did_you_mean


class CaseError(ValueError):
    """A case file (or an API argument) that cannot be used: missing, not TOML, or not the
    schema (exit 2 on the command line; a ``ValueError`` in the API)."""


# --- the keys that are not an axis of the point (those: gradcheck_bi.point.CASE_KEYS) ---


def _string(v: Any) -> str:
    if not isinstance(v, str):
        raise BadValue("a string")
    return v


def _kernel(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise BadValue("a kernel name, PATH.py:ATTR or package.module:ATTR")
    return normal_ref(v)  # a rule names a kernel as results do


def _target(v: Any) -> tuple[str, str]:
    """``"cpu/fp64"``: the device and dtype axes, crossed as one."""
    devices, dtypes = AXIS["device"].choices, AXIS["dtype"].choices
    what = "a target 'device/dtype' (device cpu or cuda; dtype " + ", ".join(dtypes) + ")"
    if not isinstance(v, str) or v.count("/") != 1:
        raise BadValue(what)
    device, dtype = v.split("/")
    if device not in devices or dtype not in dtypes:
        raise BadValue(what, did_you_mean(device, devices) if device not in devices
                       else did_you_mean(dtype, dtypes))
    return device, dtype


def _kernel_args(v: Any) -> dict[str, Any]:
    if not isinstance(v, dict) or not all(isinstance(k, str) and k.isidentifier() for k in v):
        raise BadValue("a table of name = value, e.g. kernel_args = {casting_mode = \"gemma\"}")
    return dict(v)


# Keys of a sweep (top level or a [[sweep]] block): name → rule; each is a Sweep field.
SWEEP_KEYS: dict[str, Callable[[Any], Any]] = {
    "kernels": list_of(_kernel, "kernel references"),
    "targets": list_of(_target, "'device/dtype' strings, e.g. 'cpu/fp64'"),
    **CASE_KEYS,
    "expect": choice(EXPECTED_STATUSES),
    "allow_mutation": list_of(choice(MUTABLE), "tensors (" + ", ".join(MUTABLE) + ")"),
    "timeout": nonnegative,  # seconds a point may run; 0: no limit
}
# Keys that shape how a block becomes a sweep, not a Sweep field.
BLOCK_KEYS: dict[str, Callable[[Any], Any]] = {
    "name": _string,
    "skip_missing_devices": boolean,
}
# Top level only: the kernels are loaded once for the whole case.
TOP_KEYS: dict[str, Callable[[Any], Any]] = {"description": _string,
                                             "kernel_args": _kernel_args}
# An [[expectation]] rule: the point's axes it matches on (Expectation's fields), by name.
EXPECT_KEYS: dict[str, Callable[[Any], Any]] = {
    "status": choice(EXPECTED_STATUSES),
    "kernel": _kernel,
    **{name: AXIS[axis].value for name, axis in (
        ("check", "check"), ("device", "device"), ("dtype", "dtype"), ("weight", "control"),
        ("zcg", "zero_centered_gamma"))},
    "reason": _string,
}
assert set(SWEEP_KEYS) <= {f.name for f in fields(Sweep)} | OP_KEYS


@dataclass
class Case:
    """A parsed case: its sweeps in order, and where it came from."""

    path: str
    description: str = ""
    sweeps: list[Sweep] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    # Targets skip_missing_devices left out: {"target": "cuda/fp32", "reason": …, "sweep": name}
    dropped: list[dict[str, str]] = field(default_factory=list)


def _check_table(table: dict[str, Any], allowed: dict[str, Callable[[Any], Any]],
                 where: str, source: str, noun: str = "key") -> dict[str, Any]:
    __tracebackhide__ = True  # a bad value is the caller's, not ours
    out = {}
    for key, value in table.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else (
                " (known: " + ", ".join(allowed) + ")")
            raise CaseError(f"{source}: unknown {noun} {key!r} {where}{hint}")
        try:
            out[key] = allowed[key](value)
        except BadValue as exc:
            raise CaseError(f"{source}: {noun} {key!r}{' ' + where if where else ''}: "
                            f"expected {exc}, got {value!r}{exc.hint}") from None
    return out


def check_values(values: dict[str, Any], source: str, noun: str = "argument") -> dict[str, Any]:
    """Validate sweep values given outside a case file (the Python API's arguments) with the
    case schema's rules and messages; :class:`CaseError` (a ``ValueError``) names the
    argument, the value, what was expected and a near miss."""
    __tracebackhide__ = True
    return _check_table(values, SWEEP_KEYS, "", source, noun)


def _missing_devices() -> set[str]:
    return set() if gpu.present() else {"cuda"}


MISSING_REASON = {"cuda": "no CUDA GPU is visible here"}


def _to_sweep(values: dict[str, Any], source: str, where: str
              ) -> tuple[Sweep, list[tuple[str, str]]]:
    """The block's sweep, and the ``(device, dtype)`` targets skip_missing_devices dropped."""
    kwargs = {k: v for k, v in values.items() if k in SWEEP_KEYS}
    dropped: list[tuple[str, str]] = []
    if values.get("skip_missing_devices") and "targets" in kwargs:
        missing = _missing_devices()
        dropped = [t for t in kwargs["targets"] if t[0] in missing]
        kwargs["targets"] = [t for t in kwargs["targets"] if t[0] not in missing]
        if not kwargs["targets"]:
            raise CaseError(f"{source}: {where}: no target is available on this machine")
    return sweep_of(**kwargs), dropped


def parse_case(text: str, source: str) -> Case:
    """Validate a case file's text (``source`` names it in errors) and build its sweeps."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CaseError(f"{source}: not valid TOML: {exc}") from None
    blocks = doc.pop("sweep", None)
    rules = doc.pop("expectation", None)
    top = _check_table(doc, {**SWEEP_KEYS, **BLOCK_KEYS, **TOP_KEYS}, "at top level", source)
    if blocks is None:
        blocks = [{}]
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise CaseError(f"{source}: 'sweep' must be an array of tables ([[sweep]] blocks)")
    if rules is None:
        rules = []
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise CaseError(f"{source}: 'expectation' must be an array of tables "
                        "([[expectation]] rules)")
    expectations = []
    for i, rule in enumerate(rules, 1):
        where = f"in [[expectation]] #{i}"
        checked = _check_table(rule, EXPECT_KEYS, where, source)
        if "status" not in checked:
            raise CaseError(f"{source}: {where}: missing key 'status' (\"pass\" or \"fail\")")
        expectations.append(Expectation(**checked))
    case = Case(source, top.pop("description", ""))
    kernel_args = top.pop("kernel_args", {})
    for i, block in enumerate(blocks, 1):
        where = f"in [[sweep]] #{i}" + (f" ({block['name']})" if isinstance(
            block.get("name"), str) else "")
        values = {"timeout": CASE_TIMEOUT_S, **top,
                  **_check_table(block, {**SWEEP_KEYS, **BLOCK_KEYS}, where, source)}
        sweep, dropped = _to_sweep(values, source, where)
        sweep.expectations = list(expectations)
        sweep.kernel_args = dict(kernel_args)
        case.sweeps.append(sweep)
        case.names.append(values.get("name", f"sweep {i}"))
        case.dropped += [{"target": f"{device}/{dtype}", "reason": MISSING_REASON[device],
                          "sweep": case.names[-1]} for device, dtype in dropped]
    return case


def load_case(path: str | Path) -> Case:
    """Read and validate a case file. Raises :class:`CaseError` naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseError(f"case file {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(f"case file {path}: cannot read: {exc}") from None
    return parse_case(text, str(path))
