"""The real-library scoreboard: every norm of torch, Liger, transformers and timm, run
as a new user would run it, compared with a kept, hand-classified verdict per class.

    make scoreboard                                   # or:
    PYTHONPATH=. python benchmarks/scoreboard.py [--jobs 2] [--only PATTERN] [--update-expected]

Needs the optional extra: ``pip install -e ".[scoreboard]"`` (transformers, timm; Liger's rows
appear when liger-kernel is installed too). Per class (benchmarks/scoreboard_targets.py lists
them) it runs, in a fresh process and with zero glue::

    python -m gradcheck_bi run --kernel module:Class --device cpu --format json --output F

at the tool's default shape, as a user runs it (``--shape`` only where this script is given
one; only torch's constructor flags get a ``--kernel-arg``), with a time limit per class, and
records the exit code, the op the tool recognised, the working precision it measured, the
count of each result status, the seconds and the first line saying what failed or was refused.
Liger's and fla's Triton kernels need CUDA: on a CPU run they are recorded as "needs CUDA", not
run, and their kept outcomes are those of a CUDA run (``--device cuda --library liger --library
liger-ops --library fla``, benchmarks/gpu_scoreboard_cuda.sh), whose totals go to their own block
of the page.

The outcome of each class (pass, fail, error, refused, not checked, internal error, timeout)
is compared with benchmarks/scoreboard_expected.toml, where every non-pass carries one hand
classification (``verdict``): "true defect: …" (a real gradient defect of the library),
"out of scope: …", "our false alarm: …", "our refusal: …" or "broken: …" (the tool, or the
call it makes, breaks). Every changed outcome, new class or unclassified non-pass is printed
and the exit status is 1; ``--update-expected`` rewrites the kept file from this run (keeping
the verdicts of unchanged outcomes and every "out of scope" verdict; the rest become
"unclassified" for a person to classify). The totals go to docs/scoreboard.md (between its
``scoreboard:begin``/``end`` markers): the one place for these figures.

Records are cached in build/scoreboard/results.json with a fingerprint of the tool's source,
the libraries' versions and the run's options: an interrupted run resumes where it stopped,
and a run after any change to gradcheck_bi/ runs every class again. ``--deadline SECONDS``
ends a call within that budget (benchmarks/gpu_scoreboard.sh runs the board so, in calls of a
few minutes on a lent machine's CPU cores).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10: the project's own dependency
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
TARGETS_SCRIPT = REPO / "benchmarks" / "scoreboard_targets.py"
STAND_IN = REPO / "benchmarks" / "scoreboard_stand_in"
EXPECTED = REPO / "benchmarks" / "scoreboard_expected.toml"
DOC = REPO / "docs" / "scoreboard.md"
RESULTS = REPO / "build" / "scoreboard" / "results.json"
LIBRARIES = ("torch", "torch-ops", "liger", "liger-ops", "fla", "transformers",
             "transformers-ops", "timm")
# Triton libraries: run on a CUDA device only (`--device cuda`); a CPU run records their classes
# as "needs CUDA" and leaves their kept outcomes (a CUDA run's) as they are. A CUDA run of all
# three writes its totals to their own block of the page (BEGIN_CUDA … END_CUDA).
CUDA_LIBRARIES = ("liger", "liger-ops", "fla")
SHAPE: str | None = None  # the tool's default, (2, 8, 256): what a user runs
TIMEOUT_S = 180.0
NEEDS_CUDA = "needs CUDA"
# Exit codes of `gradcheck-bi run` (docs/cli.md) → the outcome recorded.
OUTCOMES = {0: "pass", 2: "refused", 3: "not checked", 4: "internal error", 130: "interrupted"}
UNFINISHED = 3  # the exit status of a call that stopped at its --deadline with classes left
CATEGORIES = ("true defect", "out of scope", "our false alarm", "our refusal", "broken")
BEGIN, END = "<!-- scoreboard:begin -->", "<!-- scoreboard:end -->"
BEGIN_CUDA, END_CUDA = "<!-- scoreboard-cuda:begin -->", "<!-- scoreboard-cuda:end -->"


# ---------------------------------------------------------------- the classes and their runs

def _torchvision_missing(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import torchvision.ops"], capture_output=True,
                           cwd=REPO, check=False)
    return probe.returncode != 0


def library_env(library: str, stand_in: bool) -> dict[str, str]:
    """The environment of a subprocess for ``library``'s classes: this checkout first on the
    path; for timm, the torchvision stand-in when the real one cannot be imported."""
    env = dict(os.environ)
    paths = [str(REPO)]
    if library == "timm" and stand_in:
        paths.append(str(STAND_IN))
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def enumerate_targets(python: str, libraries: Iterable[str], stand_in: bool
                      ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Every target of ``libraries`` and the modules skipped (could not import here)."""
    targets: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for library in libraries:
        proc = subprocess.run([python, str(TARGETS_SCRIPT), library], capture_output=True,
                              text=True, cwd=REPO, env=library_env(library, stand_in),
                              check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            skipped.append({"module": library, "reason": f"not importable: {last[:160]}"})
            continue
        found = json.loads(proc.stdout)
        targets += found["targets"]
        skipped += found["skipped"]
    return targets, skipped


def scrub(line: str) -> str:
    """A line without this machine's paths (the docs must not carry them): files of installed
    packages from ``site-packages/``, this checkout's from its root, temporary ones elided."""
    line = re.sub(r"\S*/site-packages/", "site-packages/", line)
    line = line.replace(str(REPO) + os.sep, "")
    return re.sub(r"/(?:tmp|work|root|home)/\S*", "<path>", line)


def _first_line(stdout: str, stderr: str) -> str:
    """The first line that says what failed or was refused ("" for a clean pass)."""
    for line in stdout.splitlines():
        if line.startswith("✗"):
            return line.strip()
    for line in stderr.splitlines():
        if line.startswith("gradcheck-bi: error") or "Error" in line:
            return line.strip()
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _op_of(results: list[dict[str, Any]], recognised: str) -> str:
    """The op the tool ran: the JSON's ``op`` where present, else the recognition note's, else
    what the checks it ran imply (dz: gated, dresidual: fused add, dbias: layer_norm)."""
    ops = {r["op"] for r in results if r.get("op")}
    if ops:
        return ",".join(sorted(ops))
    named = re.search(r"recognised (\w+)", recognised)
    if named:
        return named.group(1)
    checks = {r.get("check") for r in results}
    for check, op in (("dz", "rms_norm_gated"), ("dresidual", "fused_add_rms_norm"),
                      ("dbias", "layer_norm")):
        if check in checks:
            return op
    return "rms_norm" if results else ""


def _variant_of(results: list[dict[str, Any]]) -> str:
    """What the run varied: the checks with a parameter (dw, dbias, dz) and the zcg settings."""
    checks = {r.get("check") for r in results}
    parts = [name for check, name in (("dw", "weight"), ("dbias", "bias"), ("dz", "gate"))
             if check in checks]
    if results and "dw" not in checks:
        parts.append("no weight")
    if any(r.get("zero_centered_gamma") for r in results):
        parts.append("zcg")
    return "+".join(parts)


def record_of(target: dict[str, Any], code: int | None, stdout: str, stderr: str,
              report: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """One class's record from its run (``code`` None: killed at the time limit)."""
    results = (report or {}).get("results", [])
    notes = [line.strip() for line in stderr.splitlines() if "note:" in line]
    recognised = next((n.split(": ", 2)[-1] for n in notes if "recognised" in n), "")
    statuses = Counter(r["status"] for r in results)
    if code is None:
        outcome = "timeout"
    elif code == 1:
        outcome = "fail" if statuses.get("fail") else "error"
    else:
        outcome = OUTCOMES.get(code, f"exit {code}")
    return {**target, "exit": code, "outcome": outcome, "op": _op_of(results, recognised),
            "variant": _variant_of(results), "recognised": recognised,
            "working_precision": ",".join(sorted({r["working_precision"] for r in results
                                                  if r.get("working_precision")})),
            "statuses": dict(sorted(statuses.items())),
            "unexpected": sum(not r.get("as_expected", True) for r in results),
            "seconds": round(seconds, 1),
            "first_line": "" if outcome == "pass" else scrub(_first_line(stdout, stderr))[:400],
            "notes": [scrub(n)[:300] for n in notes[:6]]}


def run_target(target: dict[str, Any], *, python: str = sys.executable,
               shape: str | None = SHAPE,
               timeout: float = TIMEOUT_S, device: str = "cpu", dtype: str | None = None,
               stand_in: bool = True, threads: int | None = None) -> dict[str, Any]:
    """Run ``gradcheck-bi run`` on one class as a new user would and return its record."""
    if target["library"] in CUDA_LIBRARIES and device != "cuda":
        return {**record_of(target, 0, "", "", None, 0.0), "exit": None, "outcome": NEEDS_CUDA,
                "first_line": "its Triton kernels need a CUDA device (not run on cpu)"}
    env = library_env(target["library"], stand_in)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="scoreboard-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [python, "-m", "gradcheck_bi", "run", "--kernel", target["kernel"],
               "--device", device, "--format", "json", "--output", str(out), "--no-progress"]
        if shape:
            cmd += ["--shape", shape]
        for arg in target["kernel_args"]:
            cmd += ["--kernel-arg", arg]
        if dtype:
            cmd += ["--dtype", dtype]
        start = time.perf_counter()
        # A session of its own, so that a class past its time limit is killed with its workers.
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            code = None
        seconds = time.perf_counter() - start
        report = json.loads(out.read_text()) if out.exists() else None
    return record_of(target, code, stdout, stderr, report, seconds)


# ---------------------------------------------------------------- the kept classification

def load_expected(path: Path = EXPECTED) -> dict[str, dict[str, str]]:
    """{class id: {"outcome", "verdict"?}} from the kept file ({} when there is none)."""
    if not path.exists():
        return {}
    return tomllib.loads(path.read_text())


def category_of(outcome: str, verdict: str) -> str:
    """Where a class counts: checked right, one of CATEGORIES, needs CUDA or unclassified."""
    if verdict.startswith("out of scope"):
        return "out of scope"
    if outcome == NEEDS_CUDA:
        return NEEDS_CUDA
    if outcome == "pass" or verdict.startswith("true defect"):
        return "checked right"
    for category in CATEGORIES:
        if verdict.startswith(category):
            return category
    return "unclassified"


def reason_of(verdict: str) -> str:
    return verdict.split(":", 1)[1].strip() if ":" in verdict else verdict


def compare(records: list[dict[str, Any]], expected: dict[str, dict[str, str]]) -> list[str]:
    """One line per class whose outcome differs from the kept one, is new, or is a non-pass
    without a hand classification."""
    lines = []
    for rec in records:
        kept = expected.get(rec["id"])
        if kept is not None and rec["outcome"] == NEEDS_CUDA:
            continue  # not run here: the kept outcome is a CUDA run's
        if kept is None:
            lines.append(f"NEW {rec['id']}: {rec['outcome']} — {rec['first_line'][:160]}")
        elif kept["outcome"] != rec["outcome"]:
            was = f"{kept['outcome']}" + (f" ({kept['verdict']})" if kept.get("verdict") else "")
            lines.append(f"CHANGED {rec['id']}: kept {was}; now {rec['outcome']}"
                         + (f" — {rec['first_line'][:160]}" if rec["first_line"] else ""))
        elif category_of(rec["outcome"], kept.get("verdict", "")) == "unclassified":
            lines.append(f"UNCLASSIFIED {rec['id']}: {rec['outcome']} — "
                         f"{rec['first_line'][:160]}")
    return lines


def updated_expected(records: list[dict[str, Any]], expected: dict[str, dict[str, str]]
                     ) -> dict[str, dict[str, str]]:
    """The kept file after this run: outcomes from the run; a verdict is kept where the outcome
    is unchanged, and an "out of scope" one always; other changed non-passes are unclassified."""
    new = dict(expected)
    for rec in records:
        kept = expected.get(rec["id"], {})
        if kept and rec["outcome"] == NEEDS_CUDA:
            continue  # not run here: the kept outcome is a CUDA run's
        verdict = kept.get("verdict", "")
        entry = {"outcome": rec["outcome"]}
        if verdict and (kept.get("outcome") == rec["outcome"]
                        or verdict.startswith("out of scope")):
            entry["verdict"] = verdict
        elif rec["outcome"] not in ("pass", NEEDS_CUDA):
            was = f" (was {kept['outcome']}: {verdict or 'pass'})" if kept else ""
            entry["verdict"] = f"unclassified{was}"
        new[rec["id"]] = entry
    return new


def write_expected(expected: dict[str, dict[str, str]], path: Path = EXPECTED) -> None:
    lines = ["# benchmarks/scoreboard.py's kept outcome per class (see its docstring).",
             "# verdict: true defect | out of scope | our false alarm | our refusal | broken,",
             "# then ': ' and one line of reason. A pass needs none.", ""]
    for ident in sorted(expected):
        entry = expected[ident]
        lines.append(f"[{json.dumps(ident)}]")
        lines += [f"{key} = {json.dumps(entry[key], ensure_ascii=False)}"
                  for key in ("outcome", "verdict") if key in entry]
        lines.append("")
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------- totals and the markdown

def tally(records: list[dict[str, Any]], expected: dict[str, dict[str, str]]
          ) -> dict[str, Counter[str]]:
    """Per library ("all" too): how many classes fall in each category, and per category how
    many for each reason ("reason:CATEGORY" keys)."""
    counts: dict[str, Counter[str]] = {"all": Counter()}
    for rec in records:
        verdict = expected.get(rec["id"], {}).get("verdict", "")
        if expected.get(rec["id"], {}).get("outcome") != rec["outcome"] \
                and not verdict.startswith("out of scope"):
            verdict = ""  # a changed outcome has no classification yet
        category = category_of(rec["outcome"], verdict)
        for key in ("all", rec["library"]):
            bucket = counts.setdefault(key, Counter())
            bucket["enumerated"] += 1
            bucket[category] += 1
            if category in CATEGORIES or verdict.startswith("true defect"):  # the latter
                # counts as checked right, and keeps its reason for its own table
                kind = category if category in CATEGORIES else "true defect"
                bucket[f"reason:{kind}:{reason_of(verdict)}"] += 1
    return counts


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "—"


def markdown(records: list[dict[str, Any]], expected: dict[str, dict[str, str]],
             skipped: list[dict[str, str]], meta: dict[str, Any]) -> str:
    counts = tally(records, expected)
    total = counts["all"]
    in_scope = total["enumerated"] - total["out of scope"] - total[NEEDS_CUDA]
    defects = sum(v for k, v in total.items() if k.startswith("reason:true defect:"))
    out = [f"Measured {meta['when']} by `{meta['command']}`: {meta['versions']}; "
           f"device {meta['device']}, dtype {meta['dtype']}, shape ({meta['shape']}), every "
           f"other option at its default; time limit {meta['timeout']:g} s per class; "
           f"{meta['jobs']} job(s); {meta['ran']} classes run in {meta['wall']:.0f} s wall "
           f"over {meta['calls']} call(s) ({meta['cached']} from an older cache); sum of "
           f"per-class times {meta['cpu']:.0f} s.",
           "",
           "| classes | count |", "|---|---:|",
           f"| enumerated | {total['enumerated']} |",
           f"| out of scope (not norms of a row, or not runnable by design) "
           f"| {total['out of scope']} |",
           f"| needs CUDA (not run here) | {total[NEEDS_CUDA]} |",
           f"| **in scope** | **{in_scope}** |",
           f"| **checked right with zero glue** | **{total['checked right']} "
           f"({_percent(total['checked right'], in_scope)})** |",
           f"| — of which a true defect caught | {defects} |",
           f"| our false alarms | {total['our false alarm']} |",
           f"| our refusals | {total['our refusal']} |",
           f"| broken | {total['broken']} |",
           f"| unclassified | {total['unclassified']} |", "",
           "| library | enumerated | out of scope | needs CUDA | in scope | checked right "
           "| false alarms | refusals | broken | unclassified |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for library in (*LIBRARIES, "all"):
        c = counts.get(library)
        if c is None:
            continue
        scope = c["enumerated"] - c["out of scope"] - c[NEEDS_CUDA]
        out.append(f"| {library} | {c['enumerated']} | {c['out of scope']} | {c[NEEDS_CUDA]} "
                   f"| {scope} | {c['checked right']} ({_percent(c['checked right'], scope)}) "
                   f"| {c['our false alarm']} | {c['our refusal']} | {c['broken']} "
                   f"| {c['unclassified']} |")
    for category in ("our false alarm", "our refusal", "broken", "out of scope", "true defect"):
        reasons = sorted(((v, k.split(":", 2)[2]) for k, v in total.items()
                          if k.startswith(f"reason:{category}:")), key=lambda t: (-t[0], t[1]))
        if reasons:
            out += ["", f"**{category}, by reason**", "", "| classes | reason |", "|---:|---|"]
            out += [f"| {n} | {_cell(reason)} |" for n, reason in reasons]
    if skipped:
        out += ["", "**Modules that could not be imported here (not counted)**", ""]
        out += [f"- `{s['module']}`: {_cell(s['reason'])}" for s in skipped]
    out += ["", "<details><summary>Every class: outcome, exit, recognised op and what it ran, "
            "working precision, result statuses, seconds, first failing line, verdict"
            "</summary>", "",
            "| class | outcome | exit | op (variant) | precision | statuses | s "
            "| first line | verdict |", "|---|---|---:|---|---|---|---:|---|---|"]
    for rec in sorted(records, key=lambda r: r["id"]):
        statuses = " ".join(f"{k} {v}" for k, v in rec["statuses"].items())
        verdict = expected.get(rec["id"], {}).get("verdict", "")
        out.append(f"| `{rec['id']}` | {rec['outcome']} | {rec['exit']} | {rec['op']} "
                   f"({rec['variant']}) | {rec['working_precision'] or '—'} | {statuses} "
                   f"| {rec['seconds']:g} | {_cell(scrub(rec['first_line'])[:200])} "
                   f"| {_cell(verdict)} |")
    out += ["", "</details>"]
    return "\n".join(out)


def write_doc(text: str, path: Path = DOC, begin: str = BEGIN, end: str = END) -> None:
    """Replace the text between the markers ``begin`` and ``end`` of ``path`` (the rest of the
    page is kept; markers it lacks are added at its end)."""
    page = path.read_text() if path.exists() else "# Scoreboard\n\n"
    if begin not in page:
        page = f"{page.rstrip()}\n\n{begin}\n{end}\n"
    head, _, rest = page.partition(begin)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


# ---------------------------------------------------------------- the command

def _versions() -> str:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return ", ".join(f"{d} {version(d)}" for d in ("torch", "transformers", "timm",
                                                    "liger-kernel", "fla-core"))


def fingerprint(options: dict[str, Any]) -> str:
    """Changes with the tool's source, the libraries' versions and the run's options."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    digest.update(_versions().encode())
    for path in sorted((REPO / "gradcheck_bi").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _load_cache(path: Path, key: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, float]]]:
    """The records of a cache with this fingerprint, and the calls that made them."""
    if not path.exists():
        return {}, []
    cache = json.loads(path.read_text())
    if cache.get("fingerprint") != key:
        return {}, []
    return cache["records"], cache.get("calls", [])


def _save_cache(path: Path, key: str, records: dict[str, dict[str, Any]],
                calls: list[dict[str, float]]) -> None:
    """Written whole and then renamed: a call killed at any moment leaves the last one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fingerprint": key, "records": records, "calls": calls},
                              indent=1))
    tmp.replace(path)


