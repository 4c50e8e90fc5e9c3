"""bench report against hand-computed values from small hand-written records."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_bench

from bench.report import readme_block, summary_table, to_markdown
from bench.results import load_records


def _record(run_id, strategy, world, times, top1, status="ok", error=None, started="1"):
    epochs = [
        {"epoch": i + 1, "train_time_s": t, "images_per_s": 1000.0 / t, "top1": a, "top5": a,
         "peak_mem_bytes": 2**20 * (i + 1), "train_loss": 1.0, "eval_time_s": 0.1}
        for i, (t, a) in enumerate(zip(times, top1))
    ]
    return {
        "run_id": run_id, "started_at": started, "status": status, "error": error,
        "strategy": strategy, "device": "cpu", "world_size": world, "processes": world,
        "precision": "fp32", "norm": "per-replica-bn", "dataset": "synthetic",
        "train_size": 1000, "global_batch": 100, "model": {"width": 1.0},
        "per_epoch": epochs, "env": {"cpu": "Test CPU", "cpu_count": 2, "torch": "x",
                                     "python": "3"},
    }


@pytest.fixture(autouse=True)
def _close_figures():
    """Tests that draw figures in this process close them (matplotlib warns past 20)."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")


@pytest.fixture
def results(tmp_path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    recs = [
        # warm-up 9 s is excluded: median of (2, 4, 3) = 3 s
        _record("a", "ddp", 1, [9.0, 2.0, 4.0, 3.0], [0.1, 0.2, 0.3, 0.4]),
        # median of (1.0, 2.0) = 1.5 s; img/s median of (1000, 500) = 750
        _record("b", "ddp", 2, [5.0, 1.0, 2.0], [0.1, 0.5, 0.45]),
        _record("c", "horovod", 2, [], [], status="unavailable", error="no horovod"),
        _record("d", "dp", 1, [3.0], [0.2], status="failed", error="rank 0: boom"),
    ]
    for rec in recs:
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    (runs / "broken.json").write_text("{ not json")
    (runs / "foreign.json").write_text(json.dumps({"hello": 1}))
    return tmp_path


def test_numbers_match_hand_computation(results):
    records, warnings = load_records(results)
    assert len(records) == 4 and len(warnings) == 2
    table = summary_table(records).set_index(["strategy", "world_size"])
    one, two = table.loc[("ddp", 1)], table.loc[("ddp", 2)]
    assert one["epoch_time_s"] == pytest.approx(3.0)
    # img/s per epoch 1000/t: epochs 2..4 give 500, 250, 333.3 -> median 333.3
    assert one["images_per_s"] == pytest.approx(1000 / 3)
    assert two["epoch_time_s"] == pytest.approx(1.5)
    assert two["images_per_s"] == pytest.approx(750.0)
    assert two["speedup"] == pytest.approx(750.0 / (1000 / 3))
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert two["final_top1"] == pytest.approx(45.0) and two["best_top1"] == pytest.approx(50.0)
    assert one["peak_mem_mib"] == pytest.approx(4.0)
    hvd = table.loc[("horovod", 2)]
    assert hvd["status"] == "unavailable" and hvd["error"] == "no horovod"
    assert math.isnan(hvd["epoch_time_s"])
    assert table.loc[("dp", 1)]["status"] == "failed"


def test_markdown_keeps_failed_and_unavailable_rows(results):
    records, _ = load_records(results)
    md = to_markdown(summary_table(records))
    assert "unavailable: no horovod" in md and "failed: rank 0: boom" in md
    assert "| ddp |" in md


def test_cli_writes_summary_and_plots_and_skips_bad_files(results):
    proc = run_bench("report", "--results", str(results), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert "broken.json" in proc.stderr and "foreign.json" in proc.stderr
    assert proc.stdout.splitlines()[0].startswith("workload,strategy")
    assert (results / "summary.csv").exists() and (results / "summary.md").exists()
    (folder,) = (results / "plots").iterdir()  # one workload: one folder of its plots
    assert folder.name == "synthetic-1000img-batch100-resnet18"
    for name in ("epoch_time", "scaling", "top1", "time_vs_accuracy"):
        assert (folder / f"{name}.png").stat().st_size > 1000
        assert (folder / f"{name}.svg").exists()
    assert not (folder / "time_to_target.png").exists()  # no run set a target: no empty axis


def test_report_of_a_single_run(tmp_path):
    (tmp_path / "runs").mkdir()
    rec = _record("only", "ddp", 2, [2.0], [0.3])
    (tmp_path / "runs" / "only.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (folder,) = (tmp_path / "plots").iterdir()
    assert (folder / "top1.png").exists()
    assert not (folder / "scaling.png").exists()  # one world size: nothing to scale


def test_readme_table_matches_the_committed_records():
    records, warnings = load_records(ROOT / "results")
    assert records, "results/runs/ must hold the records behind the README table"
    assert not warnings
    readme = (ROOT / "README.md").read_text()
    from bench.probe import load_probes

    assert readme_block(records, load_probes(ROOT / "results")) in readme, (
        "run `bench report --update-readme`")


def test_the_readme_has_a_table_per_workload_with_the_columns_that_differ():
    """What every row of a workload shares goes beside its name (a run that never finished
    has no figures and does not stop that), a column without any figure leaves, and with
    one run a row Δ top-1 has no p-value to show. Two workloads: two tables."""
    from bench.report.views import to_markdown_blocks

    records = [_record("a", "ddp", 1, [5.0, 2.0], [0.1, 0.30]),
               _record("b", "ddp", 2, [5.0, 1.0], [0.1, 0.32]),
               _record("c", "horovod", 2, [], [], status="unavailable", error="no horovod"),
               {**_record("d", "ddp", 1, [5.0, 2.0], [0.1, 0.3]), "train_size": 2000}]
    text = to_markdown_blocks(summary_table(records))
    lines = text.splitlines()
    headings = [line for line in lines if line.startswith("**")]
    assert headings == ["**synthetic 1000 img, batch 100, resnet18** — cpu, fp32, "
                        "per-replica-bn, runs 1, scaling eff. 100 %",
                        "**synthetic 2000 img, batch 100, resnet18** — cpu, N = 1, procs 1, "
                        "fp32, per-replica-bn, runs 1"], text
    first = lines[lines.index(headings[0]) + 2]
    assert first == ("| strategy | N | procs | epoch time (s) | img/s | speed-up vs N=1 | "
                     "final top-1 (%) | Δ top-1 vs ref | status |"), text
    assert "| horovod | 2 | 2 | — | — | — | — | — | unavailable: no horovod |" in lines
    assert "| ddp | 2 | 2 | 1.00 | 1000 | 2.00× | 32.00 | +2.00 | ok |" in lines


def test_one_epoch_has_no_median_and_dp_cpu_asks_are_kept_apart():
    one_epoch = _record("e", "ddp", 1, [7.0], [0.3])
    dp1 = {**_record("f", "dp", 1, [3.0, 2.0], [0.2, 0.3]), "gpus_requested": 1}
    dp2 = {**_record("g", "dp", 1, [3.0, 2.5], [0.2, 0.3]), "gpus_requested": 2}
    table = summary_table([one_epoch, dp1, dp2])
    ddp = table[table["strategy"] == "ddp"].iloc[0]
    assert math.isnan(ddp["epoch_time_s"])  # not the 7 s warm-up
    assert len(table[table["strategy"] == "dp"]) == 2  # not two repeats of one row
    text = to_markdown(table)
    assert "— (1 epoch: warm-up only)" in text and "1 (of 2 asked)" in text


def test_peak_memory_is_the_timed_epochs_not_the_warm_up_autotuning():
    # The H100's ddp TF32 run: cuDNN autotuning in epoch 1 peaked at 7,916 MiB, training at
    # 2,566 MiB after it; a one-epoch run has only its warm-up to show.
    rec = _record("h", "ddp", 1, [4.8, 2.6, 2.6, 2.6], [0.1, 0.2, 0.3, 0.4])
    for epoch, mib in zip(rec["per_epoch"], [7916, 2566, 2565, 2565]):
        epoch["peak_mem_bytes"] = mib * 2**20
    one_epoch = {**_record("i", "ddp", 2, [7.0], [0.3]), "world_size": 2}
    one_epoch["per_epoch"][0]["peak_mem_bytes"] = 300 * 2**20
    table = summary_table([rec, one_epoch]).set_index("world_size")
    assert table.loc[1, "peak_mem_mib"] == pytest.approx(2566)
    assert table.loc[2, "peak_mem_mib"] == pytest.approx(300)
    assert "| 2566 |" in to_markdown(table)


def test_runs_on_shared_gpus_stay_apart_and_are_marked_not_comparable():
    own = _record("h", "ddp", 2, [5.0, 2.0], [0.1, 0.2])
    base = _record("i", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    shared = {**_record("j", "ddp", 2, [5.0, 1.0], [0.1, 0.2]), "gpu_shared": True}
    table = summary_table([own, base, shared])
    rows = table[table["world_size"] == 2].set_index("gpu_shared")
    assert len(rows) == 2 and rows.loc[False, "epoch_time_s"] == 2.0
    assert rows.loc[False, "speedup"] == pytest.approx(2.0)
    assert math.isnan(rows.loc[True, "speedup"])  # no speed-up from a shared GPU
    lines = [line for line in to_markdown(table).splitlines() if "not comparable" in line]
    assert len(lines) == 1 and "| 1.00 (ranks shared GPUs: not comparable) |" in lines[0]


def test_runs_with_other_speed_options_are_other_rows_not_repeats():
    """Seen on the H100: the fastest path (GPU loader, channels_last, compile, fused SGD)
    was averaged with plain bf16 as "2 runs" of one row. Each way of working is its own row,
    and its speed-up is against N=1 done the same way."""
    plain = _record("k", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    fast = {**_record("l", "ddp", 1, [5.0, 1.0], [0.1, 0.2]), "loader": "gpu",
            "channels_last": True, "compile": True, "optimizer_impl": "fused"}
    table = summary_table([plain, fast]).set_index("options")
    assert list(table["runs"]) == [1, 1]
    assert table.loc["gpu loader, channels_last, compile, fused SGD", "epoch_time_s"] == 1.0
    assert table.loc["—", "epoch_time_s"] == 4.0
    assert list(table["speedup"]) == [1.0, 1.0]


def test_runs_with_more_loader_workers_are_other_rows():
    """An input-bound row measured again with 8 workers is not a repeat of the 4-worker one:
    the count is named where it is not bench run's default (4 per GPU, 0 on CPU)."""
    four = {**_record("o", "ddp", 1, [5.0, 4.0], [0.1, 0.2]), "device": "cuda",
            "workers_per_replica": 4}
    eight = {**_record("p", "ddp", 1, [5.0, 2.0], [0.1, 0.2]), "device": "cuda",
             "workers_per_replica": 8}
    on_cpu = {**_record("q", "ddp", 1, [5.0, 3.0], [0.1, 0.2]), "workers_per_replica": 2}
    table = summary_table([four, eight, on_cpu])
    assert sorted(zip(table["device"], table["options"], table["epoch_time_s"])) == [
        ("cpu", "2 workers", 3.0), ("cuda", "8 workers", 2.0), ("cuda", "—", 4.0)]


def test_the_reference_row_is_plain_ddp_not_a_compressed_one():
    """Both rows are ddp at N=1 in fp32; the PowerSGD one (sorted first) trained to 30 %,
    plain ddp to 50 %: the deltas are against plain ddp."""
    plain = _record("m", "ddp", 1, [5.0, 4.0], [0.4, 0.5])
    powersgd = {**_record("n", "ddp", 1, [5.0, 4.0], [0.2, 0.3]),
                "ddp_options": {"comm_hook": "powersgd", "powersgd_rank": 1}}
    table = summary_table([plain, powersgd]).set_index("options")
    assert table.index[0] == "powersgd hook r=1"
    assert bool(table.loc["—", "is_reference"])
    assert table.loc["powersgd hook r=1", "delta_top1"] == pytest.approx(-20.0)


def test_sweep_key_is_the_workload_only():
    from bench.config import RunConfig
    from bench.sweep import sweep_key

    base = RunConfig("ddp", gpus=2, cpu=True)
    assert sweep_key(base.derive(workers=3)) != sweep_key(base)  # speed: input-bound rows
    for where in ({"data_dir": "/elsewhere"}, {"download": False},
                  {"comm_probe_steps": 0}, {"profile_steps": 3},
                  {"output": "other"}, {"master_port": 1234}):
        assert sweep_key(base.derive(**where)) == sweep_key(base)
    for what in ({"epochs": 5}, {"seed": 1}, {"width": 0.5}, {"gpus": 4},
                 {"synthetic_difficulty": 0.5}):
        assert sweep_key(base.derive(**what)) != sweep_key(base)


def test_report_refuses_a_missing_folder_and_writes_nothing_for_an_empty_one(tmp_path):
    missing = tmp_path / "nope" / "results"
    proc = run_bench("report", "--results", str(missing))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is not a folder" in proc.stderr and not (tmp_path / "nope").exists()
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    proc = run_bench("report", "--results", str(empty))
    assert proc.returncode == 1 and "no run records" in proc.stderr, proc.stderr
    assert sorted(p.name for p in empty.rglob("*")) == ["runs"]  # nothing written


def _timed(run_id, seconds, reached=True, strategy="ddp"):
    rec = _record(run_id, strategy, 2, [5.0, 1.0], [0.5, 0.7])
    rec.update(target_top1=60.0, reached_target=reached,
               time_to_target_s=seconds if reached else None)
    return rec


def test_time_to_target_is_scored_like_mlperf():
    # 5 runs: drop the fastest (10) and the slowest (50): mean of 20, 30, 40 = 30.
    five = [_timed(f"r{i}", t) for i, t in enumerate([10.0, 20.0, 30.0, 40.0, 50.0])]
    assert summary_table(five)["time_to_target"].iloc[0] == "30.00 (MLPerf, 5 runs)"
    # a run missing the target counts as the slowest and is dropped with the fastest (10):
    # mean of 20, 30, 40 = 30.
    one_miss = [*five[:4], _timed("m", None, reached=False)]
    assert summary_table(one_miss)["time_to_target"].iloc[0] == (
        "30.00 (MLPerf, 5 runs, 1 missed)")
    two_miss = [*five[:3], _timed("m1", None, False), _timed("m2", None, False)]
    assert summary_table(two_miss)["time_to_target"].iloc[0].startswith(
        "did not converge (2/5 missed 60 %)")
    three = [_timed(f"t{i}", t) for i, t in enumerate([9.0, 3.0, 6.0])]
    assert summary_table(three)["time_to_target"].iloc[0] == "6.00 (median of 3)"


def _repeat(run_id, strategy, world, final, ttt):
    rec = _record(run_id, strategy, world, [2.0, 1.0], [0.1, final / 100])
    return {**rec, "target_top1": 45.0, "reached_target": ttt is not None,
            "time_to_target_s": ttt}


def test_sweep_table_scores_time_to_target_and_tests_accuracy_parity():
    """Five repeats per row, numbers checked by hand (t-table values, df = 8):
    ref ddp N=1 finals 48..52: mean 50, sd 1.581, 95 % CI 2.776 * 1.581 / sqrt(5) = 1.96.
    ddp N=2 finals 46..50: Δ -2, t = -2 / sqrt(2.5/5 + 2.5/5) = -2, p = 0.0805: not flagged.
    dp N=2 finals 44..48: Δ -4, t = -4, p = 0.00395: flagged; one run missed the target.
    ddp-amp N=2 (finals as dp's): two runs missed the target: did not converge."""
    ref = [_repeat(f"a{i}", "ddp", 1, 48 + i, 10.0 + i) for i in range(5)]
    same = [_repeat(f"b{i}", "ddp", 2, 46 + i, 6.0 + i) for i in range(5)]
    worse = [_repeat(f"c{i}", "dp", 2, 44 + i, None if i == 0 else 5.0 + i) for i in range(5)]
    lost = [_repeat(f"d{i}", "ddp-amp", 2, 44 + i, None if i < 2 else 5.0) for i in range(5)]
    table = summary_table(ref + same + worse + lost).set_index(["strategy", "world_size"])
    assert table.loc[("ddp", 1), "final_top1"] == pytest.approx(50.0)
    assert table.loc[("ddp", 1), "final_top1_ci"] == pytest.approx(1.963, abs=1e-3)
    assert table.loc[("ddp", 2), "delta_top1"] == pytest.approx(-2.0)
    assert table.loc[("ddp", 2), "p_value"] == pytest.approx(0.0805, abs=1e-4)
    assert table.loc[("dp", 2), "p_value"] == pytest.approx(0.00395, abs=1e-5)
    assert dict(table["differs"]) == {("ddp", 1): False, ("ddp", 2): False, ("dp", 2): True,
                                      ("ddp-amp", 2): True}
    # times to target: ref 10..14 -> mean of 11, 12, 13; dp: the miss and 7 dropped -> 8..9
    assert table.loc[("ddp", 1), "time_to_target"] == "12.00 (MLPerf, 5 runs)"
    assert table.loc[("dp", 2), "time_to_target"] == "8.00 (MLPerf, 5 runs, 1 missed)"
    assert table.loc[("ddp-amp", 2), "time_to_target"].startswith("did not converge (2/5")
    text = to_markdown(summary_table(ref + same + worse + lost))
    assert "| 50.00 ± 1.96 |" in text and "| ref |" in text
    assert "| -2.00 (p 0.081) |" in text and "| -4.00 (p 0.0039) ≠ |" in text
    proc = run_bench("report", "--results", "/nonexistent", "--reference", "ddp:x")
    assert proc.returncode == 2 and "--reference" in proc.stderr


def test_malformed_records_and_a_fifo_are_skipped_with_a_warning(tmp_path):
    """Each of these made `bench report` traceback (or hang, the FIFO): now each is skipped
    with a line naming the file and what is wrong, and the good record is reported."""
    import os

    runs = tmp_path / "runs"
    runs.mkdir()
    good = _record("good", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    (runs / "good.json").write_text(json.dumps(good))
    bad = {
        "bare": {"run_id": "x", "status": "ok"},
        "started": {**good, "run_id": "s", "started_at": 5},
        "epochs": {**good, "run_id": "e", "per_epoch": "abc"},
        "epoch-field": {**good, "run_id": "f", "per_epoch": [{"top1": "high"}]},
    }
    for name, rec in bad.items():
        (runs / f"{name}.json").write_text(json.dumps(rec))
    (runs / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(runs / "x.json")
    proc = run_bench("report", "--results", str(tmp_path), "--no-write", timeout=60)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(warned) == 6, proc.stderr
    assert all("Traceback" not in line for line in proc.stderr.splitlines())
    assert "not a regular file" in proc.stderr and "nested too deeply" in proc.stderr
    assert "started_at is int" in proc.stderr


def test_terminal_view_fits_120_columns_one_block_per_workload():
    """The committed results (3 workloads, 24 rows): every line of the default view fits in
    120 characters, each workload is a block of its own, the accum-4 run is told apart from
    the plain N=2 run, and a row that is not ok gives its reason on a line of its own."""
    proc = run_bench("report", "--results", str(ROOT / "results"), "--no-write")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    records, _ = load_records(ROOT / "results")
    workloads = {r["config"].get("synthetic_difficulty") for r in records}
    headings = [line for line in lines if line.startswith("synthetic")]
    assert len(headings) == len(workloads) == 3
    assert any("accum 4" in line for line in lines)
    assert any(line.startswith("    unavailable: apex AMP needs CUDA") for line in lines)
    wide = run_bench("report", "--results", str(ROOT / "results"), "--no-write",
                     "--format", "wide")
    assert "ideal all-reduce / step (ms)" in wide.stdout.splitlines()[0]


def test_json_is_strict_csv_says_yes_and_failed_runs_are_counted(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    ok = _record("a", "ddp", 1, [5.0], [0.1])  # one epoch: no median (NaN in the table)
    failed = _record("b", "ddp", 1, [], [], status="failed", error="boom")
    for rec in (ok, failed):
        (runs / f"{rec['run_id']}.json").write_text(json.dumps({
            **rec, "initial_param_fingerprint": None}))
    as_json = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "json")
    rows = json.loads(as_json.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert rows[0]["epoch_time_s"] is None and rows[0]["failed_runs"] == 1
    text = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert "1 (+1 not ok)" in text.stdout or "runs 1 (+1 not ok)" in text.stdout, text.stdout
    csv = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    assert "✓" not in csv.stdout and "✗" not in csv.stdout


def test_plots_never_mix_workloads(tmp_path):
    """Two workloads: a folder of plots each, each figure drawn from its own runs only (the
    committed plots once drew one scaling line from one workload's N=1 to another's N=2)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    small = [_record("a", "ddp", 1, [5.0, 4.0], [0.1, 0.2]),
             _record("b", "ddp", 2, [5.0, 2.0], [0.1, 0.2])]
    other = {**_record("c", "ddp", 2, [50.0, 40.0], [0.3, 0.4]), "global_batch": 512}
    for rec in (*small, other):
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    folders = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert folders == ["synthetic-1000img-batch100-resnet18", "synthetic-1000img-batch512-resnet18"]
    one = tmp_path / "plots" / folders[0]
    two = tmp_path / "plots" / folders[1]
    assert (one / "scaling.png").exists()  # N=1 and N=2 of the same workload
    assert not (two / "scaling.png").exists()  # one N only: no scaling to draw
    from bench.report import figures_per_workload

    figures = figures_per_workload([*small, other])
    lines = figures["synthetic 1000 img, batch 512, resnet18"]["top1"].axes[0].lines
    assert [line.get_label() for line in lines] == ["ddp N=2 fp32"]


def test_impossible_figures_are_named_not_passed_silently(tmp_path):
    """An N=2 run 12x faster than N=1 (603 % efficiency: a loaded machine slowed N=1), and a
    run with more CPU processes than cores: the report warns about both, by row."""
    runs = tmp_path / "runs"
    runs.mkdir()
    slow_base = _record("a", "ddp", 1, [50.0, 48.0], [0.1, 0.2])
    fast_two = {**_record("b", "ddp", 2, [5.0, 4.0], [0.1, 0.2]),
                "oversubscribed": {"processes": 2, "cores": 1}}
    for rec in (slow_base, fast_two):
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert proc.returncode == 0, proc.stderr
    assert "ddp N=2 (synthetic 1000 img, batch 100, resnet18): scaling efficiency 600 %" in (
        proc.stderr)
    assert "ran 2 CPU processes on 1 core:" in proc.stderr
    # ...and flags the row (terminal and CSV) and draws it as such.
    row = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["ddp", "2"])
    assert row.endswith("ok ⚠ efficiency > 100 %, CPU oversubscribed"), row
    csv = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    assert ",efficiency > 100 %, CPU oversubscribed," in csv.stdout.replace('"', "")
    from bench.report import figures_per_workload

    figures = next(iter(figures_per_workload([slow_base, fast_two]).values()))
    hatched = [bar.get_hatch() for bar in figures["epoch_time"].axes[0].patches]
    assert hatched == [None, "//"]  # N=1 plain, N=2 flagged
    for name in ("scaling", "scaling_efficiency"):
        axes = figures[name].axes[0]
        rings = [c for c in axes.collections if c.get_label().startswith("⚠ flagged")]
        assert len(rings) == 1 and list(rings[0].get_offsets()[:, 0]) == [2]
        assert [t.get_text() for t in axes.get_legend().get_texts()].count(
            "⚠ flagged: suspect (see `bench report`)") == 1


def test_negative_exposed_communication_is_named_not_shown_as_a_figure(tmp_path):
    """Seen in a test run beside another worker's ranks: a Horovod run whose compute-only
    probe steps were 1.62x slower than its real steps recorded -62 % exposed communication.
    -5 % is noise the row keeps; -62 % is flagged with its cause."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for run_id, strategy, exposed in (("a", "ddp", -0.05), ("b", "horovod", -0.6248)):
        rec = {**_record(run_id, strategy, 2, [5.0, 4.0], [0.1, 0.2]),
               "exposed_comm_fraction": exposed}
        (runs / f"{run_id}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert proc.returncode == 0, proc.stderr
    assert ("horovod N=2 (synthetic 1000 img, batch 100, resnet18): exposed communication "
            "-62 %: its compute-only steps ran slower") in " ".join(proc.stderr.split())
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()
            if line.split()[:1] in (["ddp"], ["horovod"])}
    assert rows["horovod"].endswith("ok ⚠ exposed comm < 0"), rows
    assert rows["ddp"].endswith("ok"), rows


def _terminal_report(results, recs):
    """``bench report``'s terminal view of these records (written under RESULTS/runs): the
    process and its lines, checked to exit 0 and fit 120 columns."""
    runs = results / "runs"
    runs.mkdir()
    for rec in recs:
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(results), "--no-write")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, proc.stdout
    return proc, lines


def test_a_row_at_its_input_pipelines_pace_is_flagged_and_long_flags_wrap(tmp_path):
    """img/s of the timed epochs: 1000 / 2 s = 500. A pipeline that feeds 550 img/s alone
    (training at 91 % of it) makes the row input-bound; one that feeds 1000 (50 %) does not.
    The N=2 row is also 4x faster than N=1 (efficiency 200 %) with -60 % exposed
    communication: its flags no longer fit beside it in 120 columns and go below it."""
    recs = [{**_record("a", "ddp", 1, [9.0, 2.0, 2.0], [0.1, 0.2, 0.3]),
             "loader_alone_images_per_s": 1000.0},
            {**_record("b", "ddp", 2, [9.0, 0.5, 0.5], [0.1, 0.2, 0.3]),
             "loader_alone_images_per_s": 2100.0, "exposed_comm_fraction": -0.6},
            {**_record("c", "fsdp", 1, [9.0, 2.0, 2.0], [0.1, 0.2, 0.3]),
             "loader_alone_images_per_s": 550.0}]
    proc, lines = _terminal_report(tmp_path, recs)
    rows = {(line.split()[0], line.split()[1]): i for i, line in enumerate(lines)
            if line.split()[:1] in (["ddp"], ["fsdp"])}
    assert lines[rows[("fsdp", "1")]].endswith("ok ⚠ input-bound"), proc.stdout
    assert lines[rows[("ddp", "1")]].endswith("ok"), proc.stdout
    two = rows[("ddp", "2")]
    assert lines[two].endswith("ok ⚠"), proc.stdout
    assert lines[two + 1].strip() == "⚠ efficiency > 100 %, exposed comm < 0, input-bound"
    said = " ".join(proc.stderr.split())
    assert ("fsdp N=1 (synthetic 1000 img, batch 100, resnet18): trained at 500 img/s, 91 % "
            "of the 550 img/s its input pipeline feeds with no model") in said
    assert "its compute-only steps waited for the input pipeline" in said
    # the command it names is wrapped whole, so that it can be copied
    assert any("`bench loader --workers 2,4,8`" in line for line in proc.stderr.splitlines())
    wide = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    by_strategy = {(r["strategy"], r["world_size"]): r
                   for r in csv.DictReader(wide.stdout.splitlines())}
    assert float(by_strategy[("fsdp", "1")]["loader_alone"]) == 550.0


def test_a_failed_rows_long_reason_is_wrapped_below_it_not_cut(tmp_path):
    """A rank's error can run to 200 characters. Every table shows its first 110 (the
    record has all of it); the terminal view used to cut that line at 120 columns."""
    error = ("rank 1: RuntimeError: NCCL error in ProcessGroupNCCL.cpp: unhandled system "
             "error, NCCL version 2.27.7; ncclSystemError: System call (e.g. socket, malloc) "
             "or external library call failed or device error; the last words of it")
    recs = [_record("a", "ddp", 1, [9.0, 2.0], [0.1, 0.2]),
            _record("b", "ddp", 2, [], [], status="failed", error=error)]
    proc, lines = _terminal_report(tmp_path, recs)
    start = next(i for i, line in enumerate(lines) if line.startswith("    failed: rank 1"))
    assert lines[start + 1].startswith("      "), proc.stdout
    assert " ".join(" ".join(lines[start:start + 2]).split()) == f"failed: {error[:107]}..."


def test_a_repeat_much_slower_than_its_row_is_named(tmp_path):
    """Three repeats of one row, one 2.5x slower (a loaded machine): the row is flagged and
    the run named; two repeats cannot say which one is slow, so nothing is flagged."""
    runs = tmp_path / "runs"
    runs.mkdir()
    recs = [_record(f"r{i}", "ddp", 1, [5.0, t, t], [0.1, 0.2, 0.3], started=str(i))
            for i, t in enumerate([4.0, 4.2, 10.0])]
    for rec in recs:
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())  # warnings are wrapped at 120 columns
    assert "run r2 took 2.4× the row's median epoch time (10.00 s vs 4.20 s" in said
    assert max(len(line) for line in proc.stderr.splitlines()) <= 120, proc.stderr
    assert "ok ⚠ 1 slow run" in proc.stdout
    (runs / "r0.json").unlink()
    proc = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert "slow" not in proc.stderr + proc.stdout


@pytest.mark.skipif((__import__("os").cpu_count() or 1) > 3,
                    reason="oversubscribing cheaply needs a machine with at most 3 cores")
def test_more_cpu_processes_than_cores_is_said_and_recorded(tmp_path):
    import os

    n = (os.cpu_count() or 1) + 1
    proc = run_bench("run", "--strategy", "ddp", "--cpu", "--gpus", str(n), "--epochs", "1",
                     "--data", "synthetic", "--train-limit", str(32 * n), "--test-limit", "8",
                     "--width", "0.125", "--batch-size", str(8 * n), "--no-progress",
                     "--comm-probe-steps", "0", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"{n} CPU processes on {n - 1} cores compete" in proc.stderr
    (rec,) = load_records(tmp_path)[0]
    assert rec["oversubscribed"] == {"processes": n, "cores": n - 1}


_NO_TORCH = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
from bench.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_the_report_reads_records_tables_and_plots_without_torch(tmp_path):
    """Importing torch cost the report ~550 MB and 1 s (3,000 records: 720 MB, 2.5 s for the
    table); records that carry their reference start need none."""
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from report_cost import make_records

    make_records(tmp_path, 40)
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, "report", "--results",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fsdp        8" in proc.stdout
    assert len(list((tmp_path / "plots").rglob("*.png"))) >= 5


def test_make_table_replaces_its_own_rows_and_keeps_the_gpu_and_parity_rows(tmp_path):
    """`make table` once began with `rm -rf results/runs`: measuring the CPU table again
    deleted the committed GPU rows and `make parity`'s. Its runs now replace only the
    records of the workload and device they measured."""
    results, new = tmp_path / "results", tmp_path / "results" / ".table-new"
    table_old = _record("old-table", "ddp", 2, [3.0, 2.0], [0.1, 0.5])
    gpu = {**_record("gpu-row", "ddp", 1, [3.0, 2.0], [0.1, 0.5]), "device": "cuda"}
    parity = {**_record("parity-row", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "train_size": 12288}
    for rec, folder in ((table_old, results), (gpu, results), (parity, results),
                        (_record("new-table", "ddp", 2, [3.0, 1.0], [0.1, 0.6]), new)):
        (folder / "runs").mkdir(parents=True, exist_ok=True)
        (folder / "runs" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    (new / "probes").mkdir()
    (new / "probes" / "p.json").write_text("{}")
    (results / "runs" / "notes.json").write_text("{ not a record")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "replace_rows.py"), str(new),
                           str(results)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1 record(s) in, 1 of the same rows' earlier runs out" in proc.stdout
    assert sorted(p.name for p in (results / "runs").iterdir()) == [
        "gpu-row.json", "new-table.json", "notes.json", "parity-row.json"]
    assert (results / "probes" / "p.json").exists() and not new.exists()
    # nothing measured (a table whose every run failed to start): nothing is removed
    (new / "runs").mkdir(parents=True)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "replace_rows.py"), str(new),
                           str(results)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "holds no run records" in proc.stderr
    assert len(list((results / "runs").iterdir())) == 4


def _probe(probe_id, device, busbw):
    return {"kind": "allreduce-probe", "probe_id": probe_id, "device": device,
            "backend": "gloo" if device == "cpu" else "nccl", "world_size": 2, "nodes": 1,
            "model": "resnet18-cifar", "gradient_bytes": 44880528,
            "results": [{"bytes": 2**k, "busbw_GBps": busbw, "time_s": 0.01}
                        for k in (10, 20, 26)]}


def test_a_workloads_bandwidth_figure_shows_the_newest_probe_of_its_own_devices():
    """The committed README's GPU workload once drew the CPU gloo probes, and `make table`
    run again drew two lines both labelled `cpu gloo N=2`. A workload's figure now shows, for
    the devices it ran on, the newest probe of each kind: the one its table's ceiling uses."""
    from bench.report import figures_per_workload

    cpu = _record("a", "ddp", 2, [3.0, 2.0], [0.1, 0.5])
    gpu = {**_record("g", "ddp", 1, [3.0, 2.0], [0.1, 0.5]), "device": "cuda",
           "train_size": 50000}
    probes = [_probe("old", "cpu", 1.0), _probe("new", "cpu", 2.0)]
    figures = figures_per_workload([cpu, gpu], probes)
    by_device = {("cuda" if "50000" in name else "cpu"): figs for name, figs in figures.items()}
    assert "busbw" not in by_device["cuda"]
    (line,) = [line for line in by_device["cpu"]["busbw"].axes[0].lines
               if not line.get_label().startswith("_")]  # the dotted gradient size aside
    assert line.get_label() == "cpu gloo N=2" and set(line.get_ydata()) == {2.0}
    assert "one resnet18-cifar gradient" in by_device["cpu"]["busbw"].axes[0].get_xlabel()


def test_rows_that_differ_in_accumulation_are_named_apart_in_where_time_goes():
    """The committed CPU table's ddp N=2 rows with and without --grad-accum 4 were two bars
    both named `ddp / N=2 / cpu fp32`."""
    from bench.report import figures_per_workload

    plain = {**_record("p", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "compute_step_s": 0.1}
    accum = {**plain, "run_id": "q", "grad_accum": 4}
    figure = figures_per_workload([plain, accum])["synthetic 1000 img, batch 100, resnet18"]
    ticks = [t.get_text() for t in figure["where_time_goes"].axes[0].get_xticklabels()]
    assert ticks == ["ddp\nN=2\ncpu fp32", "ddp\nN=2\ncpu fp32\naccum 4"], ticks
