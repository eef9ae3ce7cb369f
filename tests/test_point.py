"""The point's table (gradcheck_bi.point) is the one description of a point: every Config
field has an axis, and every axis reaches the Result and the JSON, the baseline's key, the
case files, the API and the command line. An axis added in one place only fails here."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from gradcheck_bi import api, cases, point
from gradcheck_bi.checks import TOLERANCE_SETTINGS
from gradcheck_bi.gate import baseline
from gradcheck_bi.gate.judge import judge
from gradcheck_bi.point import AXES, AXIS, BY_KEY
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, Measurement, Result

# A value other than the default for every axis, as a case file writes it.
OTHER: dict[str, Any] = {
    "check": "dw", "device": "cuda", "dtype": "fp32", "shape": [3, 5], "eps": 1e-3, "seed": 7,
    "control": "ones", "zero_centered_gamma": True, "input_scale": 2.0, "weight_scale": 3.0,
    "layout": "x-strided", "atol": 1e-9, "rtol": 1e-7, "mode": "directional",
    "stencil": "central-2", "step_rel": 1e-3, "max_memory": 1 << 20, "directions": 3,
    "op": "layer_norm", "bias": "zeros", "group_size": 4, "norm_before_gate": False,
    "precision": "exact", "working_precision": "fp32", "variant": (("layout", "NN"),),
}
# Sweep fields that are no axis of a point: what runs, what it must show, how to call it.
NOT_AXES = {"kernels", "targets", "expect", "expectations", "kernel_args", "allow_mutation",
            "timeout", "options"}


def untabled(config: type) -> list[str]:
    """Fields of ``config`` that have no axis in the table."""
    return [f.name for f in dataclasses.fields(config) if f.name not in AXIS]


def test_every_config_field_has_one_axis() -> None:
    assert not untabled(Config), f"Config fields with no axis in gradcheck_bi.point: " \
        f"{untabled(Config)}"
    assert [a.field for a in AXES if a.field not in {f.name for f in dataclasses.fields(
        Config)}] == [], "axes with no Config field"
    assert len(AXIS) == len(AXES) and len(BY_KEY) == len([a for a in AXES if a.key])


def test_the_check_sees_a_field_added_to_config_only() -> None:
    @dataclasses.dataclass(frozen=True)
    class Grown(Config):
        temperature: float = 1.0

    assert untabled(Grown) == ["temperature"]


def test_other_values_are_valid_and_not_the_defaults() -> None:
    assert set(OTHER) == set(AXIS), "OTHER must name every axis"
    for a in AXES:
        assert a.value(OTHER[a.field]) != a.default, a.field


def test_every_axis_reaches_the_result_and_its_json() -> None:
    result_fields = [f.name for f in dataclasses.fields(Result)]
    # The table is in the JSON's order: the point's fields of a Result, in order.
    assert [f for f in result_fields if f in point.KEY_NAMES] == list(point.KEY_NAMES)
    for check in ("forward", "dw", "dx"):
        values = {a.field: a.value(OTHER[a.field]) for a in AXES}
        cfg = Config(**{**values, "check": check})
        row = judge("k", "pass", cfg, Measurement(0.0, 1.0, True)).to_dict()
        acting = TOLERANCE_SETTINGS[check]
        for a in AXES:
            if a.field == "variant":  # an op of any shape's axes: a dict of their values
                assert row["variant"] == dict(OTHER["variant"])
                continue
            if a.json == "never":
                assert a.public not in row, a.field
                continue
            want = check if a.field == "check" else (
                None if a.setting and a.field not in acting else OTHER[a.field])
            assert row[a.public] == want, (check, a.field, row.get(a.public))
        assert baseline.key_of(row) == baseline.key_of(judge(
            "k", "pass", cfg, Measurement(0.0, 1.0, True)))


def test_op_only_axes_stay_out_of_an_rms_norm_row() -> None:
    row = judge("k", "pass", Config(check="dx"), Measurement(0.0, 1.0, True)).to_dict()
    assert not {a.public for a in AXES if a.json == "op"} & set(row)
    assert {a.public for a in AXES if a.json == "always"} <= set(row)


def test_baseline_keys_on_every_json_field_of_the_point() -> None:
    # and on an op's own axes' values (its variant), which the JSON writes as one dict
    assert baseline.KEY_FIELDS == ("kernel", *(a.public for a in AXES if a.json != "never"),
                                   "variant")


def test_every_case_key_is_a_sweep_field_and_parses() -> None:
    # an op's own keys (β's control, the options its record declares) go to Sweep.options
    sweep_fields = {f.name for f in dataclasses.fields(Sweep)}
    assert set(BY_KEY) <= set(cases.SWEEP_KEYS)
    assert set(BY_KEY) - point.OP_KEYS <= sweep_fields and not point.OP_KEYS & sweep_fields
    assert point.OP_KEYS == {a.key for a in AXES if a.json == "op" and a.key}
    assert sweep_fields - set(BY_KEY) == NOT_AXES, "a Sweep field that is neither an axis " \
        "nor a known non-axis key"
    for key, a in BY_KEY.items():
        value = [OTHER[a.field]] if a.plural else OTHER[a.field]
        text = f"{key} = {_toml(value)}\n"
        sweep = cases.parse_case(text, "t.toml").sweeps[0]
        got = sweep.options[key] if key in point.OP_KEYS else getattr(sweep, key)
        assert got == cases.SWEEP_KEYS[key](value), key
        with pytest.raises(cases.CaseError, match=repr(key)):
            cases.parse_case(f"{key} = {{}}\n", "t.toml")


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v) if isinstance(v, (int, float)) else f'"{v}"'


API_BASE: dict[str, Any] = {"device": "cpu", "dtype": "fp64", "zcg": True, "checks": None,
                            "shapes": [[2, 8]]}


def test_every_case_key_is_an_api_keyword() -> None:
    named = set(inspect.signature(api.check).parameters)
    for key, a in BY_KEY.items():
        value = [OTHER[a.field]] if a.plural else OTHER[a.field]
        if key == "zcg":
            assert "zcg" in named
            continue
        swept = api.sweep_values(**{**API_BASE, key: value})
        assert swept[key] == cases.SWEEP_KEYS[key](value), key
        with pytest.raises(ValueError, match=repr(key)):
            api.sweep_values(**{**API_BASE, key: {}})


# Each `run` option's text for the OTHER value (typer hands list options over as lists).
CLI_TEXT: dict[str, Any] = {
    "check": ["dw"], "device": "cuda", "dtype": "fp32", "shape": ["3,5"], "eps": 1e-3,
    "seed": 7, "control": ["ones"], "zero_centered_gamma": "on", "layout": ["x-strided"],
    "atol": 1e-9, "rtol": 1e-7, "mode": "directional", "max_memory": "1M", "directions": 3,
    "op": "layer_norm", "bias": ["zeros"], "group_size": ["4"], "norm_before_gate": "off",
    "precision": "exact",
}


def _run_parameters() -> dict[str, inspect.Parameter]:
    from gradcheck_bi.cli.run import run_command

    return dict(inspect.signature(run_command).parameters)


def test_every_cli_option_of_the_point_is_read_by_its_axis() -> None:
    from gradcheck_bi.cli.run import point_options

    params = _run_parameters()
    on_cli = {a.field for a in AXES if a.cli}
    assert set(CLI_TEXT) == on_cli, "CLI_TEXT must name every axis with a run option"
    # Options of `run` named like an axis but not declared in its table entry bypass it.
    names = {n for a in AXES for n in (a.field, a.public, a.key)}
    for a in AXES:
        param = a.cli.removeprefix("--").replace("-", "_") if a.cli else None
        assert param is None or param in params, f"{a.cli} is no option of run"
    assert {p for p in params if p in names} <= {
        a.cli.removeprefix("--").replace("-", "_") for a in AXES if a.cli}, \
        "an option of run named like an axis whose table entry has no cli"
    # Read like the case file's value; device, dtype and op are run's own (targets, --op).
    assert {a.field for a in AXES if a.cli and not a.key} == {"device", "dtype", "op"}
    defaults = {name: p.default for name, p in params.items()}
    for field, text in CLI_TEXT.items():
        a = AXIS[field]
        assert a.cli is not None
        read = point_options({**defaults, a.cli.removeprefix("--").replace("-", "_"): text})
        want = a.value(OTHER[field])
        assert read == {field: [want] if a.plural else want}, (field, read)
