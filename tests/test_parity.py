"""bench parity --self-test: the accuracy comparison sees a planted cost and nothing where
the math is the same. CI runs a small version (3 seeds a row, a smaller, easier set and
fewer epochs than the calibrated workload of docs/parity.md)."""

from __future__ import annotations

import math
import re

import pytest
from conftest import run_bench

from bench.commands.parity import minimum_detectable

# The easy synthetic set, 1,024 images, 4 epochs at batch 32 (alone, 2026-11-28): ddp N=1
# ended at 60.3, 62.9 and 39.3 % top-1 (seeds 0-2), BatchNorm over 2 (--ghost-bn 2) at 17.9,
# 7.3 and 11.8 (p 0.019), the learning rate not scaled (÷8) at 14.4, 8.2 and 13.8 (p 0.024).
# 18 runs, 116 s and 176 CPU-s alone. The planted BatchNorm cost was 16 micro-batches of 2
# a step before (--grad-accum 16: the same math, tests/test_ghost_batchnorm.py), 21 s a run
# against 7.5 s. With 2 seeds a row it took 3.7 min and failed: BatchNorm over 2 ran 9.9 and
# 21.6 %, -45.9 points at p 0.069.
SMALL = ["--synthetic-difficulty", "0", "--train-limit", "1024", "--test-limit", "1000",
         "--epochs", "4", "--batch-size", "32", "--lr", "0.1"]


def test_the_minimum_detectable_difference_follows_students_t():
    """Two rows of 5 runs with SD 0.5: (t(0.975, 8) + t(0.8, 8)) x 0.5 x sqrt(2/5), with
    t(0.975, 8) = 2.3060 and t(0.8, 8) = 0.8889 (tables): 1.0103 points."""
    assert minimum_detectable(0.5, 5) == pytest.approx((2.3060 + 0.8889) * 0.5 * math.sqrt(0.4),
                                                       abs=2e-4)
    assert math.isnan(minimum_detectable(0.5, 1))


def test_the_self_test_sees_the_planted_costs_and_nothing_else(tmp_path):
    proc = run_bench("parity", "--self-test", "--repeats", "3", *SMALL, "--output",
                     str(tmp_path), timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        control = re.match(r"^((?:same math|planted): .+?)\s{2,}", line)
        if control:
            rows[control.group(1)] = line.split()[-1]
    assert rows == {"same math: dp = ddp": "ok", "same math: ddp-spawn = ddp": "ok",
                    "planted: BatchNorm over 2": "ok", "planted: lr not scaled ×8": "ok"}, \
        proc.stdout


@pytest.mark.parametrize("args, says", [
    ([], "add --self-test"),
    (["--self-test", "--repeats", "1"], "--repeats must be at least 2"),
    (["--self-test", "--grad-accum", "2"], "bench parity sets --grad-accum itself"),
    (["--self-test", "--ghost-bn", "2"], "bench parity sets --ghost-bn itself"),
])
def test_what_bench_parity_cannot_do_is_one_line(args, says):
    proc = run_bench("parity", *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr

