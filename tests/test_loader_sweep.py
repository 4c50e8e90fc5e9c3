"""``bench loader``: the input pipeline alone at each worker count, measured for real on a
pipeline whose cost is known (BENCH_SLOW_LOADER_MS sleeps before every image)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, run_bench

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


def test_more_workers_than_cores_are_said_once_not_by_every_loader(tmp_path):
    """One worker more than the cores a process may use: torch's DataLoader warned twice for
    each loader and rank (four 300-character warnings in a 2-rank run); bench says it
    once, and bench loader, whose counts are the experiment, not at all."""
    many = str(len(os.sched_getaffinity(0)) + 1)
    swept = run_bench("loader", "--gpus", "1", "--workers", f"0,{many}", *SMALL)
    assert swept.returncode == 0, swept.stderr
    assert "DataLoader will create" not in swept.stderr, swept.stderr
    ran = run_bench("run", "--strategy", "ddp", "--gpus", "2", "--cpu", "--data", "synthetic",
                    "--train-limit", "64", "--test-limit", "32", "--batch-size", "16",
                    "--epochs", "1", "--width", "0.125", "--no-progress", "--workers", many,
                    "--comm-probe-steps", "0", "--loader-probe-steps", "0",
                    "--output", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    assert "DataLoader will create" not in ran.stderr, ran.stderr
    assert ran.stderr.count(f"bench: note: {many} loader workers a process, on ") == 1, ran.stderr


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
    # the answer under the figures: the count whose figure is highest, and the rate above
    # which a model is input-bound even with it (85 % of that figure)
    best = max(rows, key=lambda r: float(r[1].replace(",", "")))
    said = " ".join(text.stdout.split())
    assert f"→ fastest here: {best[0]} workers per replica ({best[1]} img/s)" in said, said
    limit = re.search(r"one faster than ([\d,]+) img/s is", said)
    assert limit and abs(float(limit[1].replace(",", "")) / float(best[1].replace(",", ""))
                         - 0.85) < 0.001, said


def test_the_gpu_loader_is_one_figure_without_workers():
    """--loader gpu keeps the set on the device and crops there: no workers to count."""
    proc = run_bench("loader", "--loader", "gpu", *SMALL)
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads(proc.stdout)["points"]
    assert point["workers_per_replica"] is None and point["images_per_s"] > 0, point


def test_a_process_killed_mid_sweep_ends_it_at_once_with_one_line():
    """kill -9 leaves no exception to report: the sweep sees the process gone (not after
    its 600 s answer timeout) and says which, with exit 1."""
    cmd = [sys.executable, "-m", "bench", "loader", "--gpus", "2", "--workers", "0",
           *SMALL[:-2], "--steps", "400"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **SLOW})
    deadline = time.monotonic() + 60
    children: list[int] = []
    while len(children) < 2 and time.monotonic() < deadline:  # both sweep processes up
        time.sleep(0.2)
        children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                    .read_text().split()
                    if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    time.sleep(2.0)  # drawing batches (400 draws of 16 at 10 ms each: about a minute)
    os.kill(children[0], signal.SIGKILL)
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 10, err
    assert re.fullmatch(r"bench: loader sweep failed: process [01] ended without a result "
                        r"\(killed by signal 9\)", err.strip()), err
    assert not Path(f"/proc/{children[1]}").exists(), "the other process was left running"
