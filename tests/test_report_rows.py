"""What makes a row of the report and its figures: which runs are repeats of one row and
which are rows apart, the epochs a figure is taken from, the reference row, time to target
and accuracy parity over repeats."""

from __future__ import annotations

import math

import pytest
from conftest import run_bench
from report_records import record, repeat, timed

from bench.report import summary_table, to_markdown, to_text


def test_one_epoch_has_no_median_and_dp_cpu_asks_are_kept_apart():
    one_epoch = record("e", "ddp", 1, [7.0], [0.3])
    dp1 = {**record("f", "dp", 1, [3.0, 2.0], [0.2, 0.3]), "gpus_requested": 1}
    dp2 = {**record("g", "dp", 1, [3.0, 2.5], [0.2, 0.3]), "gpus_requested": 2}
    table = summary_table([one_epoch, dp1, dp2])
    ddp = table[table["strategy"] == "ddp"].iloc[0]
    assert math.isnan(ddp["epoch_time_s"])  # not the 7 s warm-up
    assert len(table[table["strategy"] == "dp"]) == 2  # not two repeats of one row
    text = to_markdown(table)
    assert "— (1 epoch: warm-up only)" in text and "1 (of 2 asked)" in text
    # the terminal's columns stay aligned around that cell (its ': ' was taken for a status
    # reason, and its column sized to '— (1 epoch')
    lines = to_text(table).splitlines()
    header = next(line for line in lines if line.startswith("strategy"))
    row = next(line for line in lines if "warm-up only" in line)
    at = header.index("img/s")
    assert row[at - 2:at] == "  " and row[at] == "—", "\n".join([header, row])


def test_peak_memory_is_the_timed_epochs_not_the_warm_up_autotuning():
    # The H100's ddp TF32 run: cuDNN autotuning in epoch 1 peaked at 7,916 MiB, training at
    # 2,566 MiB after it; a one-epoch run has only its warm-up to show.
    rec = record("h", "ddp", 1, [4.8, 2.6, 2.6, 2.6], [0.1, 0.2, 0.3, 0.4])
    for epoch, mib in zip(rec["per_epoch"], [7916, 2566, 2565, 2565]):
        epoch["peak_mem_bytes"] = mib * 2**20
    one_epoch = {**record("i", "ddp", 2, [7.0], [0.3]), "world_size": 2}
    one_epoch["per_epoch"][0]["peak_mem_bytes"] = 300 * 2**20
    table = summary_table([rec, one_epoch]).set_index("world_size")
    assert table.loc[1, "peak_mem_mib"] == pytest.approx(2566)
    assert table.loc[2, "peak_mem_mib"] == pytest.approx(300)
    assert "| 2566 |" in to_markdown(table)


