"""shard.py and ``gradcheck-bi merge``: N shards of a run, merged, are the unsharded run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.shard import assign, cost, parse_shard, select
from gradcheck_bi.vocab import Config

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["run", "--kernel", "before,after", "--shape", "2,3,24", "--no-progress"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().out


def _stable(text: str) -> str:
    """The report without what varies from run to run (timing)."""
    doc = json.loads(text) if text.lstrip().startswith("{") else None
    if doc is not None:
        doc.pop("timing", None)
        return json.dumps(doc, indent=2)
    return re.sub(r"\d+(\.\d+)? ?s\b", "<s>", text)


def test_every_point_goes_to_one_shard_and_the_work_is_balanced() -> None:
    points = [Config(check=c, shape=(r, d)) for c in ("dx", "dw", "forward",
                                                      "batch_invariance")
              for r in (1, 4, 16) for d in (16, 256, 1030)]
    for n in (1, 2, 3, 5):
        owners = assign(points, n)
        assert sorted(i for k in range(1, n + 1) for i in select(points, k, n)) == list(
            range(len(points)))
        loads = [sum(cost(p) for p, o in zip(points, owners, strict=True) if o == s)
                 for s in range(n)]
        assert max(loads) - min(loads) <= max(cost(p) for p in points)
    assert assign(points, 3) == assign(list(points), 3)  # deterministic


def test_every_input_gradient_is_costed_like_dx() -> None:
    """Each input's gradient differences every column of its input, as dx does: D times a
    parameter's cost, whatever the input is called."""
    from gradcheck_bi.ops import ROWS, SHAPED

    shape = (4, 256)
    dx = cost(Config(check="dx", shape=shape))
    checks = [(op, f"d{name}") for op, record in ROWS.items() for name in record.inputs]
    checks += [(op, c) for op, record in SHAPED.items() for c in record.gradient_checks]
    assert ("gemm", "dA") in checks and ("swiglu", "db") in checks
    for op, check in checks:
        full = cost(Config(check=check, op=op, shape=shape))
        assert full == dx, f"{op} {check}: {full:.3g}, dx {dx:.3g}"
        directional = cost(Config(check=check, op=op, shape=shape, mode="directional"))
        assert directional * shape[-1] == dx, f"{op} {check} directional: {directional:.3g}"
    assert cost(Config(check="dw", shape=shape)) < dx / 16
    # Two fused-add input checks land on different shards, as two dx checks do.
    points = [Config(check=c, op="fused_add_rms_norm", shape=shape)
              for c in ("dx", "dresidual", "dw", "forward")]
    owners = assign(points, 2)
    assert owners[0] != owners[1], owners


@pytest.mark.parametrize("bad", ["0/3", "4/3", "1/0", "x/2", "2"])
def test_bad_shard_values_are_usage_errors(capsys: pytest.CaptureFixture[str],
                                           bad: str) -> None:
    with pytest.raises(ValueError):
        parse_shard(bad)
    assert cli.main([*SMALL, "--shard", bad]) == 2
    assert "--shard" in capsys.readouterr().err


def _shards(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str],
            n: int) -> list[str]:
    files = []
    for k in range(1, n + 1):
        path = tmp_path / f"shard-{k}.json"
        code, _ = run(capsys, *args, "--shard", f"{k}/{n}", "--format", "json", "--output",
                      str(path))
        assert code in (0, 1), code
        files.append(str(path))
    return files


def test_ci_case_in_three_shards_merges_to_the_unsharded_json(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["run", "--case", str(ROOT / "cases" / "ci.toml"), "--no-progress"]
    code, whole = run(capsys, *args, "--format", "json")
    files = _shards(capsys, tmp_path, args, 3)
    merged_code, merged = run(capsys, "merge", *files, "--format", "json")
    assert merged_code == code == 0
    assert _stable(merged) == _stable(whole)
    assert len(json.loads(merged)["results"]) == len(json.loads(whole)["results"]) > 600


@pytest.mark.parametrize("fmt", ["text", "markdown", "junit", "github"])
def test_every_format_of_a_merge_is_the_unsharded_runs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str) -> None:
    code, whole = run(capsys, *SMALL, "--format", fmt)
    files = _shards(capsys, tmp_path, SMALL, 2)
    merged_code, merged = run(capsys, "merge", *files, "--format", fmt)
    assert merged_code == code == 0  # `before` fails where its defects are declared
    assert _stable(merged) == _stable(whole)


def test_merge_refuses_what_is_not_every_shard_of_one_run(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = _shards(capsys, tmp_path, SMALL, 3)
    (tmp_path / "o").mkdir()
    other = _shards(capsys, tmp_path / "o", [*SMALL, "--seed", "1"], 2)
    plain = tmp_path / "plain.json"
    run(capsys, *SMALL, "--format", "json", "--output", str(plain))
    for given, needle in [(files[:2], "shard 3/3 missing"),
                          ([files[0], files[0], files[2]], "given twice"),
                          ([files[0], other[1], files[2]], "not one run"),
                          ([str(plain)], "not a shard report")]:
        assert cli.main(["merge", *given]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err


def test_an_op_of_any_shape_in_two_shards_merges_to_the_unsharded_json(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Its results carry no norm axes (γ, zcg, eps…) and read back without them."""
    args = ["run", "--kernel", str(ROOT / "tests" / "kernels" / "gemm.py:GemmFn"),
            "--check", "forward", "--check", "dbias", "--no-progress"]
    code, whole = run(capsys, *args, "--format", "json")
    rows = json.loads(whole)["results"]
    assert rows and all("variant" in r and "weight" not in r and "eps" not in r for r in rows)
    merged_code, merged = run(capsys, "merge", *_shards(capsys, tmp_path, args, 2),
                              "--format", "json")
    assert merged_code == code == 0
    assert _stable(merged) == _stable(whole)
