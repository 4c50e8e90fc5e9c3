"""A rank's start-up runs without Python's cyclic collector, and its training with it
(bench.tools.collector): the collector is off while the model is built in each rank, on
from the first training step, and what start-up made is frozen out of its collections."""

from __future__ import annotations

import re

import pytest
from conftest import NO_PROBE, USER_MODELS, assert_ok, run_bench

# importing torch leaves 182,000 objects the collector tracks (330,000 in a DDP rank here)
STARTUP_OBJECTS = 50_000


@pytest.mark.parametrize("strategy", ["ddp", "ddp-spawn"])
def test_the_collector_waits_for_the_build_and_runs_in_training(strategy, tmp_path):
    log = tmp_path / "collector.log"
    proc = run_bench("run", "--strategy", strategy, "--gpus", "2", "--cpu", "--data",
                     "synthetic", "--train-limit", "128", "--test-limit", "32", "--epochs", "1",
                     "--batch-size", "32", "--no-progress", *NO_PROBE, "--model",
                     "user_models:collector_watch", "--output", str(tmp_path / "out"),
                     env={**USER_MODELS, "COLLECTOR_LOG": str(log)})
    assert_ok(proc)
    lines = log.read_text().splitlines()
    first = {}  # (phase, rank): (enabled, frozen) the first time (rank 0 builds a second
    for line in lines:  # model later, for the record's FLOPs count: the collector is on)
        m = re.fullmatch(r"(\w+) rank=(\d) enabled=(\w+) frozen=(\d+)", line)
        assert m, lines
        first.setdefault(m.group(1, 2), (m[3], int(m[4])))
    assert sorted(first) == [("build", "0"), ("build", "1"), ("train", "0"), ("train", "1")], \
        lines
    for rank in "01":
        assert first["build", rank] == ("False", 0), lines
        enabled, frozen = first["train", rank]
        assert enabled == "True" and frozen > STARTUP_OBJECTS, lines
