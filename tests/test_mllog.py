"""--mllog: the run's events as an MLPerf log, read back with the mlperf-logging package's own
parser (what MLPerf's compliance checker and result summarizer read)."""

from __future__ import annotations

import pytest
from conftest import assert_ok, only_record, run_bench

pytest.importorskip("mlperf_logging", reason="--mllog needs the mlperf-logging package "
                    "(pip install -e '.[mllog]')")

RUN = ["run", "--strategy", "ddp", "--gpus", "2", "--cpu", "--data", "synthetic",
       "--train-limit", "512", "--test-limit", "64", "--width", "0.125", "--batch-size", "32",
       "--no-progress", "--synthetic-difficulty", "0", "--comm-probe-steps", "0"]


def _parse(path):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    lines, errors = parse_file(str(path), ruleset="6.0.0")
    assert not errors, errors
    return lines


def test_the_log_is_mlperfs_view_of_the_run_and_stops_at_the_target(tmp_path):
    """Target 3 % is reached in an early epoch; bench trains on (no --stop-at-target), the
    log ends there like an MLPerf run, with its time from run_start to run_stop."""
    log = tmp_path / "logs" / "{run_id}.log"
    log.parent.mkdir()
    proc = run_bench(*RUN, "--epochs", "8", "--target-top1", "3", "--mllog", str(log),
                     "--output", str(tmp_path))
    assert_ok(proc)
    rec = only_record(tmp_path)
    path = tmp_path / "logs" / f"{rec['run_id']}.log"
    assert rec["config"]["mllog"] == str(path)
    assert f"\nbench: MLPerf log {path}\n" in proc.stdout, proc.stdout  # its name, said
    lines = _parse(path)
    keys = [line.key for line in lines]
    assert keys[:2] == ["cache_clear", "init_start"]
    values = {line.key: line.value["value"] for line in lines}
    assert values["submission_benchmark"] == "resnet18-cifar-synthetic"
    assert values["submission_platform"] == "2xcpu (ddp)"
    assert values["global_batch_size"] == 32 and values["seed"] == 0
    assert values["train_samples"] == 512 and values["eval_samples"] == 64
    assert values["target_accuracy"] == pytest.approx(0.03)
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("epoch_start")
    reached = rec["epochs_to_target"]
    assert reached is not None and reached < 8 and len(rec["per_epoch"]) == 8
    accuracy = [line for line in lines if line.key == "eval_accuracy"]
    assert [a.value["metadata"]["epoch_num"] for a in accuracy] == list(range(1, reached + 1))
    assert [a.value["value"] for a in accuracy] == pytest.approx(
        [e["top1"] for e in rec["per_epoch"][:reached]])
    assert keys[-1] == "run_stop" and keys.count("run_stop") == 1
    assert lines[-1].value["metadata"]["status"] == "success"
    start = next(line.timestamp for line in lines if line.key == "run_start")
    seconds = (lines[-1].timestamp - start) / 1000
    assert seconds == pytest.approx(rec["time_to_target_s"], abs=0.5)


def test_a_target_not_reached_ends_the_log_aborted(tmp_path):
    """The log goes in the run's own --output, which the run makes: a folder that does not
    exist yet was refused ("create that folder"), though the run was about to."""
    path = tmp_path / "new" / "run.log"
    proc = run_bench(*RUN, "--epochs", "2", "--target-top1", "100", "--mllog", str(path),
                     "--output", str(tmp_path / "new"))
    assert_ok(proc)
    assert f"\nbench: MLPerf log {path}\n" in proc.stdout, proc.stdout
    lines = _parse(path)
    assert [line.key for line in lines].count("eval_accuracy") == 2
    assert lines[-1].key == "run_stop" and lines[-1].value["metadata"]["status"] == "aborted"



ATTEMPT = """
import os, signal, sys
from bench.train.mllog import MLPerfLog
log = MLPerfLog.open(sys.argv[1], benchmark="resnet-synthetic", platform="cpu",
                     hyperparameters={"global_batch_size": 32}, target_top1=None)
log.run_start()
log.epoch_start(1)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
log.epoch_stop(1)
log.run_stop(success=True)
log.close()
"""


def test_an_attempt_whose_rank_0_was_killed_ends_aborted_in_the_log(tmp_path):
    """A first attempt whose rank 0 died of SIGKILL (the kernel's out-of-memory killer, or
    torchrun's kill of a rank that outlived its grace) left a run_start without a run_stop:
    torchrun's next attempt appended its own, and the log read as one run whose first
    attempt never ended (seen as ['success'] where the restart test wants ['aborted',
    'success'], on a loaded machine). The next attempt ends it, at its last event's time."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    path = tmp_path / "run.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", ATTEMPT, str(path), "killed"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = subprocess.run([sys.executable, "-c", ATTEMPT, str(path), "whole"],
                            env={**env, "TORCHELASTIC_RESTART_COUNT": "1"},
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    lines = _parse(path)
    keys = [line.key for line in lines]
    assert keys.count("init_start") == 2 and keys.count("run_start") == 2, keys
    stops = [line for line in lines if line.key == "run_stop"]
    assert [s.value["metadata"]["status"] for s in stops] == ["aborted", "success"], keys
    # the aborted stop closes the first attempt (before the second's init_start), at the time
    # of its last event, the epoch it was killed in
    first_stop = keys.index("run_stop")
    assert keys[first_stop - 1] == "epoch_start" and first_stop < keys.index("init_start", 2)
    assert lines[first_stop].timestamp == lines[first_stop - 1].timestamp
    # a whole attempt before is not stopped twice
    third = subprocess.run([sys.executable, "-c", ATTEMPT, str(path), "whole"],
                           env={**env, "TORCHELASTIC_RESTART_COUNT": "2"},
                           capture_output=True, text=True, timeout=60)
    assert third.returncode == 0, third.stderr
    assert [line.key for line in _parse(path)].count("run_stop") == 3
