"""What ``main`` refuses before torch is imported: unwritable outputs, in under a second.

Also the start-up paths that must stay one line: ``--version``, ``-h``, Ctrl-C while the
commands are still being imported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.cli.early import UsageError, check_writable, preflight

ROOT = Path(__file__).resolve().parents[1]


def gradcheck(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "100"}
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gradcheck_bi", *args], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=120)
    return p, time.monotonic() - started


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, f"expected one line, got:\n{err}"
    return lines[0]


def test_missing_output_folder_is_refused_in_under_a_second(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "r.xml"
    p, seconds = gradcheck("run", "--case", "cases/ci.toml", "--format", "junit",
                           "--output", str(target))
    assert p.returncode == 2, p.stderr
    line = one_line(p.stderr)
    assert "--output" in line and "does not exist" in line, line
    assert seconds < 1.0, f"refused after {seconds:.2f} s (torch imported first?)"
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(("where", "needle"), [
    ("/proc/x.json", "cannot create a file in /proc"),
    ("{tmp}", "is a folder"),
    ("{tmp}/file.txt/r.json", "is not a folder"),
    ("/dev/null", "not a regular file"),
])
def test_unwritable_output_is_one_clean_line(tmp_path: Path, where: str, needle: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    path = Path(where.format(tmp=tmp_path))
    with pytest.raises(UsageError) as info:
        check_writable(path, "--output")
    message = str(info.value)
    assert needle in message and str(path) in message, message
    assert ".tmp" not in message and "Errno" not in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # no probe left


@pytest.mark.parametrize("args", [
    ["run", "--output", "{tmp}/missing/r.json"],
    ["run", "--output={tmp}/missing/r.json"],
    ["run", "--baseline", "{tmp}/missing/b.json", "--update-baseline"],
    ["run", "--format", "markdown", "--plot", "{tmp}/no-such.png"],
    ["plot", "--output", "{tmp}/missing/p.png"],
])
def test_preflight_checks_every_path_a_command_writes(tmp_path: Path, args: list[str]) -> None:
    with pytest.raises(UsageError):
        preflight([a.format(tmp=tmp_path) for a in args])


def test_preflight_leaves_everything_else_to_the_parser(tmp_path: Path) -> None:
    preflight(["run", "--baseline", str(tmp_path / "missing" / "b.json")])  # read, not written
    preflight(["run", "--output", str(tmp_path / "missing" / "r.json"), "--help"])
    preflight(["--version"])
    preflight(["run", "--output", str(tmp_path / "r.json")])


def test_version_and_short_help() -> None:
    p, _ = gradcheck("--version")
    assert p.returncode == 0 and p.stdout.startswith("gradcheck-bi "), p
    from gradcheck_bi import __version__

    assert __version__ in p.stdout
    p, _ = gradcheck("run", "-h")
    assert p.returncode == 0, p.stderr
    assert "--kernel" in p.stdout and "Exit codes" in p.stdout


def test_ctrl_c_before_the_commands_are_loaded_is_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(args: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "preflight", interrupted)
    assert cli.main(["run"]) == 130
    assert "interrupted" in one_line(capsys.readouterr().err)


@pytest.mark.slow  # timing-dependent: where each Ctrl-C lands moves with the machine's load
@pytest.mark.parametrize("after_s", [0.5, 1.0, 1.5])
def test_ctrl_c_in_the_first_seconds_stops_the_run_without_a_traceback(after_s: float) -> None:
    # 0.5 s: imports; 1.0–1.5 s: the kernels' recording children and the workers being
    # forked (where a KeyboardInterrupt inside fork's own handlers was once dropped: exit 0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gradcheck_bi", "run"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if proc.returncode == -signal.SIGINT:
        # Python itself ended the process by SIGINT (inside its own start-up or shutdown, or
        # after the line below); a shell reports that as 130 too
        assert err == "" or "interrupted" in one_line(err), err
    else:
        assert proc.returncode == 130, f"exit {proc.returncode}; stderr: {err}"
        assert "interrupted" in one_line(err)


def test_ctrl_c_while_a_child_starts_is_raised_after_it_started() -> None:
    import multiprocessing as mp

    from gradcheck_bi.kernels.adapting.sandbox import ctrl_c_after_start

    child = mp.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
    reached = []
    found = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_after_start(child):
            child.start()
            signal.raise_signal(signal.SIGINT)  # as if pressed inside fork's handlers
            reached.append("the rest of the start")
    assert reached == ["the rest of the start"]
    assert signal.getsignal(signal.SIGINT) is found
    assert child.exitcode == -signal.SIGKILL  # killed and reaped before the raise: no orphan
    calm = mp.get_context("fork").Process(target=time.sleep, args=(0,), daemon=True)
    with ctrl_c_after_start(calm):  # not pressed: nothing raised, the child left running
        calm.start()
    calm.join()
    assert calm.exitcode == 0
