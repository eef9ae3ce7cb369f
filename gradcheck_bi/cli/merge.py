"""``gradcheck-bi merge``: the JSON reports of ``run --shard K/N`` → the unsharded run's report.

Each shard's JSON names its place in the run (``"shard"``: index, count, the number of
points, the positions of its results). The merge checks that the files are the N shards
of one run — each index once, the positions covering every point once, the same version
and the same notes — puts the results back in run order and renders them in any format,
with the exit code the unsharded run would have had (timing aside, the same report).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from gradcheck_bi.cli.emit import Report, emit
from gradcheck_bi.cli.options import (
    FORMATS,
    JUDGE,
    OUTPUT,
    UsageError,
    check_paths,
    choices,
    one_of,
)
from gradcheck_bi.gate import baseline as baselines
from gradcheck_bi.gate import exit_code
from gradcheck_bi.point import ROW_DEFAULTS
from gradcheck_bi.vocab import Result


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"merge: {path}: cannot read a JSON report ({exc})") from None
    if not isinstance(doc, dict) or doc.get("tool") != "gradcheck-bi" or "shard" not in doc:
        raise UsageError(f"merge: {path}: not a shard report (write one with `gradcheck-bi "
                         "run --shard K/N --format json --output FILE`)")
    return doc


def _result(row: dict[str, Any]) -> Result:
    row = dict(row)
    for key in ("max_abs_err", "tolerance"):  # "inf"/"nan" strings: JSON has no such literal
        if isinstance(row.get(key), str):
            row[key] = float(row[key])
    row.setdefault("row_axes", "eps" in row)  # an op of any shape's row leaves them out
    for key, value in ROW_DEFAULTS.items():
        row.setdefault(key, value)
    return Result(**row)


def join(docs: list[dict[str, Any]], names: list[str]) -> list[Result]:
    """The shards' results in run order; :class:`UsageError` when they are not one run's."""
    first = docs[0]["shard"]
    count, points = first["count"], first["points"]
    seen: dict[int, str] = {}
    placed: dict[int, Result] = {}
    for doc, name in zip(docs, names, strict=True):
        shard = doc["shard"]
        if (shard["count"], shard["points"], doc["version"]) != (count, points,
                                                                 docs[0]["version"]):
            raise UsageError(f"merge: {name} is shard {shard['index']}/{shard['count']} of a "
                             f"run of {shard['points']} points; {names[0]} is of "
                             f"{count} shards of {points} points: not one run")
        for key in ("not_run", "dropped", "nothing_checked"):
            if doc.get(key) != docs[0].get(key):
                raise UsageError(f"merge: {name} and {names[0]} differ in {key!r}: not the "
                                 "same run's arguments")
        if shard["index"] in seen:
            raise UsageError(f"merge: shard {shard['index']}/{count} given twice ("
                             f"{seen[shard['index']]}, {name})")
        seen[shard["index"]] = name
        if len(shard["positions"]) != len(doc["results"]):
            raise UsageError(f"merge: {name}: {len(doc['results'])} results for "
                             f"{len(shard['positions'])} positions")
        for pos, row in zip(shard["positions"], doc["results"], strict=True):
            placed[pos] = _result(row)
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise UsageError(f"merge: shard{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(f'{k}/{count}' for k in missing)} missing")
    if sorted(placed) != list(range(points)):
        raise UsageError(f"merge: the shards hold {len(placed)} of the run's {points} points")
    return [placed[i] for i in range(points)]


def merge_command(
    files: Annotated[list[Path], typer.Argument(
        metavar="SHARD.json…", help="The --format json reports of every shard of one run.")],
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar=choices(FORMATS), rich_help_panel=OUTPUT,
        show_default="table on a terminal, else text", help="As for `run`.")] = None,
    output: Annotated[Path | None, typer.Option(
        metavar="FILE", rich_help_panel=OUTPUT, show_default="stdout",
        help="Write the merged report here (atomically).")] = None,
    baseline: Annotated[Path | None, typer.Option(
        metavar="FILE.json", rich_help_panel=JUDGE, show_default="none",
        help="Compare the merged results with this recorded run; drift exits 1.")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", rich_help_panel=OUTPUT, show_default=False,
        help="List every result not as expected.")] = False,
) -> int:
    """Join the JSON reports of `run --shard K/N` into the report of the unsharded run.

    gradcheck-bi merge shard-1.json shard-2.json shard-3.json --format junit
    """
    started = time.perf_counter()
    check_paths(output=output, baseline=baseline, update_baseline=False, plot=None)
    fmt_name = one_of("--format", fmt, FORMATS) or (
        "table" if Console().is_terminal else "text")
    docs = [_read(p) for p in files]
    results = join(docs, [str(p) for p in files])
    head = docs[0]
    strict = any(d["shard"].get("strict") for d in docs)
    unchecked = [(d["kernel"], d["reason"]) for d in head.get("nothing_checked", [])]
    try:
        recorded = baselines.load(baseline) if baseline is not None else None
    except baselines.BaselineError as exc:
        raise UsageError(str(exc)) from None
    drifts = baselines.compare(results, recorded) if recorded is not None else []
    code = exit_code(results, drifted=bool(drifts), strict=strict, unchecked=unchecked)
    report = Report(results, drifts, baseline, code, strict, verbose,
                    head.get("environment", {}), head.get("not_run", []),
                    head.get("dropped", []), unchecked)
    seconds = sum(float(d.get("timing", {}).get("seconds", 0.0)) for d in docs)
    emit(report, fmt_name, output, None, seconds + time.perf_counter() - started)
    return code
