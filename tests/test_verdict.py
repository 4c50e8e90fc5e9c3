"""The verdict under each workload's table: the fastest row at each N with its margin and
whether the repeats put that margin beyond noise; which rows' top-1 differs from the
reference, which do not, and which one run cannot judge. Every expected figure here is
worked out by hand from the records below."""

from __future__ import annotations

import json

from conftest import run_bench
from report_records import record, repeat, write_runs

from bench.report.readme import readme_block
from bench.report.table import summary_table
from bench.report.views import to_markdown, to_text


def run(run_id, strategy, world, seconds, final, precision="fp32"):
    """A run whose timed epoch took SECONDS (1,000 / SECONDS img/s), ending at FINAL %."""
    rec = record(run_id, strategy, world, [9.0, seconds], [0.1, final / 100])
    rec["precision"] = precision
    return rec


def three_runs_each():
    # ddp-amp: 2,000 img/s (0.50 s, ± 1 %), ddp and ddp-spawn ~1,000 img/s with spreads that
    # overlap: the first pair differs far beyond its noise, the second is a tie
    runs = [run(f"ref{i}", "ddp", 1, 2.0, f) for i, f in enumerate((70.0, 70.2, 69.8))]
    runs += [run(f"amp{i}", "ddp-amp", 2, s, f, "bf16")
             for i, (s, f) in enumerate(zip((0.495, 0.50, 0.505), (65.0, 65.2, 64.8)))]
    runs += [run(f"ddp{i}", "ddp", 2, s, f)
             for i, (s, f) in enumerate(zip((0.98, 1.00, 1.02), (70.1, 69.9, 70.0)))]
    runs += [run(f"spawn{i}", "ddp-spawn", 2, s, 70.0)
             for i, s in enumerate((0.99, 1.01, 1.03))]
    runs += [run("fsdp0", "fsdp", 2, 1.0, 70.0)]
    return runs


def test_the_fastest_row_is_named_with_its_margin_and_the_noise_it_beats():
    table = summary_table(three_runs_each())
    text = to_text(table)
    flat = " ".join(text.split())
    # 2,000 img/s against ddp's median 1,000 (ddp-spawn: 1,000/1.01 = 990): 2.00x, with
    # spreads of 1-2 % a side Welch's p is far below 0.05
    assert "N=2: ddp-amp bf16 is fastest, 2.00× ddp fp32 (next), beyond noise (3 and 3 runs" \
        in flat, text
    # ddp, ddp-spawn (overlapping repeats) and fsdp (one run, 1 % from ddp, inside the 4 %
    # spread of ddp-spawn's repeats) are within noise of each other
    assert "ddp fp32, fsdp fp32 and ddp-spawn fp32 are within noise of each other" in flat
    rows = {(r["strategy"], r["world_size"]): r for r in table.to_dict("records")}
    assert rows[("ddp-amp", 2)]["speed_rank"] == 1
    assert rows[("ddp-amp", 2)]["speed_call"] == "fastest"
    assert rows[("ddp", 2)]["speed_call"] == "slower"
    assert abs(rows[("ddp", 2)]["speed_vs_fastest"] - 0.5) < 1e-9
    # fsdp: one run, judged against the widest spread of a repeated row on this device
    # (ddp-spawn: 1/0.99 over 1/1.03 = 1.040): 2.0x is beyond it
    assert rows[("fsdp", 2)]["speed_call"] == "slower"
    assert rows[("ddp-spawn", 2)]["speed_call"] == "slower"  # 2.02x, Welch p << 0.05
    # N=1 has one row: nothing to compare
    assert not isinstance(rows[("ddp", 1)]["speed_call"], str) and "N=1:" not in flat


