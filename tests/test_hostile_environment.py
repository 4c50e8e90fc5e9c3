"""The environment bench starts in cannot end it in a traceback: an ASCII-only encoding, a
closed stdout or stdin, garbage in the test hooks' variables."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, only_record

from tests.report_records import record, write_runs

TINY = ["--cpu", "--data", "synthetic", "--train-limit", "128", "--test-limit", "32",
        "--width", "0.125", "--batch-size", "32", "--epochs", "1", "--no-progress",
        "--comm-probe-steps", "0"]


def _bench(args, env=None, close=(), **kwargs):
    def closing() -> None:
        for fd in close:
            os.close(fd)

    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT,
                          env={**os.environ, **(env or {})}, preexec_fn=closing,
                          timeout=300, **kwargs)


def test_an_ascii_terminal_gets_the_report_and_a_run(tmp_path):
    ascii_only = {"PYTHONIOENCODING": "ascii", "LC_ALL": "C"}
    results = write_runs(tmp_path / "results", [
        {**record("a", "ddp", 2, [2.0, 1.0], [0.1, 0.2]), "initial_param_fingerprint": "a",
         "initial_reference_fingerprint": "a"}])
    proc = _bench(["report", "--results", str(results), "--no-write"], env=ascii_only,
                  capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
    assert b"ddp" in proc.stdout and proc.stdout.isascii()
    out = tmp_path / "run"
    proc = _bench(["run", "--strategy", "ddp", "--gpus", "2", *TINY, "--output", str(out)],
                  env=ascii_only, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert only_record(out)["status"] == "ok"


@pytest.mark.parametrize("closed", [(1,), (0, 1), (1, 2)])
def test_closed_standard_streams_end_nothing(closed, tmp_path):
    """With descriptor 1 closed, the next file bench opened became every child's stdout
    (and Python had no sys.stdout): `bench list >&-` ended in a traceback, a run too, its
    record left `running`."""
    assert _bench(["list"], close=closed, stderr=subprocess.PIPE).returncode == 0
    out = tmp_path / "run"
    proc = _bench(["run", "--strategy", "ddp", "--gpus", "2", *TINY, "--output", str(out)],
                  close=closed, stderr=subprocess.DEVNULL if 2 in closed else subprocess.PIPE)
    assert proc.returncode == 0, proc.stderr
    rec = only_record(out)
    assert rec["status"] == "ok"


@pytest.mark.parametrize("variable, value", [
    ("BENCH_FAULT", "garbage"), ("BENCH_FAULT", "raise:one:3"), ("BENCH_FAULT", "explode:0:1"),
    ("BENCH_FAULT", "raise:0:1,"), ("BENCH_INJECT_DEFECT", "nonsense"),
])
def test_garbage_in_a_test_hook_is_one_line_before_anything_is_written(variable, value,
                                                                       tmp_path):
    out = tmp_path / "run"
    proc = _bench(["run", "--strategy", "ddp", "--gpus", "2", *TINY, "--output", str(out)],
                  env={variable: value}, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and variable in proc.stderr, proc.stderr
    assert not out.exists()
