"""bench compare: matched rows, ratios, and the exit code that gates a CI job."""

from __future__ import annotations

import json

from conftest import run_bench
from test_report import _repeat


def _write(folder, records):
    (folder / "runs").mkdir(parents=True)
    for rec in records:
        (folder / "runs" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    return folder


def _slower(rec, factor):
    epochs = [{**e, "train_time_s": e["train_time_s"] * factor,
               "images_per_s": e["images_per_s"] / factor} for e in rec["per_epoch"]]
    return {**rec, "per_epoch": epochs, "time_to_target_s": rec["time_to_target_s"] * factor}


def test_compare_exits_1_on_a_planted_slowdown_and_0_on_identical_folders(tmp_path):
    base = [_repeat(f"a{i}", "ddp", 2, 50 + i % 2, 10.0 + i) for i in range(5)]
    base += [_repeat(f"b{i}", "dp", 1, 50 + i % 2, 12.0 + i) for i in range(5)]
    a = _write(tmp_path / "a", base)
    same = run_bench("compare", str(a), str(a))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "2 matched row(s), 0 regressed" in same.stderr
    # ddp 10 % slower (img/s ratio 1/1.1 = 0.909, time to target x1.1); dp untouched
    b = _write(tmp_path / "b", [_slower(r, 1.1) if r["strategy"] == "ddp" else r for r in base])
    slow = run_bench("compare", str(a), str(b), "--format", "json")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    rows = {r["strategy"]: r for r in json.loads(slow.stdout)}
    assert abs(rows["ddp"]["speed_ratio"] - 1 / 1.1) < 1e-3
    assert abs(rows["ddp"]["time_to_target_ratio"] - 1.1) < 1e-3
    assert rows["ddp"]["verdict"].startswith("REGRESSED: img/s -9.1 %")
    assert rows["dp"]["verdict"] == "ok" and rows["dp"]["speed_ratio"] == 1.0
    # a 15 % threshold lets a 10 % slow-down pass; a single record file is accepted too
    assert run_bench("compare", str(a), str(b), "--threshold", "15").returncode == 0
    one = a / "runs" / "a0.json"
    assert run_bench("compare", str(one), str(one), "--format", "csv").returncode == 0


def test_compare_refuses_what_is_not_results(tmp_path):
    proc = run_bench("compare", str(tmp_path / "nope"), str(tmp_path))
    assert proc.returncode == 2 and "neither a results folder nor a record file" in proc.stderr


def test_one_run_a_side_or_overlapping_runs_are_not_a_regression(tmp_path):
    """Two single runs of the same code minutes apart once read `REGRESSED: img/s -16.1 %`
    and exit 1. A slow-down counts only beyond the run-to-run range of repeats."""
    one_a = _write(tmp_path / "one_a", [_repeat("x", "ddp", 2, 50, 10.0)])
    one_b = _write(tmp_path / "one_b", [_slower(_repeat("y", "ddp", 2, 50, 10.0), 1.19)])
    proc = run_bench("compare", str(one_a), str(one_b), "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["verdict"].startswith("not gated: img/s -16.0 %, one run a side")
    # repeats whose ranges overlap: within noise, whatever the medians say
    spread_a = [_slower(_repeat(f"a{i}", "ddp", 2, 50, 10.0), f) for i, f in
                enumerate((1.0, 1.1, 1.2))]
    spread_b = [_slower(_repeat(f"b{i}", "ddp", 2, 50, 10.0), f) for i, f in
                enumerate((1.15, 1.2, 1.25))]
    proc = run_bench("compare", str(_write(tmp_path / "sa", spread_a)),
                     str(_write(tmp_path / "sb", spread_b)), "--format", "json")
    assert proc.returncode == 0, proc.stdout
    assert "within the runs' range: noise" in json.loads(proc.stdout)[0]["verdict"]
    markdown = run_bench("compare", str(one_a), str(one_b)).stdout
    assert "| img/s A [range] |" in markdown.splitlines()[0]
