"""Re-run the commands whose output README.md and docs/*.md quote, and paste it in again.

    make docs                                  # every block; rewrites the pages in place
    python docs/make_docs.py --check           # rewrites nothing; exit 1 naming stale blocks
    python docs/make_docs.py --only ci-gate    # one block

A quoted output sits between two marker comments, and nothing else in a page is written here:

    <!-- docs:begin NAME -->
    ...
    <!-- docs:end NAME -->

NAME is a key of BLOCKS: the commands it runs and how their output is cut down to what the
page quotes. Commands run as ``python -m gradcheck_bi`` from this checkout (shown as
``gradcheck-bi``) with no GPU visible, 80 columns and no colour, so a block reads the same on
every machine except for its timings. A block appears in exactly one page: each figure lives in
one place, and other pages link to it. GPU output cannot be re-run here; docs/ keeps it pasted
with the commit and date of the run that printed it, outside any marker.

tests/test_readme.py re-runs the default run (a few seconds) and fails when what the README's
block claims (the verdict line, the result counts, each cell's status and figures) no longer
matches what it prints.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"<!-- docs:begin ([\w-]+) -->\n(.*?)<!-- docs:end \1 -->", re.S)
VERDICT = re.compile(r"^\**(VERDICT: .*?)\**$", re.M)


@dataclass(frozen=True)
class Run:
    """One command as a reader would type it, and what it printed."""

    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    seconds: float  # wall, start to exit
    cpu_seconds: float  # user + system, the process and its children

    @property
    def command(self) -> str:
        return "gradcheck-bi " + shlex.join(self.args)

    def closing(self) -> list[str]:
        """stderr's lines, then stdout's closing block (after its last blank line)."""
        err = [ln for ln in self.stderr.splitlines() if ln and not ln.startswith("wrote ")]
        out = self.stdout.strip("\n").split("\n\n")[-1].splitlines()
        return err + [ln for ln in out if ln.strip()]

    def verdict(self) -> str:
        found = VERDICT.findall(self.stdout + "\n" + self.stderr)
        return found[-1] if found else ""


def gradcheck(*args: str, cwd: Path = ROOT) -> Run:
    """Run ``gradcheck-bi ARGS`` from this checkout, as if on a machine with no GPU."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", COLUMNS="80",
               NO_COLOR="1", TERM="dumb", PYTHONIOENCODING="utf-8")
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([sys.executable, "-m", "gradcheck_bi", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, encoding="utf-8", check=False)
    return Run(tuple(args), done.returncode, done.stdout, done.stderr,
               time.perf_counter() - started, _children_cpu() - cpu)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def prose(text: str) -> str:
    """One paragraph, wrapped as the pages are (100 columns)."""
    return textwrap.fill(text, width=95, break_on_hyphens=False, break_long_words=False) + "\n"


def transcript(runs: list[Run], keep: int = 12) -> str:
    """``$ command`` lines, each followed by its closing lines (at most ``keep``)."""
    out = []
    for run in runs:
        lines = run.closing()
        if len(lines) > keep:
            lines = [*lines[: keep - 1], f"… ({len(lines) - keep + 1} more lines)", lines[-1]]
        out += [f"$ {run.command}    # exit {run.code}", *lines, ""]
    return "```\n" + "\n".join(out).rstrip() + "\n```\n"


def markdown_section(markdown: str, heading: str) -> str:
    """The ``#### heading…`` section of a ``--format markdown`` report, up to the next one."""
    parts = re.split(r"(?m)^(?=#### )", markdown)
    for part in parts:
        if part.startswith("#### " + heading):
            return part.strip() + "\n"
    raise LookupError(f"no section starting {heading!r} in the report")


# --- the blocks --------------------------------------------------------------------------

DEFAULT_RUN = ("run", "--format", "markdown")
DEFAULT_TABLE = "dx: analytic vs central finite differences of the kernel's own forward · " \
                "zero_centered_gamma=off"


def default_run() -> str:
    run = gradcheck(*DEFAULT_RUN)
    return (prose(f"`{run.command}` — the default run, which `make run` makes, as Markdown — "
                  f"with no GPU visible (fp64 on CPU), exit {run.code}; its dx table at "
                  "zero_centered_gamma=off, and its verdict:") +
            f"\n{markdown_section(run.stdout, DEFAULT_TABLE)}\n**{run.verdict()}**\n")


def text_layout() -> str:
    run = gradcheck("run", "--check", "dx", "--zcg", "off", "--format", "text")
    return (prose(f"`{run.command}` at 80 columns (exit {run.code}):") + "\n"
            "```\n" + run.stdout.rstrip() + "\n```\n")


def ci_gate() -> str:
    out = ROOT / "gradcheck-bi.xml"
    existed, load = out.exists(), os.getloadavg()[0]
    try:
        run = gradcheck("run", "--case", "cases/ci.toml", "--kernel",
                        "tests/kernels/user_rmsnorm.py:DxDoubleWeight",
                        "--format", "junit", "--output", out.name)
    finally:
        if not existed:
            out.unlink(missing_ok=True)
    counted = re.search(r"of (\d+) results", run.verdict())
    total = counted.group(1) if counted else "?"
    return transcript([run]) + "\n" + prose(
        f"{total} results for one kernel: {run.seconds:.0f} s from start to exit, "
        f"{run.cpu_seconds:.0f} s of CPU, on this project's {os.cpu_count()}-core CPU machine "
        f"(shared with other work: load average {load:.1f} when it started).")


PYTEST_ARGS = ("--gradcheck-bi", "my_norm.py:DxDoubleWeight", "--gradcheck-bi-arg", "shape=3,16",
               "--gradcheck-bi-arg", "check=dx")


def _pytest(*args: str) -> str:
    """``pytest ARGS`` with the plugin, in a fresh folder holding only a user's kernel file
    (a copy of tests/kernels/user_rmsnorm.py): its ``$`` line and output, blank lines out."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", COLUMNS="80",
               NO_COLOR="1", TERM="dumb", PYTHONIOENCODING="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "my_norm.py").write_text(
            (ROOT / "tests" / "kernels" / "user_rmsnorm.py").read_text(encoding="utf-8"))
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "gradcheck_bi.pytest_plugin",
                               "-p", "no:cacheprovider", *args], cwd=tmp, env=env,
                              capture_output=True, text=True, encoding="utf-8", check=False)
    lines = [ln for ln in done.stdout.splitlines()
             if ln.strip() and not ln.startswith(("bringing up nodes", "===", "FAILED", "[gw"))]
    return "\n".join([f"$ pytest {shlex.join(args)}    # exit {done.returncode}", *lines])


def pytest_plugin() -> str:
    """One point selected with ``-k``: its id and the tool's one line."""
    return "```\n" + _pytest(*PYTEST_ARGS, "-q", "-k", "zcg_off and γrandn and not strided") \
        + "\n```\n"


def pytest_xdist() -> str:
    """The whole sweep, then on two workers (when pytest-xdist is installed): the same."""
    runs = [_pytest(*PYTEST_ARGS, "-q", "--junitxml=gradcheck-bi.xml")]
    if importlib.util.find_spec("xdist") is not None:
        runs.append(_pytest(*PYTEST_ARGS, "-q", "-n", "2"))
    return "```\n" + "\n\n".join(runs) + "\n```\n"


def own_kernels() -> str:
    refs = ("torch.nn:RMSNorm", "tests/kernels/hf_style.py:LlamaRMSNorm",
            "tests/kernels/hf_style.py:GemmaRMSNorm", "tests/kernels/hf_style.py:DoubleWeightNorm")
    runs = [gradcheck("run", "--kernel", ref, "--device", "cpu", "--dtype", "fp32")
            for ref in refs]
    runs.append(gradcheck("run", "--kernel", refs[1], "--check", "forward", "--zcg", "off"))
    return transcript(runs)


API_EXAMPLE = """\
import gradcheck_bi
try:
    gradcheck_bi.check("tests/kernels/user_rmsnorm.py:DxDoubleWeight", checks=["dx", "dw"],
                       weights=["randn", "ones"], shapes=[(4, 1000)], weight_scales=[30.0])
except gradcheck_bi.GradcheckFailure as failure:
    print(failure)
"""


def api_failure() -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", API_EXAMPLE], cwd=ROOT, env=env,
                          capture_output=True, text=True, encoding="utf-8", check=False)
    return "```\n" + (done.stdout or done.stderr).rstrip() + "\n```\n"


def step_sweep() -> str:
    base = ("plot", "--dtype", "fp64", "--device", "cpu", "--format", "json")
    runs = [gradcheck(*base, "--kernel", "before", "--kernel", "after", "--weight", "randn",
                      "--weight", "ones"),
            gradcheck(*base, "--kernel", "after", "--weight", "randn", "--stencil", "central-2")]
    rows = ["| kernel | γ | stencil | error at the run's step | smallest error (at h/ℓ) "
            "| slope, rounding side | slope, truncation side |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for run in runs:
        doc = json.loads(run.stdout)
        for c in doc["curves"]:
            at_run = c["max_abs_err"][c["step_rel"].index(doc["run_step_rel"])]
            slopes = [f"{s['slope']:+.2f}" if s else "— (flat)"
                      for s in (c["slope_rounding"], c["slope_truncation"])]
            rows.append(f"| {c['kernel']} | {c['weight']} | {doc['stencil']} | {at_run:.2e} "
                        f"| {c['min_err']:.2e} ({c['min_step_rel']:.2g}) | {slopes[0]} "
                        f"| {slopes[1]} |")
    doc = json.loads(runs[0].stdout)
    return (prose(f"`gradcheck-bi plot … --format json` ({doc['dtype']}, shape "
                  f"{'×'.join(map(str, doc['shape']))}; the run's step h/ℓ = "
                  f"{doc['run_step_rel']:.3g}), exit {max(r.code for r in runs)}:")
            + "\n" + "\n".join(rows) + "\n")


# Small kernels for the exit-code transcript, written to a scratch folder and loaded from it
# by a relative path (so no machine path shows in the output).
SCENARIO_FILES = {
    "typo.py": """\
import torch


def rms_norm(x, weight, eps):
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r * wieght  # the typo
""",
    "fp32_only.py": """\
import torch


def rms_norm(x, weight, eps):
    if x.dtype == torch.float64:
        raise NotImplementedError("rms_norm has no fp64 path")
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r * weight
""",
}


def exit_codes() -> str:
    hf = ROOT / "tests" / "kernels" / "hf_style.py"
    small = ("--shape", "2,3,16")
    with tempfile.TemporaryDirectory() as scratch:
        here = Path(scratch)
        for name, text in SCENARIO_FILES.items():
            (here / name).write_text(text)
        (here / "hf_style.py").write_text(hf.read_text())
        gradcheck("run", "--kernel", "after", "--check", "dx", "--zcg", "off", *small,
                  "--baseline", "after.json", "--update-baseline", cwd=here)
        runs = [gradcheck(*args, cwd=here) for args in (
            ("run", "--kernel", "typo.py:rms_norm", *small),
            ("run", "--kernel", "fp32_only.py:rms_norm", *small),
            ("run", "--kernel", "fp32_only.py:rms_norm", "--strict", *small),
            ("run", "--kernel", "hf_style.py:DoubleWeightNorm", "--zcg", "on", *small),
            ("run", "--kernel", "hf_style.py:DoubleWeightNorm", "--zcg", "on", "--bisect",
             *small),
            ("run", "--kernel", "after", "--check", "dx", "--zcg", "off", "--rtol", "1e-3",
             *small, "--baseline", "after.json"),
            ("run", "--kernel", "after", "--shape", "2,0,16"),
        )]
    return transcript(runs, keep=9)


# NAME → what makes its text: every command it quotes, re-run now.
BLOCKS: dict[str, Callable[[], str]] = {
    "default-run": default_run,
    "text-layout": text_layout,
    "ci-gate": ci_gate,
    "pytest-plugin": pytest_plugin,
    "pytest-xdist": pytest_xdist,
    "own-kernels": own_kernels,
    "api-failure": api_failure,
    "step-sweep": step_sweep,
    "exit-codes": exit_codes,
}


def blocks_in(text: str) -> dict[str, str]:
    """NAME → the text between its markers."""
    return {m.group(1): m.group(2) for m in MARKER.finditer(text)}


def rewrite(text: str, fresh: dict[str, str]) -> str:
    def put(m: re.Match[str]) -> str:
        name = m.group(1)
        body = fresh.get(name, m.group(2))
        return f"<!-- docs:begin {name} -->\n{body}<!-- docs:end {name} -->"
    return MARKER.sub(put, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each block whose text would change")
    parser.add_argument("--only", action="append", choices=sorted(BLOCKS), default=None,
                        help="regenerate only this block (repeatable)")
    opts = parser.parse_args(argv)
    texts = {page: page.read_text(encoding="utf-8") for page in PAGES}
    where = {name: page for page, text in texts.items() for name in blocks_in(text)}
    missing = sorted(set(BLOCKS) - set(where))
    if missing:
        print(f"make_docs: no page holds the block(s) {', '.join(missing)}", file=sys.stderr)
        return 2
    stale = []
    for name in opts.only or sorted(BLOCKS):
        page = where[name]
        fresh = BLOCKS[name]()
        changed = blocks_in(texts[page])[name] != fresh
        if changed:
            stale.append(f"{page.relative_to(ROOT)}: {name}")
            texts[page] = rewrite(texts[page], {name: fresh})
        print(f"make_docs: {name} ({page.relative_to(ROOT)}) "
              f"{'changed' if changed else 'unchanged'}", file=sys.stderr)
    if opts.check:
        for line in stale:
            print(f"stale: {line}")
        return 1 if stale else 0
    for page, text in texts.items():
        if text != page.read_text(encoding="utf-8"):
            page.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