def test_a_margin_over_a_flagged_runner_up_says_the_runner_up_is_flagged():
    """The margin rests on both rows: where the next fastest was measured beside other work
    on its cores (`shared cores`: 0.9 of 2 cores taken in its timed epoch, none idle), the
    call says so beside it, as it says it of a flagged fastest row; not otherwise."""
    runs = three_runs_each()
    plain = " ".join(to_text(summary_table(runs)).split())
    assert "2.00× ddp fp32 (next), beyond noise" in plain, plain
    for rec in runs:
        if rec["run_id"].startswith("ddp") and rec["world_size"] == 2:
            rec["cpu_load_sampled"] = {"cores": 2}
            for epoch in rec["per_epoch"]:
                epoch["cpu_load"] = {"run": 1.1, "others": 0.9, "steal": 0.0}
    table = summary_table(runs)
    flat = " ".join(to_text(table).split())
    rows = {(r["strategy"], r["world_size"]): r for r in table.to_dict("records")}
    assert rows[("ddp", 2)]["flags"] == "shared cores", rows[("ddp", 2)]["flags"]
    assert ("N=2: ddp-amp bf16 is fastest, 2.00× ddp fp32 (next, flagged: see the warnings), "
            "beyond noise") in flat, flat


def test_top1_is_judged_only_where_the_repeats_allow():
    table = summary_table(three_runs_each())
    flat = " ".join(to_text(table).split())
    # ddp-amp: 65.0 against 70.0 with SD 0.2 each side: differs, Welch p << 0.05
    assert "Top-1 differs from ddp fp32 N=1 beyond chance: ddp-amp bf16 N=2 -5.00 points" in flat
    # ddp N=2: 70.0 against 70.0: no difference shown, and the CI it could not rule out
    assert "No difference in top-1 from ddp fp32 N=1 is shown for ddp fp32 N=2 (+0.00" in flat
    assert "so a difference smaller than that is not ruled out" in flat
    assert "cannot be judged with one run: fsdp fp32 N=2." in flat
    calls = {(r["strategy"], r["world_size"]): r["accuracy_call"]
             for r in table.to_dict("records")}
    assert calls == {("ddp", 1): "reference", ("ddp", 2): "not shown to differ",
                     ("ddp-amp", 2): "differs", ("ddp-spawn", 2): "not shown to differ",
                     ("fsdp", 2): "one run"}


def test_an_accuracy_blocks_crowded_times_are_not_the_noise_of_a_speed_block():
    """The N = 1…8 block's repeats ran 8 ranks on 2 cores beside other work: its N=1 runs
    took 115 to 622 s. Their spread is not how far a run of the CPU speed block moves: that
    block, one run a row, is still judged against the measured bound (35 %)."""
    from bench.report.verdict import ONE_RUN_NOISE_SOURCE

    speed = [run("a", "ddp", 2, 2.0, 70.0), run("b", "ddp-amp", 2, 1.0, 70.0, "bf16")]
    crowded = [run(f"c{i}", "ddp", n, t, 92.0 + i / 10) for i, (n, t)
               in enumerate(((1, 1.15), (1, 6.22), (1, 2.60), (8, 1.2), (8, 1.3), (8, 1.4)))]
    for rec in crowded:
        rec["train_size"] = 8192  # another workload
        if rec["world_size"] > 2:
            rec["oversubscribed"] = {"processes": 8, "cores": 2}
    flat = " ".join(to_text(summary_table(speed + crowded)).split())
    assert f"N=2: ddp-amp bf16 is fastest, 2.00× ddp fp32 (next), beyond noise (1 run each; " \
           f"{ONE_RUN_NOISE_SOURCE})" in flat, flat
    # whose runs the bound comes from: not the user's ('where measured (parity rows)' read
    # as rows of their own folder, which has none)
    assert "in bench's committed repeats, not measured here" in flat, flat