def _command(argv: list[str]) -> str:
    """This call's command line without the options that change no result (where the records
    and the page go, the budget, the Python): the docs must not carry a machine's paths."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--results", "--doc", "--deadline", "--python"):
            skip = True
        elif not arg.startswith(("--results=", "--doc=", "--deadline=", "--python=")):
            kept.append(arg)
    return " ".join(["benchmarks/scoreboard.py", *kept])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="run only classes whose id matches this glob (or contains it); "
                        "repeatable; the doc is not rewritten")
    p.add_argument("--library", action="append", choices=LIBRARIES, default=[],
                   help="only this library's classes (repeatable; default: all)")
    p.add_argument("--jobs", type=int, default=1, help="classes run at once (default 1)")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S,
                   help=f"seconds per class before it is killed (default {TIMEOUT_S:g})")
    p.add_argument("--shape", default=SHAPE,
                   help="--shape of every run (default: none given, the tool's own default)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default=None, help="--dtype of every run (default: the tool's)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of each run (default: 1 when --jobs > 1)")
    p.add_argument("--update-expected", action="store_true",
                   help="rewrite benchmarks/scoreboard_expected.toml from this run")
    p.add_argument("--fresh", action="store_true", help="ignore cached records")
    p.add_argument("--results", type=Path, default=RESULTS, help="the record cache (JSON)")
    p.add_argument("--doc", type=Path, default=DOC, help="the page the totals go to")
    p.add_argument("--python", default=sys.executable, help="the Python that runs the tool")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="wall-clock budget of this call: no class starts after it, a class "
                        "still running then is killed and left for the next call (not "
                        "recorded); the totals are written once every class has a record; "
                        f"exit {UNFINISHED} while classes are left")
    return p.parse_args(argv)


def _selected(ident: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(ident, p) or p in ident for p in patterns)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    libraries = args.library or list(LIBRARIES)
    stand_in = _torchvision_missing(args.python)
    targets, skipped = enumerate_targets(args.python, libraries, stand_in)
    targets = [t for t in targets if _selected(t["id"], args.only)]
    threads = args.threads or (1 if args.jobs > 1 else None)
    options = {"shape": args.shape, "device": args.device, "dtype": args.dtype,
               "timeout": args.timeout}
    key = fingerprint(options)
    cache, calls = ({}, []) if args.fresh else _load_cache(args.results, key)
    calls.append({"ran": 0, "wall": 0.0})
    todo = [t for t in targets if t["id"] not in cache]
    print(f"scoreboard: {len(targets)} classes ({len(targets) - len(todo)} cached); "
          f"torchvision {'stand-in' if stand_in else 'real'} for timm", file=sys.stderr)
    start = time.perf_counter()
    stop_at = None if args.deadline is None else started + args.deadline

    def one(target: dict[str, Any]) -> dict[str, Any] | None:
        """The class's record; None where the deadline came first (left for the next call)."""
        limit = args.timeout
        if stop_at is not None:
            limit = min(limit, stop_at - time.perf_counter())
            if limit <= 0:
                return None
        rec = run_target(target, python=args.python, shape=args.shape, timeout=limit,
                         device=args.device, dtype=args.dtype, stand_in=stand_in,
                         threads=threads)
        return None if rec["outcome"] == "timeout" and limit < args.timeout else rec

    ran = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        # Each record is kept as soon as its class ends: a call cut short loses only its own.
        for future in as_completed([pool.submit(one, t) for t in todo]):
            rec = future.result()
            if rec is None:
                continue
            ran += 1
            cache[rec["id"]] = rec
            calls[-1] = {"ran": ran, "wall": round(time.perf_counter() - start, 1)}
            _save_cache(args.results, key, cache, calls)
            print(f"[{ran}/{len(todo)}] {rec['id']}: {rec['outcome']} ({rec['seconds']:g} s)",
                  file=sys.stderr)
    wall = time.perf_counter() - start
    left = len(todo) - ran
    records = [cache[t["id"]] for t in targets if t["id"] in cache]
    expected = load_expected()
    changes = compare(records, expected)
    for line in changes:
        print(line)
    cuda_board = args.device == "cuda" and set(libraries) == set(CUDA_LIBRARIES)
    full = not args.only and not left and (not args.library or cuda_board)
    if full and not cuda_board:
        absent = sorted(set(expected) - {r["id"] for r in records})
        if absent:
            print(f"note: {len(absent)} kept classes not enumerated here (library not "
                  f"installed?), e.g. {absent[0]}", file=sys.stderr)
    if args.update_expected:
        expected = updated_expected(records, expected)
        write_expected(expected)
        print(f"wrote {EXPECTED.relative_to(REPO)} ({len(records)} classes of this run)")
    if full:
        calls = calls[:-1] + ([{"ran": ran, "wall": wall}] if ran else [])
        meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": _command(sys.argv[1:] if argv is None else argv),
                "versions": _versions(), "device": args.device,
                "dtype": args.dtype or ("the tool's default (fp32 on cuda)" if args.device == "cuda"
                                        else "the tool's default (fp64 on cpu)"),
                "shape": args.shape or "the tool's default, 2,8,256",
                "timeout": args.timeout, "jobs": args.jobs,
                "wall": sum(c["wall"] for c in calls),
                "ran": sum(c["ran"] for c in calls), "calls": len(calls),
                "cached": len(targets) - sum(c["ran"] for c in calls),
                "cpu": sum(r["seconds"] for r in records)}
        write_doc(markdown(records, expected, skipped, meta), args.doc,
                  *((BEGIN_CUDA, END_CUDA) if cuda_board else (BEGIN, END)))
        print(f"wrote {args.doc}")
    total = tally(records, expected)["all"]
    print(f"{len(records)} classes: {total['checked right']} checked right, "
          f"{total['out of scope']} out of scope, {total['our false alarm']} false alarms, "
          f"{total['our refusal']} refusals, {total['broken']} broken, "
          f"{total[NEEDS_CUDA]} need CUDA, {total['unclassified']} unclassified; "
          f"{len(changes)} changed from the kept file")
    if left:
        print(f"deadline: {left} of {len(targets)} classes left; run the same command again "
              f"to resume", file=sys.stderr)
        return UNFINISHED
    return 1 if changes and not args.update_expected else 0


if __name__ == "__main__":
    sys.exit(main())
