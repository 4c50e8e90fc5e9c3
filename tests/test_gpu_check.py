"""scripts/gpu_check.sh's choices that a GPU lease depends on, checked with its CPU mode:
a mistake there costs minutes of a 15-minute lease."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from conftest import ROOT, records

CHECK = ROOT / "scripts" / "gpu_check.sh"


def _check(out, *args, workers: str):
    env = {**os.environ, "TABLE_WORKERS": workers, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(CHECK), "--cpu", *args, str(out)], capture_output=True,
                          text=True, timeout=400, env=env, cwd=ROOT)


def test_table_workers_auto_takes_the_fewest_that_feed_near_the_best(tmp_path):
    """TABLE_WORKERS=auto: the table's rows run at the worker count the loader sweep found
    fastest (the fewest within 10 % of the best), read from the sweep's JSON, so that one
    lease can measure the pipeline and then the table at a count that feeds it."""
    proc = _check(tmp_path, "--phase", "table", "--items", "^table_(loader_sweep|ddp)$",
                  workers="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    points = json.loads((tmp_path / "table_loader_sweep.json").read_text())["points"]
    assert [p["workers_per_replica"] for p in points] == [0, 2]
    said = re.search(r"table workers: (\d+) per replica \(TABLE_WORKERS=auto", proc.stdout)
    assert said, proc.stdout
    chosen = int(said.group(1))
    rate = {p["workers_per_replica"]: p["images_per_s"] for p in points}
    best = max(rate.values())
    assert rate[chosen] >= 0.9 * best
    assert all(rate[w] < 0.9 * best for w in rate if w < chosen)
    (rec,) = records(tmp_path / "table")
    assert rec["strategy"] == "ddp" and rec["workers_per_replica"] == chosen


def test_table_workers_must_be_a_count_or_auto(tmp_path):
    proc = _check(tmp_path, "--phase", "table", workers="eight")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("gpu_check.sh: TABLE_WORKERS is a worker count or auto "
                                   "(got eight)")
    assert not (tmp_path / "state").exists()


def test_an_item_the_cpu_refuses_by_design_is_skipped_with_its_reason(tmp_path):
    """`--cpu` over every phase failed at table_ddp-amp_fp16: fp16 needs CUDA, so the CPU
    refuses it (exit 2) by design. It is skipped there, with the reason, not failed."""
    proc = _check(tmp_path, "--phase", "table", "--items", "^table_ddp-amp_fp16$", workers="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^skip  table_ddp-amp_fp16: --precision fp16 needs CUDA", proc.stdout,
                     re.M), proc.stdout
    assert "0 passed, 0 failed, 1 skipped" in proc.stdout, proc.stdout
