"""One set of stop signals for every command: SIGTERM and SIGHUP (a closed terminal, a
dropped ssh connection) end `bench run`, `bench sweep` and `bench verify` as Ctrl-C does —
ranks stopped, the record `interrupted`, the scratch folder and the sweep's claim gone, exit
130 — and a compound command stops at once rather than going on to its next part."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from conftest import ROOT, alive, only_record

SMALL = ["--cpu", "--data", "synthetic", "--train-limit", "512", "--test-limit", "32",
         "--width", "0.125", "--batch-size", "32", "--no-progress", "--epochs", "500",
         "--comm-probe-steps", "0"]


def _hangup_as_usual() -> None:
    """In the child: SIGHUP's default, whatever this test runs under (`nohup make test`
    would pass its ignored SIGHUP on, and bench keeps an ignored SIGHUP ignored)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _env(tmp: Path) -> dict[str, str]:
    """The run's temporary folder is the test's own: what it leaves there is visible."""
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def _left_in(tmp: Path) -> list[str]:
    """What bench left in its temporary folder (torch's compile cache is torch's)."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor"))


def _hung_up(command: list[str], out: Path, tmp: Path, timeout: float = 60):
    """Start bench COMMAND (output in OUT, temporary files in TMP), SIGHUP it once its run
    recorded an epoch; (exit code, what it printed)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench", *command, "--output", str(out)],
                            cwd=ROOT, env=_env(tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_hangup_as_usual)
    try:
        _recorded_epoch(out)
        proc.send_signal(signal.SIGHUP)
        text, _ = proc.communicate(timeout=timeout)
    finally:
        _end(proc)
    return proc.returncode, text


def _end(proc: subprocess.Popen) -> None:
    """A run the test left running (it failed) must not train on beside the suite."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _recorded_epoch(output: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (output / "runs").glob("*.json") if (output / "runs").is_dir() else []:
            try:
                if json.loads(path.read_text()).get("per_epoch"):
                    return
            except ValueError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"no epoch recorded under {output}")


@pytest.mark.parametrize("strategy", ["ddp", "dp"])
def test_sighup_closes_the_run_as_sigterm_does(strategy, tmp_path):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    rc, text = _hung_up(["run", "--strategy", strategy, "--gpus", "2", *SMALL], out, tmp)
    assert rc == 130, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    assert text.strip().splitlines()[-1].startswith("bench: run interrupted: SIGHUP (record ")
    rec = only_record(out)
    assert rec["status"] == "interrupted" and rec["error"] == "SIGHUP"
    assert rec["per_epoch"] and rec["finished_at"]
    assert _left_in(tmp) == []
    assert not alive(rec["run_id"]) and not alive(str(out))


def test_a_closed_terminal_closes_the_run(tmp_path):
    """The real thing: bench's controlling terminal goes away (its pty's master closes).
    The kernel sends SIGHUP, and every later write to the terminal fails with EIO."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    master, slave = os.openpty()

    def take_terminal() -> None:  # after setsid (start_new_session): the pty is ours
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        _hangup_as_usual()

    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--strategy", "ddp", "--gpus", "2", *SMALL,
         "--output", str(out)], cwd=ROOT, env=_env(tmp), stdin=slave, stdout=slave,
        stderr=slave, start_new_session=True, preexec_fn=take_terminal)
    os.close(slave)
    try:
        _recorded_epoch(out)
        os.set_blocking(master, False)
        try:
            while os.read(master, 65536):  # what it wrote so far
                pass
        except (BlockingIOError, OSError):
            pass
        os.close(master)  # the terminal closes
        master = -1
        rc = proc.wait(timeout=60)
    finally:
        if master >= 0:
            os.close(master)
        _end(proc)
    rec = only_record(out)
    assert rc == 130 and rec["status"] == "interrupted", (rc, rec["status"], rec.get("error"))
    assert rec["error"] == "SIGHUP"
    assert _left_in(tmp) == []
    assert not alive(rec["run_id"]) and not alive(str(out))


def test_nohup_keeps_a_run_going_through_a_hangup(tmp_path):
    """A SIGHUP the user told bench to ignore (nohup) stays ignored."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    proc = subprocess.Popen(
        ["nohup", sys.executable, "-m", "bench", "run", "--strategy", "ddp", "--gpus", "1",
         *SMALL, "--epochs", "2", "--output", str(out)], cwd=ROOT, env=_env(tmp),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _recorded_epoch(out)
        proc.send_signal(signal.SIGHUP)
        text, _ = proc.communicate(timeout=120)
    finally:
        _end(proc)
    assert proc.returncode == 0, text[-2000:]
    assert only_record(out)["status"] == "ok"


def test_sighup_ends_a_sweep_with_its_claim_and_its_run_closed(tmp_path):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    rc, text = _hung_up(["sweep", "--strategies", "ddp", "--gpus", "1,2", *SMALL], out, tmp)
    assert rc == 130, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    rec = only_record(out)  # the second combination never started
    assert rec["status"] == "interrupted", rec["status"]
    assert list((out / "runs" / ".claims").iterdir()) == []
    assert _left_in(tmp) == []
    assert not alive(str(out))


def test_sigterm_stops_verify_instead_of_failing_its_strategy(tmp_path):
    """verify runs one strategy after another: a SIGTERM during the first is the user
    stopping verify (exit 130 at once), not that strategy failing and the next one starting."""
    tmp = tmp_path / "tmp"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "verify", "--cpu", "--gpus", "2", "--strategies",
         "ddp,ddp-spawn", "--steps", "400", "--batch-size", "8"], cwd=ROOT, env=_env(tmp),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp.glob("bench-verify-ddp-*/results/runs/*.json")):
            assert time.monotonic() < deadline and proc.poll() is None, "verify never began"
            time.sleep(0.2)
        time.sleep(3)  # its ranks are training
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    finally:
        _end(proc)
    assert time.monotonic() - signalled < 30
    assert proc.returncode == 130, text[-2000:]
    assert "FAIL" not in text, text
    assert not any(line.startswith("ddp-spawn") for line in text.splitlines()), text
    assert "Traceback" not in text, text[-3000:]
    assert _left_in(tmp) == []


HOLD_CHILD = """
import os, signal, sys
from bench.tools.errors import Interrupted, catch_stop_signals, signals_held
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
catch_stop_signals()
try:
    with signals_held():
        os.kill(os.getpid(), signal.SIGHUP)   # ignored: never delivered
        os.kill(os.getpid(), signal.SIGTERM)  # held
        os.kill(os.getpid(), signal.SIGINT)   # held, after SIGTERM
        sum(range(10**6))                     # many chances to run a handler
        print("body finished", flush=True)
except Interrupted as exc:
    print("interrupted by", exc, flush=True)
except KeyboardInterrupt:
    print("keyboard interrupt", flush=True)
"""


def test_a_signal_while_torch_is_imported_waits_for_the_import_to_end():
    """SIGTERM during `import torch` aborted `bench run` (SIGABRT, exit -6: "terminate called
    after throwing pybind11::error_already_set"): torch's C++ initialisation runs Python code,
    and a handler raising there cannot unwind through C++. Commands now import torch with the
    signals held: the body ends, then the first held signal ends the command as usual; a
    signal the process ignores stays ignored."""
    done = subprocess.run([sys.executable, "-c", HOLD_CHILD], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["body finished", "interrupted by SIGTERM"], done.stdout