def test_a_large_loss_the_test_cannot_settle_is_said_apart_from_no_difference():
    """The N = 1…8 block's PowerSGD r=1 row: 79.1, 63.7 and 78.8 % against 91.8 to 92.4 %.
    Every run far below, yet Welch's p is 0.068 (3 runs, one 15 points from the others).
    It is not "no difference shown": its mean lies outside the reference's CI; the verdict
    says the test could not settle it, and a row inside that CI stays "not shown"."""
    runs = [run(f"ref{i}", "ddp", 1, 2.0, f) for i, f in enumerate((91.81, 92.38, 92.43))]
    runs += [run(f"psgd{i}", "ddp", 8, 2.0, f) for i, f in enumerate((79.10, 63.74, 78.75))]
    runs += [run(f"fsdp{i}", "fsdp", 8, 2.0, f) for i, f in enumerate((92.2, 92.5, 92.6))]
    for rec in runs[3:6]:
        rec["ddp_options"] = {"comm_hook": "powersgd", "powersgd_rank": 1}
    table = summary_table(runs)
    flat = " ".join(to_text(table).split())
    assert "Not settled: ddp powersgd hook r=1 N=8 (-18.34, p 0.068, 95 % CI ±21.78): its " \
           "mean lies outside ddp N=1's 95 % CI, but its runs spread too widely" in flat, flat
    assert "is shown for fsdp N=8 (+0.23, p 0.4); its 95 % CI is ±0.52 points" in flat, flat
    calls = {(r["strategy"], r["world_size"]): r["accuracy_call"]
             for r in table.to_dict("records")}
    assert calls == {("ddp", 1): "reference", ("ddp", 8): "not settled",
                     ("fsdp", 8): "not shown to differ"}


def test_equal_confidence_intervals_are_said_once():
    """Two rows whose 95 % CIs round alike (70.0 and 70.2 %, two runs each: the same SD, so
    ±1.27 points each) read "each ±1.27", not "±1.27 to ±1.27"; unequal ones keep their
    range (the third row: 70.0 and 70.4 %, ±2.54)."""
    runs = [run(f"ref{i}", "ddp", 1, 2.0, f) for i, f in enumerate((70.0, 70.2))]
    runs += [run(f"two{i}", "ddp", 2, 1.0, f) for i, f in enumerate((70.0, 70.2))]
    runs += [run(f"zero{i}", "ddp-zero", 2, 1.0, f) for i, f in enumerate((70.0, 70.2))]
    flat = " ".join(to_text(summary_table(runs)).split())
    assert "their 95 % CIs are each ±1.27 points, so a difference smaller" in flat, flat
    runs += [run(f"fsdp{i}", "fsdp", 2, 1.0, f) for i, f in enumerate((70.0, 70.4))]
    flat = " ".join(to_text(summary_table(runs)).split())
    assert "their 95 % CIs are ±1.27 to ±2.54 points" in flat, flat


def test_a_block_without_its_reference_row_says_top1_is_not_compared_and_how_to_compare():
    """The committed network block (N=2 only: no ddp N=1 row) was silent on top-1, beside a
    PowerSGD row at 11.72 % among rows at 98-99.6 %: the verdict says nothing is compared and
    which --reference would; with it, the rows are compared with ddp N=2."""
    runs = [run(f"ddp{i}", "ddp", 2, 1.0, f) for i, f in enumerate((70.0, 70.2, 69.8))]
    runs += [run(f"fsdp{i}", "fsdp", 2, 1.0, f) for i, f in enumerate((60.0, 60.2, 59.8))]
    flat = " ".join(to_text(summary_table(runs)).split())
    assert ("Top-1 is not compared: no finished ddp N=1 row here to compare with (`bench "
            "report --reference ddp:2` compares with that row instead).") in flat, flat
    flat = " ".join(to_text(summary_table(runs, reference="ddp:2")).split())
    assert "Top-1 differs from ddp beyond chance: fsdp -10.00 points" in flat, flat
    assert "not compared" not in flat, flat
    # the reference asked for failed: not compared either, and fsdp is named where no ddp
    # row finished
    failed = [run("ref", "ddp", 1, 1.0, 70.0) | {"status": "failed", "error": "boom"},
              run("f1", "fsdp", 1, 1.0, 70.0), run("z2", "ddp-zero", 2, 1.0, 70.0)]
    flat = " ".join(to_text(summary_table(failed)).split())
    assert ("no finished ddp N=1 row here to compare with (`bench report --reference fsdp:1`"
            in flat), flat


