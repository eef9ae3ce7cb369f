"""False alarms of the row ops' engine: the correct kernels pass every check of their op
at seeded random configurations (fp64 and fp32, CPU). A few small ones here; the ≥ 200
per dtype run is ``benchmarks/op_false_alarms.py`` (docs/ops.md records it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "independent"))
import op_false_alarms


def test_a_few_random_configurations_per_op() -> None:
    tallies = op_false_alarms.run(4, ("fp64", "fp32"), "cpu", seed=11,
                                  widths=tuple(w for w in op_false_alarms.WIDTHS if w <= 128))
    bad = [m for t in tallies.values() for m in t["messages"]]
    assert not bad, "false alarms:\n" + "\n".join(bad)
