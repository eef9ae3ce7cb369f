"""Join the rows of several ``shaped_false_alarms.py --json`` files into one table.

    python benchmarks/merge_false_alarms.py out/fa/*.json

Prints the Markdown rows sorted by op, dtype (fp64, fp32, bf16) and device, then every false
alarm with the call that reproduces it; exits 1 if there is any, 2 if a file cannot be read.
A row's configurations are the ones its processes completed ("k of n" where a deadline stopped
them short of ``--n``); the shards of one op and dtype (``--shard I/K``) make one row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DTYPE_ORDER = ("fp64", "fp32", "bf16")
HEAD = ("| op | dtype | device | configurations | results | false alarms "
        "| worst err/tol (pass) | s per configuration | smallest defect caught |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")


def defect(r: dict[str, Any]) -> str:
    if not r.get("power_measured"):
        return "—"
    p = r.get("smallest_defect")
    if not r.get("power_complete", True):  # stopped by the deadline: an upper bound or none
        return "stopped" if p is None else f"≤ {p:.0e} (stopped)"
    return "> 1e-1" if p is None else f"≤ {p:.0e}" if p <= 1e-12 else f"{p:.1e}"


def _line(r: dict[str, Any]) -> str:
    lead = f"| {r['op']} | {r['dtype']} | {r['device']} |"
    if "configurations" not in r:
        return f"{lead} no correct kernel | — | — | — | — | — |"
    done, asked = r["configurations"], r.get("n") or r["configurations"]
    shown = f"{done}" if done >= asked else f"{done} of {asked}"
    per = r["s_per_configuration"]
    return (f"{lead} {shown} | {r['results']} | {r['false_alarms']} | "
            f"{r['worst_err_tol']:.2f} | {'—' if per is None else f'{per:.2f}'} | "
            f"{defect(r)} |")


def _key(r: dict[str, Any]) -> tuple[str, int, str]:
    d = r["dtype"]
    return (r["op"], DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER),
            r["device"])


def joined(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (op, dtype, device): the shards of one (``--shard I/K``) added up — their
    configurations, results and seconds summed, the worst err/tol the largest, the smallest
    defect shard 0's; a shard missing leaves ``configurations`` short of ``n``."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for key in sorted(groups):
        parts = groups[key]
        if len(parts) == 1 or any("configurations" not in r for r in parts):
            out.extend(parts)
            continue
        first = min(parts, key=lambda r: tuple(r.get("shard", (0, 1))))
        done = sum(r["configurations"] for r in parts)
        seconds = sum(r["seconds"] for r in parts)
        out.append({
            **first, "shard": [r.get("shard") for r in parts], "configurations": done,
            "results": sum(r["results"] for r in parts),
            "false_alarms": sum(r["false_alarms"] for r in parts),
            "worst_err_tol": max(r["worst_err_tol"] for r in parts), "seconds": seconds,
            "s_per_configuration": seconds / done if done else None,
            "alarms": [a for r in parts for a in r.get("alarms", ())]})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table's header and one line per row, in the order given."""
    return "\n".join([HEAD, *(_line(r) for r in rows)])


def alarm_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Every false alarm of ``rows``: where, what it said, and the call reproducing it."""
    return [f"FALSE ALARM: {r['op']} {r['dtype']} {r['device']} #{a['configuration']} "
            f"{a['check']} {a['status']}: {a['message']}\n    {a['reproduce']}"
            for r in rows for a in r.get("alarms", ())]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: merge_false_alarms.py FILE.json …", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    commits = set()
    for name in argv:
        try:
            data = json.loads(Path(name).read_text())
            rows.extend({**r, "_file": name} for r in data["rows"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{name}: not a shaped_false_alarms.py --json file ({e})", file=sys.stderr)
            return 2
        commits.add(str(data.get("commit")))
    seen: dict[tuple[Any, ...], str] = {}
    for r in rows:  # the same shard twice would count its configurations twice
        key = (r["op"], r["dtype"], r["device"], r.get("seed"), tuple(r.get("shard") or ()))
        if key in seen:
            print(f"{r['op']} {r['dtype']} {r['device']} shard {r.get('shard')}: in two files "
                  f"({seen[key]} and another): merge one run's files", file=sys.stderr)
            return 2
        seen[key] = r.get("_file", "")
    rows = joined(rows)
    print(f"{len(rows)} rows from {len(argv)} files, commit {', '.join(sorted(commits))}")
    print(markdown(rows))
    alarms = alarm_lines(rows)
    for a in alarms:
        print(a)
    return 1 if alarms else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