def test_runs_on_shared_gpus_stay_apart_and_are_marked_not_comparable():
    own = record("h", "ddp", 2, [5.0, 2.0], [0.1, 0.2])
    base = record("i", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    shared = {**record("j", "ddp", 2, [5.0, 1.0], [0.1, 0.2]), "gpu_shared": True}
    table = summary_table([own, base, shared])
    rows = table[table["world_size"] == 2].set_index("gpu_shared")
    assert len(rows) == 2 and rows.loc[False, "epoch_time_s"] == 2.0
    assert rows.loc[False, "speedup"] == pytest.approx(2.0)
    assert math.isnan(rows.loc[True, "speedup"])  # no speed-up from a shared GPU
    lines = [line for line in to_markdown(table).splitlines() if "not comparable" in line]
    assert len(lines) == 1 and "| 1.00 (ranks shared GPUs: not comparable) |" in lines[0]
    # on a terminal the flag line says it: the cell stays short, the status in 120 columns
    # (the H200's variants block cut its util, img/J and status columns off)
    (line,) = [line for line in to_text(table).splitlines() if "(shared)" in line]
    assert line.split()[:2] == ["ddp", "2"] and line.endswith("ok ⚠ shared GPUs"), line


def test_runs_with_other_speed_options_are_other_rows_not_repeats():
    """Seen on the H100: the fastest path (GPU loader, channels_last, compile, fused SGD)
    was averaged with plain bf16 as "2 runs" of one row. Each way of working is its own row,
    and its speed-up is against N=1 done the same way."""
    plain = record("k", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    fast = {**record("l", "ddp", 1, [5.0, 1.0], [0.1, 0.2]), "loader": "gpu",
            "channels_last": True, "compile": True, "optimizer_impl": "fused"}
    table = summary_table([plain, fast]).set_index("options")
    assert list(table["runs"]) == [1, 1]
    assert table.loc["gpu loader, channels_last, compile, fused SGD", "epoch_time_s"] == 1.0
    assert table.loc["—", "epoch_time_s"] == 4.0
    assert list(table["speedup"]) == [1.0, 1.0]


def test_runs_on_other_gpu_models_are_other_blocks_not_repeats():
    """Seen on the second GPU check: an H200's fsdp epoch (2.43 s) and an H100's (3.23 s)
    were one row of "2 runs" with a median between them, and the H200's rows took the
    H100's ddp as their reference. Each GPU model is a block of its own, with its own
    reference and baseline, and its heading names the GPU."""
    def on(gpu, run_id, strategy, world, times):
        return {**record(run_id, strategy, world, times, [0.1, 0.2]), "device": "cuda",
                "env": {"gpus": [f"NVIDIA {gpu}"] * 2, "driver": "1", "cuda": "13.0"}}

    records = [on("H100 80GB HBM3", "a", "ddp", 1, [5.0, 4.0]),
               on("H100 80GB HBM3", "b", "fsdp", 1, [5.0, 3.0]),
               on("H200", "c", "ddp", 1, [5.0, 2.0]), on("H200", "d", "fsdp", 1, [5.0, 2.5]),
               on("H200", "e", "ddp", 2, [5.0, 1.0])]
    table = summary_table(records)
    assert list(table["runs"]) == [1] * 5
    fsdp = table[table["strategy"] == "fsdp"].set_index("workload")["epoch_time_s"]
    assert dict(fsdp) == {"synthetic 1000 img, batch 100, resnet18 on H100 80GB HBM3": 3.0,
                          "synthetic 1000 img, batch 100, resnet18 on H200": 2.5}
    assert table[table["world_size"] == 2]["speedup"].item() == pytest.approx(2.0)  # H200's
    headings = [line for line in to_text(table).splitlines() if line.startswith("synthetic")]
    assert [h.partition(" — ")[0] for h in headings] == [
        "synthetic 1000 img, batch 100, resnet18 on H100 80GB HBM3",
        "synthetic 1000 img, batch 100, resnet18 on H200"]
    assert not any("cuda" in h for h in headings)  # the GPU's name says it


def test_a_row_of_another_length_is_not_compared_for_accuracy():
    """The H200's fastest path ran 6 epochs beside 4-epoch rows: its top-1 was +0.47 over
    the reference, two more epochs' worth. A row of another length gets no Δ top-1 (and
    says its length); its speed stays comparable; repeats of other lengths are other rows."""
    def run(run_id, epochs, final):
        return {**record(run_id, "ddp", 1, [5.0] + [2.0] * (epochs - 1),
                         [0.1] * (epochs - 1) + [final]), "epochs": epochs}

    table = summary_table([run("a", 4, 0.69), run("b", 6, 0.70), run("c", 4, 0.68),
                           {**run("d", 4, 0.67), "strategy": "fsdp"}])
    assert list(table["runs"]) == [2, 1, 1]
    by_epochs = table[table["strategy"] == "ddp"].set_index("epochs")
    assert math.isnan(by_epochs.loc[6, "delta_top1"]) and by_epochs.loc[6, "epoch_time_s"] == 2.0
    text = to_text(table)
    assert "— (6 epochs)" in text and "ref" in text
    fsdp = table[table["strategy"] == "fsdp"]
    assert fsdp["delta_top1"].item() == pytest.approx(100 * 0.67 - 100 * (0.69 + 0.68) / 2)


def test_a_row_without_a_speed_up_says_why_once():
    """The demo's ddp-spawn N=2 row had '—' for speed-up and efficiency, unexplained (the
    README said 'against the 1-process ddp baseline'): one line under the table says what
    a speed-up is measured against, only where a finished row has none."""
    base = record("m", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    two = {**record("n", "ddp", 2, [5.0, 2.0], [0.1, 0.2]), "world_size": 2}
    spawned = {**record("p", "ddp-spawn", 2, [5.0, 2.0], [0.1, 0.2]), "world_size": 2}
    note = "(speed-up and eff.: against the same strategy, precision and options at N=1"
    assert note not in to_text(summary_table([base, two]))
    text = to_text(summary_table([base, two, spawned]))
    assert text.count(note) == 1, text
    assert max(len(line) for line in text.splitlines()) <= 120, text


def test_runs_with_more_loader_workers_are_other_rows():
    """An input-bound row measured again with 8 workers is not a repeat of the 4-worker one:
    the count is named where it is not bench run's default (4 per GPU, 0 on CPU)."""
    four = {**record("o", "ddp", 1, [5.0, 4.0], [0.1, 0.2]), "device": "cuda",
            "workers_per_replica": 4}
    eight = {**record("p", "ddp", 1, [5.0, 2.0], [0.1, 0.2]), "device": "cuda",
             "workers_per_replica": 8}
    on_cpu = {**record("q", "ddp", 1, [5.0, 3.0], [0.1, 0.2]), "workers_per_replica": 2}
    table = summary_table([four, eight, on_cpu])
    assert sorted(zip(table["device"], table["options"], table["epoch_time_s"])) == [
        ("cpu", "2 workers", 3.0), ("cuda", "8 workers", 2.0), ("cuda", "—", 4.0)]


def test_one_of_a_thing_is_named_in_the_singular():
    """A CPU run with one loader worker was the row '1 workers', a run of 1 epoch beside
    one of 2 '1 epochs' in the verdict and the figures' names."""
    from bench.report.plot_labels import series_label

    one = {**record("s", "ddp", 1, [5.0, 3.0], [0.1, 0.2]), "workers_per_replica": 1}
    assert list(summary_table([one])["options"]) == ["1 worker"]
    short = {**record("t", "ddp", 1, [5.0], [0.1]), "epochs": 1}
    long = {**record("u", "ddp", 1, [5.0, 3.0], [0.1, 0.2]), "epochs": 2}
    table = summary_table([short, long])
    assert sorted(table["apart"]) == ["1 epoch", "2 epochs"], list(table["apart"])
    assert series_label("ddp", "fp32", "—", 1, False, epochs=1) == "ddp fp32 (1 epoch)"


def test_the_reference_row_is_plain_ddp_not_a_compressed_one():
    """Both rows are ddp at N=1 in fp32; the PowerSGD one (sorted first) trained to 30 %,
    plain ddp to 50 %: the deltas are against plain ddp."""
    plain = record("m", "ddp", 1, [5.0, 4.0], [0.4, 0.5])
    powersgd = {**record("n", "ddp", 1, [5.0, 4.0], [0.2, 0.3]),
                "ddp_options": {"comm_hook": "powersgd", "powersgd_rank": 1}}
    table = summary_table([plain, powersgd]).set_index("options")
    assert table.index[0] == "powersgd hook r=1"
    assert bool(table.loc["—", "is_reference"])
    assert table.loc["powersgd hook r=1", "delta_top1"] == pytest.approx(-20.0)


def test_where_every_row_sets_the_learning_rate_the_reference_is_the_rate_most_rows_share():
    """bench parity's folder: every run sets --lr 0.1 (not the default rule's 0.078 at batch
    100) but one, at 0.0125 (the planted cost), sorted first. Both are "ddp N=1 with one
    option"; the reference is the one the other rows build on (dp, ghost BN: lr 0.1)."""
    def at(run_id, strategy, lr, top1, **extra):
        rec = record(run_id, strategy, 1, [5.0, 4.0], [top1 / 2, top1])
        return {**rec, "lr": lr, "base_lr": 0.1, "lr_reference_batch": 128, **extra}

    table = summary_table([
        at("a", "ddp", 0.1, 0.6), at("b", "ddp", 0.0125, 0.1), at("c", "dp", 0.1, 0.6),
        at("d", "ddp", 0.1, 0.2, config={"ghost_bn": 2})]).set_index(["strategy", "options"])
    assert next(o for s, o in table.index if s == "ddp") == "lr 0.0125"
    assert bool(table.loc[("ddp", "lr 0.1"), "is_reference"])
    assert table.loc[("ddp", "lr 0.0125"), "delta_top1"] == pytest.approx(-50.0)
    assert table.loc[("ddp", "lr 0.1, ghost BN 2"), "delta_top1"] == pytest.approx(-40.0)
    assert table.loc[("dp", "lr 0.1"), "delta_top1"] == pytest.approx(0.0)


def test_sweep_key_is_the_workload_only():
    from bench.commands.sweep import sweep_key
    from bench.config.run_config import RunConfig

    base = RunConfig("ddp", gpus=2, cpu=True)
    assert sweep_key(base.derive(workers=3)) != sweep_key(base)  # speed: input-bound rows
    for where in ({"data_dir": "/elsewhere"}, {"download": False},
                  {"comm_probe_steps": 0}, {"profile_steps": 3},
                  {"output": "other"}, {"master_port": 1234}):
        assert sweep_key(base.derive(**where)) == sweep_key(base)
    for what in ({"epochs": 5}, {"seed": 1}, {"width": 0.5}, {"gpus": 4},
                 {"synthetic_difficulty": 0.5}):
        assert sweep_key(base.derive(**what)) != sweep_key(base)


def test_time_to_target_is_scored_like_mlperf():
    # 5 runs: drop the fastest (10) and the slowest (50): mean of 20, 30, 40 = 30.
    five = [timed(f"r{i}", t) for i, t in enumerate([10.0, 20.0, 30.0, 40.0, 50.0])]
    assert summary_table(five)["time_to_target"].iloc[0] == "30.00 (MLPerf, 5 runs)"
    # a run missing the target counts as the slowest and is dropped with the fastest (10):
    # mean of 20, 30, 40 = 30.
    one_miss = [*five[:4], timed("m", None, reached=False)]
    assert summary_table(one_miss)["time_to_target"].iloc[0] == (
        "30.00 (MLPerf, 5 runs, 1 missed)")
    two_miss = [*five[:3], timed("m1", None, False), timed("m2", None, False)]
    assert summary_table(two_miss)["time_to_target"].iloc[0].startswith(
        "did not converge (2/5 missed 60 %)")
    three = [timed(f"t{i}", t) for i, t in enumerate([9.0, 3.0, 6.0])]
    assert summary_table(three)["time_to_target"].iloc[0] == "6.00 (median of 3)"
    # one run is its own time, not 'the median of 1'
    assert summary_table(three[:1])["time_to_target"].iloc[0] == "9.00 (1 run)"


def test_sweep_table_scores_time_to_target_and_tests_accuracy_parity():
    """Five repeats per row, numbers checked by hand (t-table values, df = 8):
    ref ddp N=1 finals 48..52: mean 50, sd 1.581, 95 % CI 2.776 * 1.581 / sqrt(5) = 1.96.
    ddp N=2 finals 46..50: Δ -2, t = -2 / sqrt(2.5/5 + 2.5/5) = -2, p = 0.0805: not flagged.
    dp N=2 finals 44..48: Δ -4, t = -4, p = 0.00395: flagged; one run missed the target.
    ddp-amp N=2 (finals as dp's): two runs missed the target: did not converge."""
    ref = [repeat(f"a{i}", "ddp", 1, 48 + i, 10.0 + i) for i in range(5)]
    same = [repeat(f"b{i}", "ddp", 2, 46 + i, 6.0 + i) for i in range(5)]
    worse = [repeat(f"c{i}", "dp", 2, 44 + i, None if i == 0 else 5.0 + i) for i in range(5)]
    lost = [repeat(f"d{i}", "ddp-amp", 2, 44 + i, None if i < 2 else 5.0) for i in range(5)]
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


def test_a_block_too_wide_leaves_out_its_least_needed_columns_not_the_status():
    """A terminal line cut at its width lost its last columns: the status among them (the
    H200's variants block, at 126 characters). A block too wide leaves out img/J, util,
    the clock and the run count first; never the status, nor a ✗ in *same start*."""
    records = [record("a", "ddp", 1, [5.0, 4.0], [0.1, 0.2]),
               record("b", "ddp", 2, [5.0, 2.0], [0.1, 0.25]),
               {**record("c", "ddp", 2, [5.0, 2.2], [0.1, 0.2]),
                "initial_param_fingerprint": "not the seed's",
                "initial_reference_fingerprint": "the seed's"},
               {**record("d", "fsdp", 2, [5.0, 2.2], [0.1, 0.2]), "status": "failed",
                "error": "boom"}]
    lines = to_text(summary_table(records), width=90).splitlines()
    assert max(map(len, lines)) <= 90, "\n".join(lines)
    head = lines[1].split()
    assert "runs" not in head and head[-2:] == ["start", "status"], lines[1]
    assert [line.split()[-2:] for line in lines[2:4]] == [["—", "ok"], ["✗", "ok"]], lines
    assert lines[4].split()[-1] == "failed", lines


def test_two_image_folders_of_as_many_images_are_two_workloads():
    """An ImageFolder run's workload said 'imagefolder 1000 img': runs on two folders of as
    many images were one row, repeats of each other. The folder's name tells them apart."""
    from report_records import record

    from bench.report.table import summary_table

    flowers = {**record("f", "ddp", 2, [2.0, 1.0], [0.1, 0.5]), "dataset": "imagefolder",
               "data_dir": "/data/flowers"}
    birds = {**flowers, "run_id": "b", "data_dir": "/data/birds"}
    table = summary_table([flowers, birds])
    assert sorted(table["workload"]) == [
        "imagefolder birds 1000 img, batch 100, resnet18 on Test (2 cores)",
        "imagefolder flowers 1000 img, batch 100, resnet18 on Test (2 cores)"]


def test_a_failed_rows_reason_leaves_out_the_cpp_file_gloo_named():
    """A record written before ranks left gloo's C++ file and line out of their error: the
    report cut its status at 110 characters, inside the path, and the reason (the timeout)
    was lost; the record and the CSV keep the whole text."""
    said = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
            "unbound_buffer.cc:129] Timed out waiting 5000ms for send operation to complete "
            "[in train epoch 1 step 3]")
    records = [record("a", "ddp", 1, [5.0, 4.0], [0.1, 0.2]),
               {**record("b", "ddp", 2, [5.0, 2.2], [0.1, 0.2]), "status": "failed",
                "error": said}]
    table = summary_table(records)
    text = to_text(table)
    assert ("failed: RuntimeError: Timed out waiting 5000ms for send operation to complete "
            "[in train epoch 1 step 3]") in " ".join(text.split()), text
    assert "unbound_buffer.cc" not in text
    assert said in set(table["error"])


def test_the_easy_synthetic_set_is_named_d0_beside_the_default_d1():
    """'synthetic 1536 img' was the easy set (difficulty 0) while the default (1) read
    'synthetic d=1 ...': the label hid the difficulty it was meant to show. A record
    without the field leaves it unsaid."""
    from bench.records.describe import workload

    def rec(config: dict) -> dict:
        return {"dataset": "synthetic", "train_size": 1536, "global_batch": 64,
                "config": config, "model": {"name": "resnet18-cifar"}}

    assert workload(rec({"synthetic_difficulty": 0.0}), on=False).startswith(
        "synthetic d=0 1536 img, batch 64")
    assert workload(rec({"synthetic_difficulty": 1.0}), on=False).startswith(
        "synthetic d=1 1536 img")
    assert workload(rec({}), on=False).startswith("synthetic 1536 img")
