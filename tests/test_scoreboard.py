"""The real-library scoreboard (benchmarks/scoreboard.py, docs/scoreboard.md).

A fixed sample of real classes — transformers' LlamaRMSNorm (fp32 inside), CohereLayerNorm (a
LayerNorm without bias), Qwen3Next's gated norm, torch's nn.LayerNorm and a weightless
nn.RMSNorm — runs through the scoreboard's own function (the CLI in a subprocess, zero glue) and
must reach the outcome benchmarks/scoreboard_expected.toml keeps for it. The kept file itself
must classify every non-pass, and the comparison must report a changed outcome.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import load_benchmark

scoreboard = load_benchmark("scoreboard")
targets = load_benchmark("scoreboard_targets")
EXPECTED = scoreboard.load_expected()

SAMPLE = [
    targets.target("transformers", "transformers.models.llama.modeling_llama:LlamaRMSNorm"),
    targets.target("transformers", "transformers.models.cohere.modeling_cohere:CohereLayerNorm"),
    targets.target("transformers",
                   "transformers.models.qwen3_next.modeling_qwen3_next:Qwen3NextRMSNormGated"),
    targets.target("torch", "torch.nn:LayerNorm"),
    targets.target("torch", "torch.nn:RMSNorm", ["elementwise_affine=False"]),
]


@pytest.fixture(scope="module")
def sample_records() -> dict[str, dict]:
    """The sample's records, two runs at a time (each is a fresh process: a few seconds)."""
    pytest.importorskip("transformers")
    with ThreadPoolExecutor(max_workers=2) as pool:
        records = pool.map(lambda t: scoreboard.run_target(t, timeout=120, threads=1), SAMPLE)
        return {rec["id"]: rec for rec in records}


@pytest.mark.parametrize("target", SAMPLE, ids=[t["id"].rsplit(":", 1)[-1] for t in SAMPLE])
def test_sample_reaches_its_kept_outcome(target: dict, sample_records: dict) -> None:
    kept = EXPECTED[target["id"]]
    rec = sample_records[target["id"]]
    assert rec["outcome"] == kept["outcome"], (
        f"{target['id']}: kept {kept['outcome']} ({kept.get('verdict', '')}), now "
        f"{rec['outcome']} (exit {rec['exit']}): {rec['first_line']}")
    if rec["outcome"] in ("pass", "fail", "error"):
        assert rec["statuses"], f"{target['id']}: {rec['outcome']} without results"


def test_kept_file_classifies_every_non_pass() -> None:
    unclassified = [ident for ident, entry in EXPECTED.items()
                    if scoreboard.category_of(entry["outcome"], entry.get("verdict", ""))
                    == "unclassified"]
    assert not unclassified, f"{len(unclassified)} unclassified, e.g. {unclassified[:3]}"


def _record(ident: str, outcome: str) -> dict:
    return {"id": ident, "library": "torch", "outcome": outcome, "first_line": "✗ forward"}


def test_compare_reports_changed_new_and_unclassified() -> None:
    kept = {"a": {"outcome": "pass"},
            "b": {"outcome": "fail", "verdict": "our false alarm: fp32 inside"},
            "c": {"outcome": "refused"}}
    records = [_record("a", "fail"), _record("b", "fail"), _record("c", "refused"),
               _record("d", "pass")]
    lines = scoreboard.compare(records, kept)
    assert [line.split()[0] for line in lines] == ["CHANGED", "UNCLASSIFIED", "NEW"], lines
    assert lines[0].startswith("CHANGED a: kept pass; now fail")


def test_update_keeps_unchanged_and_out_of_scope_verdicts_only() -> None:
    kept = {"a": {"outcome": "fail", "verdict": "our false alarm: x"},
            "b": {"outcome": "fail", "verdict": "our false alarm: y"},
            "c": {"outcome": "error", "verdict": "out of scope: channels first"},
            "d": {"outcome": "fail", "verdict": "our false alarm: z"}}
    records = [_record("a", "fail"), _record("b", "refused"), _record("c", "refused"),
               _record("d", "pass")]
    new = scoreboard.updated_expected(records, kept)
    assert new["a"] == kept["a"]
    assert new["b"] == {"outcome": "refused",
                        "verdict": "unclassified (was fail: our false alarm: y)"}
    assert new["c"] == {"outcome": "refused", "verdict": "out of scope: channels first"}
    assert new["d"] == {"outcome": "pass"}
    counts = scoreboard.tally(records, new)["all"]
    assert (counts["checked right"], counts["our false alarm"], counts["unclassified"],
            counts["out of scope"]) == (1, 1, 1, 1), counts


def test_a_call_cut_by_its_deadline_resumes(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """--deadline: a class still running then is killed and not recorded, the page waits, exit
    UNFINISHED; the next call with the same cache runs only what is left, then writes it."""
    needs = {"fast": 0.0, "slow": 2.0}  # seconds each class takes

    def fake_run(target: dict, *, timeout: float, **_: object) -> dict:
        seconds = min(needs[target["id"]], timeout)
        outcome = "timeout" if needs[target["id"]] > timeout else "pass"
        return {**_record(target["id"], outcome), "exit": 0, "op": "rms_norm", "variant": "",
                "working_precision": "", "statuses": {"pass": 1}, "seconds": seconds}

    fake_targets = [targets.target("torch", name) for name in needs]
    monkeypatch.setattr(scoreboard, "run_target", fake_run)
    monkeypatch.setattr(scoreboard, "enumerate_targets", lambda *_: (fake_targets, []))
    monkeypatch.setattr(scoreboard, "_torchvision_missing", lambda _: True)
    results, doc = tmp_path / "results.json", tmp_path / "page.md"
    argv = ["--results", str(results), "--doc", str(doc), "--jobs", "2"]

    assert scoreboard.main([*argv, "--deadline", "1"]) == scoreboard.UNFINISHED
    first = scoreboard.json.loads(results.read_text())
    assert list(first["records"]) == ["fast"] and not doc.exists()
    scoreboard.main([*argv, "--deadline", "100"])
    second = scoreboard.json.loads(results.read_text())
    assert sorted(second["records"]) == ["fast", "slow"]
    assert [c["ran"] for c in second["calls"]] == [1, 1]
    page = doc.read_text()
    assert "2 classes run in" in page and "over 2 call(s)" in page
    assert str(tmp_path) not in page, "the page carries a machine's path"


def test_a_cpu_run_leaves_the_kept_outcomes_of_a_cuda_run() -> None:
    """A Triton library's class is "needs CUDA" on CPU: its kept outcome (a CUDA run's) is
    neither reported as changed nor overwritten; a class never kept is still NEW."""
    kept = {"liger.a": {"outcome": "fail", "verdict": "true defect: in place"},
            "fla.b": {"outcome": "pass"}}
    records = [_record("liger.a", scoreboard.NEEDS_CUDA), _record("fla.b", scoreboard.NEEDS_CUDA),
               _record("fla.c", scoreboard.NEEDS_CUDA)]
    assert [line.split()[0] for line in scoreboard.compare(records, kept)] == ["NEW"]
    new = scoreboard.updated_expected(records, kept)
    assert new["liger.a"] == kept["liger.a"] and new["fla.b"] == kept["fla.b"]
    assert new["fla.c"] == {"outcome": scoreboard.NEEDS_CUDA}
    assert scoreboard.tally(records, new)["all"][scoreboard.NEEDS_CUDA] == 3


def test_the_cuda_block_is_added_and_replaced_apart_from_the_cpu_one(tmp_path: Path) -> None:
    page = tmp_path / "board.md"
    page.write_text(f"# B\n\n{scoreboard.BEGIN}\ncpu totals\n{scoreboard.END}\n\ntail\n")
    for text in ("cuda one", "cuda two"):
        scoreboard.write_doc(text, page, scoreboard.BEGIN_CUDA, scoreboard.END_CUDA)
    body = page.read_text()
    assert "cpu totals" in body and "tail" in body and "cuda one" not in body
    assert body.count(scoreboard.BEGIN_CUDA) == 1 and "cuda two" in body
