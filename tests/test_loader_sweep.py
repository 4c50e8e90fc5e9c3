"""``bench loader``: the input pipeline alone at each worker count, measured for real on a
pipeline whose cost is known (BENCH_SLOW_LOADER_MS sleeps before every image)."""

from __future__ import annotations

import json
import re

from conftest import run_bench

SLOW = {"BENCH_SLOW_LOADER_MS": "10"}  # one image per 10 ms and loader process, at most
SMALL = ["--cpu", "--data", "synthetic", "--train-limit", "512", "--batch-size", "32",
         "--steps", "8", "--format", "json"]


def test_more_workers_feed_a_slow_pipeline_faster():
    """Two processes drawing at once, each served by itself (0 workers) or by 2 workers: a
    process then feeds at most 100 or 200 img/s, so the pair at most 200 or 400."""
    proc = run_bench("loader", "--gpus", "2", "--workers", "0,2", *SMALL, env=SLOW)
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    assert (sweep["processes"], sweep["micro_batch_per_process"]) == (2, 16)
    alone, two = (p["images_per_s"] for p in sweep["points"])
    assert 100 <= alone <= 205, sweep["points"]
    assert 1.5 * alone <= two <= 410, sweep["points"]
    assert [n for n in sweep["notes"] if "SLOW LOADER INJECTED" in n] == [sweep["notes"][0]]


def test_the_processes_are_the_runs_and_the_view_fits_120_columns():
    """DataParallel is one process whatever --gpus (on CPU one replica: torch runs the model
    once), so its whole batch is drawn by that process and its workers."""
    proc = run_bench("loader", "--strategy", "dp", "--gpus", "2", "--workers", "1", *SMALL)
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    assert sweep["processes"] == 1 and sweep["micro_batch_per_process"] == 32
    assert [(p["workers_per_replica"], p["workers_per_process"]) for p in sweep["points"]] == [
        (1, 1)]
    text = run_bench("loader", *SMALL[:-2], "--workers", "0,1")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, text.stdout
    rows = [line.split() for line in lines if re.fullmatch(r" +\d+ +[\d,]+ +[\d.]+", line)]
    assert [r[0] for r in rows] == ["0", "1"], text.stdout


def test_the_gpu_loader_is_one_figure_without_workers():
    """--loader gpu keeps the set on the device and crops there: no workers to count."""
    proc = run_bench("loader", "--loader", "gpu", *SMALL)
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads(proc.stdout)["points"]
    assert point["workers_per_replica"] is None and point["images_per_s"] > 0, point