def test_a_block_with_no_two_rows_at_one_n_says_why_speed_is_not_ranked():
    """`bench run` of dp and of ddp-zero at --gpus 2 on CPU (dp: one replica, N=1) gave a
    report whose verdict said only that top-1 was not compared: nothing about speed, the
    question's first half. Each N holds one row: no race, and the verdict says so; one
    configuration at N=1 and N=2 is scaling, which its speed-up column measures."""
    two = [run("a", "dp", 1, 1.0, 50.0), run("b", "ddp-zero", 2, 0.5, 50.0)]
    flat = " ".join(to_text(summary_table(two)).split())
    assert ("→ Speed is not ranked: no N here has two finished configurations to race (dp at "
            "N=1 and ddp-zero at N=2); `bench sweep` runs several at one N.") in flat, flat
    scaling = [run("a", "ddp", 1, 1.0, 50.0), run("b", "ddp", 2, 0.8, 50.0)]
    flat = " ".join(to_text(summary_table(scaling)).split())
    assert ("→ One configuration, ddp, at N=1 and N=2: no other to race at the same N; its "
            "speed-up and scaling efficiency say what more ranks gain.") in flat, flat
    assert "1.25×" in flat  # (the speed-up it points to: 1,250 against 1,000 img/s)
    no_base = [run("a", "ddp", 2, 1.0, 50.0), run("b", "ddp", 4, 0.8, 50.0)]
    flat = " ".join(to_text(summary_table(no_base)).split())
    assert ("One configuration, ddp, at N=2 and N=4: no other to race at the same N; no N=1 "
            "run here to scale it against.") in flat, flat
    # a race at one N is the verdict's own; a lone row elsewhere adds nothing
    raced = [*two, run("c", "ddp", 2, 1.0, 50.0)]
    flat = " ".join(to_text(summary_table(raced)).split())
    assert "N=2: ddp-zero is fastest, 2.00× ddp (next)" in flat and "not ranked" not in flat


def test_one_run_each_is_judged_against_what_one_run_moves_by_or_not_at_all():
    """CPU: no repeated row in the folder, so the bound measured on CPU (the committed
    parity rows: 35 %) decides; 2x is beyond it, 1.2x within. A GPU has no such figure:
    not judged."""
    table = summary_table([run("a", "ddp", 2, 1.0, 50.0), run("b", "ddp-spawn", 2, 0.5, 50.0),
                           run("c", "ddp", 4, 1.0, 50.0), run("d", "ddp-spawn", 4, 1 / 1.2, 50.0)])
    flat = " ".join(to_text(table).split())
    assert ("N=2: ddp-spawn is fastest, 2.00× ddp (next), beyond noise (1 run each; CPU runs "
            "moved by up to 35% on their own") in flat, flat
    assert "N=4: ddp-spawn is fastest, 1.20× ddp (next), within noise (1 run each" in flat
    gpu = [{**r, "device": "cuda", "env": {**r["env"], "gpus": ["NVIDIA H100"]}}
           for r in (run("a", "ddp", 2, 1.0, 50.0), run("b", "ddp-spawn", 2, 0.5, 50.0))]
    flat = " ".join(to_text(summary_table(gpu)).split())
    assert ("N=2: ddp-spawn is fastest, 2.00× ddp (next); not judged against noise: 1 run "
            "each, and no repeated row on this device") in flat, flat
    assert "beyond noise" not in flat and "within noise" not in flat


def test_the_verdict_is_in_every_format(tmp_path):
    table = summary_table(three_runs_each())
    assert "**Verdict**" in to_markdown(table) and "ddp-amp bf16 is fastest" in to_markdown(table)
    block = readme_block(three_runs_each(), [])
    assert "**Verdict:** N=2: ddp-amp bf16 is fastest" in block, block
    results = write_runs(tmp_path / "results", three_runs_each())
    proc = run_bench("report", "--results", str(results), "--format", "json", "--no-write")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    fastest = [r for r in rows if r["speed_call"] == "fastest"]
    assert [(r["strategy"], r["world_size"]) for r in fastest] == [("ddp-amp", 2)]
    assert any("beyond noise" in s for s in fastest[0]["verdict"])


