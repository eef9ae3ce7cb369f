"""``git bisect run gradcheck-bi run --bisect …`` finds the commit that introduced a defect.

A throwaway repository with a kernel file's history: a correct RMSNorm, a commit that
breaks the file (it cannot even be imported: ``--bisect`` exits 125, git's *skip*), its
fix, and the commit that multiplies dx's variance term by the weight twice. ``git bisect
run`` with the tool must name the defect's commit, having skipped the broken one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_bi import cli

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "kernels" / "user_rmsnorm.py"
CHECK = ["run", "--bisect", "--kernel", "norm.py:Norm", "--check", "dx", "--weight", "randn",
         "--zcg", "off", "--shape", "2,64"]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True,
                          check=True, timeout=600).stdout


def build_history(repo: Path) -> dict[str, str]:
    """Commit the kernel's history; returns commit message → sha."""
    source = KERNELS.read_text()
    git(repo, "init", "-q", "-b", "main")
    history = [
        ("add a batch-invariant RMSNorm", source + '\nNorm = _make("Norm")\n'),
        ("docs", None),
        ("refactor (broken: does not import)", source + '\nNorm = _make("Norm"\n'),
        ("fix the refactor", source + '\nNorm = _make("Norm")\n'),
        ("fuse the backward", source + '\nNorm = _make("Norm", dx_double_weight=True)\n'),
    ]
    shas = {}
    for message, text in history:
        if text is None:
            (repo / "NOTES.md").write_text("notes\n")
        else:
            (repo / "norm.py").write_text(text)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", message)
        shas[message] = git(repo, "rev-parse", "HEAD").strip()
    return shas


def test_bisect_maps_could_not_run_to_125(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.py").write_text("class Norm(:\n")
    args = [a.replace("norm.py", str(tmp_path / "broken.py")) for a in CHECK]
    assert cli.main(args) == 125
    assert cli.main([a for a in args if a != "--bisect"]) == 2
    assert cli.main(["run", "--bisect", "--device", "cuda", "--check", "forward",
                     "--kernel", "after"]) in (0, 125)  # 125 where no GPU (exit 3 → skip)
    capsys.readouterr()


def test_git_bisect_run_finds_the_commit_that_doubled_the_weight(tmp_path: Path) -> None:
    shas = build_history(tmp_path)
    git(tmp_path, "bisect", "start", "HEAD", shas["add a batch-invariant RMSNorm"])
    runner = tmp_path / "gradcheck-bi"  # the command as a user runs it, from this checkout
    runner.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m gradcheck_bi "
                      '"$@"\n')
    runner.chmod(0o755)
    out = git(tmp_path, "bisect", "run", str(runner), *CHECK)
    assert f"{shas['fuse the backward']} is the first bad commit" in out, out
    log = git(tmp_path, "bisect", "log")
    assert f"git bisect skip {shas['refactor (broken: does not import)']}" in log, log
