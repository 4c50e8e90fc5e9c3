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