def test_rows_at_their_largest_batch_are_a_block_of_their_own_with_the_batch_and_no_top1():
    """`bench sweep --batch-size max` rows (each at the batch `bench fit` found): one block
    named by the memory they fit, a batch column that differs row to row, and top-1 left
    uncompared; runs at a batch given stay in their own block, without the column."""
    fits = "2 GiB (CPU, all processes)"
    found = []
    for run_id, strategy, world, batch, seconds in (("d1", "ddp", 1, 100, 2.0),
                                                     ("d2", "ddp", 2, 200, 1.0),
                                                     ("z2", "ddp-zero", 2, 300, 0.8)):
        rec = run(run_id, strategy, world, seconds, 60.0 + world)
        rec.update(global_batch=batch, config={"batch_fits_in": fits})
        found.append(rec)
    given = [run(f"g{i}", "ddp", 1, 2.0, f) for i, f in enumerate((70.0, 70.4))]
    text = to_text(summary_table(found + given), width=120)
    blocks = text.split("\n\n")
    fit_block = next(b for b in blocks if "largest" in b.splitlines()[0])
    given_block = next(b for b in blocks if "batch 100" in b.splitlines()[0])
    assert fit_block.startswith("synthetic 1000 img, batch: largest that fits 2 GiB (CPU, "
                                "all processes), resnet18 on Test (2 cores) — "), text
    header = fit_block.splitlines()[1].split()
    assert "batch" in header and "ref" not in fit_block, text
    at = header.index("batch")
    assert all(line.split()[-2] == "—" for line in fit_block.splitlines()[2:5]), text  # Δ
    batches = {line.split()[0] + line.split()[at]: line for line in fit_block.splitlines()[2:5]}
    assert set(batches) == {"ddp100", "ddp200", "ddp-zero300"}, text
    assert "top-1 is not comparable across batch sizes" in " ".join(fit_block.split()), text
    assert given_block.startswith(
        "synthetic 1000 img, batch 100, resnet18 on Test (2 cores) — "), text
    assert "batch" not in given_block.splitlines()[1].split(), text
    assert "ref" in given_block and "not comparable" not in given_block, text


def test_a_block_whose_ranks_oversubscribe_the_cores_shows_top1_only():
    """The N = 1…8 accuracy block trains 8 ranks on 2 cores: its times measure the
    crowding. Such a block has no time column and no speed call, says why in its heading,
    and keeps top-1 and Δ top-1 with their p-values, in the terminal and the README views."""
    from report_records import record

    from bench.report import summary_table
    from bench.report.readme_view import to_markdown_blocks
    from bench.report.views import ACCURACY_ONLY, to_text

    def run(run_id, n, seconds, top1):
        rec = record(run_id, "ddp", n, [seconds, seconds], [top1 - 0.1, top1])
        if n > 2:
            rec["oversubscribed"] = {"processes": n, "cores": 2}
        return rec

    rows = [run(f"{n}-{i}", n, 10.0 * n, 0.90 + i / 1000) for n in (1, 8) for i in range(3)]
    table = summary_table(rows)
    text = to_text(table)
    heading = " ".join(text.split("\nstrategy")[0].split())
    assert heading.endswith(ACCURACY_ONLY), text
    header = next(line for line in text.splitlines() if line.startswith("strategy")).split()
    assert "img/s" not in header and "epoch" not in header and "top-1" in header, text
    assert "fastest" not in text and "(p 1)" in text, text
    # its rows' warnings are about times ('CPU oversubscribed'): not beside a top-1
    assert table["flags"].str.contains("CPU oversubscribed").any() and "⚠" not in text, text
    markdown = to_markdown_blocks(table)
    assert ACCURACY_ONLY in markdown and "img/s" not in markdown, markdown
    assert "final top-1 (%)" in markdown and "fastest" not in markdown, markdown
    assert "⚠" not in markdown, markdown


def test_rows_that_read_alike_are_told_apart_in_the_table_and_the_verdict():
    """Two ddp N=2 runs of 2 and 3 epochs with no N=1 row read as two 'ddp fp32 —' rows and
    'ddp is fastest, 1.05× ddp (next) ... ddp and ddp cannot be told apart'. So did ddp with
    SyncBN beside ddp with per-replica BN on a GPU (no option names the default). What sets
    such rows apart gets a column, and the verdict names it."""
    two = run("two", "ddp", 2, 1.0, 70.0)
    three = {**run("three", "ddp", 2, 0.8, 70.0), "epochs": 3}
    two["epochs"] = 2
    text = to_text(summary_table([two, three]))
    lines = text.splitlines()
    header = lines[1].split()
    assert "epochs" in header and "BN" not in header, text
    at = header.index("epochs")
    assert sorted(line.split()[at] for line in lines[2:4]) == ["2", "3"], text
    flat = " ".join(text.split())
    # 1,000 / 0.8 = 1,250 img/s against 1,000: 1.25x
    assert "N=2: ddp 3 epochs is fastest, 1.25× ddp 2 epochs (next)" in flat, text
    assert "ddp and ddp" not in flat, text
    readme = readme_block([two, three], [])  # the README's and the page's view
    assert "| epochs |" in readme and "ddp 3 epochs is fastest" in readme, readme
    # the same epochs, another BatchNorm, no option to say it
    sync = {**run("sync", "ddp", 2, 0.8, 70.0), "norm": "syncbn"}
    text = to_text(summary_table([run("per", "ddp", 2, 1.0, 70.0), sync]))
    header = text.splitlines()[1].split()
    assert "BN" in header and "epochs" not in header, text
    flat = " ".join(text.split())
    assert "ddp syncbn is fastest, 1.25× ddp per-replica-bn (next)" in flat, text
    # rows an option tells apart keep the block as it was: no column for what all share
    ghost = {**run("ghost", "ddp", 2, 0.8, 70.0), "config": {"ghost_bn": 8}}
    header = to_text(summary_table([run("per", "ddp", 2, 1.0, 70.0), ghost])).splitlines()[1]
    assert "epochs" not in header.split() and "BN" not in header.split(), header


def test_rows_that_never_reached_the_target_are_named_beside_the_speed_call():
    """The testbed block's PowerSGD row (rank 1) ended at 11.72 % where every other row
    reached 99 %, and the verdict called it the 'next' fastest and said nothing else: top-1
    was not compared there (no N=1 row). A row with no time to target is now named, with
    what its runs missed, whatever its speed."""
    runs = [repeat(f"ddp{i}", "ddp", 2, 60.0, 10.0 + i) for i in range(3)]
    # 2 of 3 runs missed the 45 % target: no MLPerf time (at most one may miss)
    runs += [repeat(f"amp{i}", "ddp-amp", 2, f, t)
             for i, (f, t) in enumerate([(40.0, None), (44.0, None), (50.0, 9.0)])]
    # 1 of 3 missed: the median of (8, 9, inf) is 9 s, so it converged and is not named
    runs += [repeat(f"zero{i}", "ddp-zero", 2, f, t)
             for i, (f, t) in enumerate([(40.0, None), (50.0, 8.0), (50.0, 9.0)])]
    runs += [repeat("sgd0", "ddp", 2, 11.72, None)]  # one run, missed
    runs[-1]["ddp_options"] = {"comm_hook": "powersgd", "powersgd_rank": 1}
    flat = " ".join(to_text(summary_table(runs)).split())
    said = flat[flat.find("Did not reach"):].split("). ")[0]
    assert "Did not reach the 45 % target (no time to target, whatever the speed): " in flat, flat
    # ddp-amp's mean final top-1: (40 + 44 + 50) / 3 = 44.67
    assert "ddp-amp (2 of 3 runs missed it; mean 44.67%)" in flat, said
    assert "ddp powersgd hook r=1 (its one run ended at 11.72%)" in flat, said
    assert "ddp-zero" not in said and "ddp (" not in said, said
