"""bench project: NCCL's all-reduce cost model and DDP's bucket overlap against values worked
out by hand, and the model's prediction of real 2-rank runs (with an injected slow link)
against what they measured."""

from __future__ import annotations

import json

import pytest
from conftest import assert_ok, run_bench

from bench.projection import Network, Workload, allreduce_s, project

NET = Network("test", 400.0, 400.0, "nvlink", "hand-written")


def test_a_large_all_reduce_takes_the_ring_a_small_one_at_scale_the_tree():
    # ring/Simple: 8.4 us + 14 hops x 3.4 us + 100 MB x 14/8 / 400 GB/s
    assert allreduce_s(100_000_000, 8, 1, NET) == pytest.approx(56e-6 + 437.5e-6)
    # 1 KiB over 4,096 GPUs on 512 nodes: the ring's 8,190 hops cost 34 ms; the LL tree
    # 4.4 + 2 (7 x 0.52 + 9 x 5.0) us plus 1 KiB at 400 GB/s x 0.9 / 3.8 x 0.5
    tree = (4.4 + 2 * (7 * 0.52 + 9 * 5.0)) * 1e-6 + 1024 / (400e9 * 0.9 / 3.8 * 0.5)
    assert allreduce_s(1024, 4096, 512, NET) == pytest.approx(tree)
    assert allreduce_s(1024, 1, 1, NET) == 0.0


def test_ddp_buckets_overlap_backward_and_a_blocking_hook_delays_it():
    """90 ms compute: forward 30, backward 60; three 1 MiB buckets ready at 50, 70, 90 ms;
    an all-reduce of 1 MiB takes 1.048576 ms at 1 GB/s: only the last one shows."""
    work = Workload("ddp", 0.090, 3 * 2**20, 2**20)
    p = project(work, 2, 2, NET, measured_allreduce=lambda size: size / 1e9)
    assert p.step_s == pytest.approx(0.090 + 2**20 / 1e9)
    assert p.exposed_s == pytest.approx(2**20 / 1e9)
    # a 10 ms blocking wait before each bucket: ready at 60, 90, 120 ms
    slow = Workload("ddp", 0.090, 3 * 2**20, 2**20, hook_delay_s=0.010)
    assert project(slow, 2, 2, NET, measured_allreduce=lambda size: size / 1e9).step_s == (
        pytest.approx(0.120 + 2**20 / 1e9))
    assert project(Workload("dp", 0.09, 1, 1), 16, 8, NET).bottleneck == (
        "1 process, 1 node max")


def test_the_model_predicts_measured_two_rank_runs(tmp_path):
    """Each run's own compute-only step plus the probe's all-reduce curve predicts its step
    time, with and without a 30 ms blocking delay per bucket (3 buckets at 1 MB)."""
    assert_ok(run_bench("probe", "--cpu", "--gpus", "2", "--width", "0.25", "--max-size", "16",
                        "--output", str(tmp_path)))
    for delay in ("0", "30"):
        assert_ok(run_bench("run", "--strategy", "ddp", "--cpu", "--gpus", "2", "--width",
                            "0.25", "--batch-size", "64", "--epochs", "2", "--train-limit",
                            "512", "--test-limit", "64", "--data", "synthetic",
                            "--bucket-cap-mb", "1", "--comm-probe-steps", "10", "--no-progress",
                            "--output", str(tmp_path), env={"BENCH_SLOW_COMM_MS": delay}))
    proc = run_bench("project", str(tmp_path), "--validate")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "projection-validation.json").read_text())
    assert sorted(p["injected_delay_ms"] for p in summary["points"]) == [0, 30]
    for point in summary["points"]:  # the goal is 15 %; a loaded 2-core machine adds noise
        assert abs(point["error_pct"]) < 25, proc.stdout
    shown = run_bench("project", str(tmp_path), "--network", "probe", "--gpus", "2,16")
    assert shown.returncode == 0, shown.stderr
    assert "last validated" in shown.stdout and "(projected from its runs" in shown.stdout


def test_csv_keeps_options_with_commas_in_one_field_and_a_closed_pipe_is_quiet():
    import csv
    import subprocess
    import sys

    from conftest import ROOT

    proc = run_bench("project", str(ROOT / "results"), "--gpus", "8,4096", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(proc.stdout.splitlines()))
    assert {r["options"] for r in rows} >= {"gpu-data,NHWC,compile,fused", "—"}
    assert {r["gpus"] for r in rows} == {"8", "4096"}
    head = subprocess.run(f"{sys.executable} -m bench project results --format csv | head -1",
                          shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in head.stderr and head.stdout.startswith("workload,"), head.stderr
