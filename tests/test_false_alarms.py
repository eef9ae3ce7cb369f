"""False alarms: correct kernels pass every check at ≥ 200 seeded random configurations.

``after`` and an independently written RMSNorm (tests/independent/rmsnorm_ref.py), fp64
and fp32, and separately bf16 and fp16, on CPU: every shape, scale, weight, eps and dtype
the generator draws. Slow
(minutes); ``pytest -m slow tests/test_false_alarms.py -s`` prints the table recorded in
docs/false_alarms.md (set GRADCHECK_BI_FALSE_ALARMS_OUT=path to write it there). The GPU
counterpart is benchmarks/rmsnorm_false_alarms.py. A default-suite smoke test runs 5 small ones.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "independent"))
import false_alarms

N_CONFIGS = 200


def _assert_clean(tallies: dict, header: str) -> None:
    text = false_alarms.summary(tallies, header)
    print(text)
    out = os.environ.get("GRADCHECK_BI_FALSE_ALARMS_OUT")
    if out:
        Path(out).write_text(text)
    bad = [m for t in tallies.values() for m in t.messages]
    assert not bad, "false alarms:\n" + "\n".join(bad)


@pytest.mark.parametrize("dtypes", [("fp64", "fp32"), ("bf16", "fp16")])
def test_a_few_random_configurations(dtypes: tuple[str, ...]) -> None:
    tallies = false_alarms.run(5, dtypes, "cpu", seed=7,
                               widths=tuple(w for w in false_alarms.WIDTHS if w <= 300))
    _assert_clean(tallies, "smoke: 5 configurations")


@pytest.mark.slow
def test_no_false_alarms_over_200_configurations() -> None:
    import torch

    tallies = false_alarms.run(N_CONFIGS, ("fp64", "fp32"), "cpu",
                               log=lambda s: print(s, file=sys.stderr, flush=True))
    header = (f"### CPU: {N_CONFIGS} seeded configurations × 2 kernels × 4 checks\n\n"
              f"torch {torch.__version__}, {platform.machine()}, "
              f"{os.cpu_count()} cores; `pytest -m slow tests/test_false_alarms.py -s`")
    _assert_clean(tallies, header)
    assert sum(t.count for t in tallies.values()) == N_CONFIGS * 2 * 4


@pytest.mark.slow
def test_no_false_alarms_in_half_precision_over_200_configurations() -> None:
    """bf16/fp16: the forward's ulp audit and the lifted dx/dw, same generator."""
    import torch

    tallies = false_alarms.run(N_CONFIGS, ("bf16", "fp16"), "cpu",
                               log=lambda s: print(s, file=sys.stderr, flush=True))
    header = (f"### CPU, bf16/fp16: {N_CONFIGS} seeded configurations × 2 kernels × 4 checks"
              f"\n\ntorch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores; "
              "`pytest -m slow tests/test_false_alarms.py -s -k half`")
    _assert_clean(tallies, header)
    assert sum(t.count for t in tallies.values()) == N_CONFIGS * 2 * 4
