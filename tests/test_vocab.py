"""The shared vocabulary: plain types whose names and JSON form are the public contract."""

from __future__ import annotations

import json

from gradcheck_bi.vocab import CHECKS, CONTROLS, Config, Expectation, Result, first_line


def test_names() -> None:
    assert CHECKS == ("forward", "dx", "dw", "batch_invariance")
    assert CONTROLS == ("randn", "ones", "zeros")


def test_result_json_has_no_inf_or_nan_literals_and_no_empty_message() -> None:
    r = Result("k", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, float("nan"),
               float("inf"), "fail", "pass", False)
    d = r.to_dict()
    assert d["max_abs_err"] == "nan" and d["tolerance"] == "inf" and "message" not in d
    json.dumps(d, allow_nan=False)


def test_expectation_matches_on_the_effective_control() -> None:
    rule = Expectation("fail", kernel="k", weight="ones", zcg=True)
    assert rule.matches("k", Config(check="dx", control="ones", zero_centered_gamma=True))
    assert not rule.matches("k", Config(check="dx", control="ones"))
    assert not rule.matches("other", Config(check="dx", control="ones", zero_centered_gamma=True))


def test_first_line_names_the_exception() -> None:
    assert first_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert first_line(KeyError()) == "KeyError"


def test_torch_dtype_names_get_ours_suggested() -> None:
    from gradcheck_bi.vocab import DTYPES, did_you_mean

    assert did_you_mean("float32", tuple(DTYPES)) == " (did you mean 'fp32'?)"
    assert did_you_mean("bfloat16", tuple(DTYPES)) == " (did you mean 'bf16'?)"
