"""The report's plots: one folder of figures per workload, each drawn from its own runs and
probes only, its bars and lines named apart."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import run_bench
from report_records import probe, record, write_runs

# a CPU workload names its machine (the test records' CPU)
CPU_BLOCK = "synthetic 1000 img, batch {}, resnet18 on Test (2 cores)"


def test_plots_never_mix_workloads(tmp_path):
    """Two workloads: a folder of plots each, each figure drawn from its own runs only (the
    committed plots once drew one scaling line from one workload's N=1 to another's N=2)."""
    small = [record("a", "ddp", 1, [5.0, 4.0], [0.1, 0.2]),
             record("b", "ddp", 2, [5.0, 2.0], [0.1, 0.2])]
    other = {**record("c", "ddp", 2, [50.0, 40.0], [0.3, 0.4]), "global_batch": 512}
    write_runs(tmp_path, [*small, other])
    proc = run_bench("report", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    folders = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert folders == ["synthetic-1000img-batch100-resnet18-on-Test-2-cores",
                       "synthetic-1000img-batch512-resnet18-on-Test-2-cores"]
    one = tmp_path / "plots" / folders[0]
    two = tmp_path / "plots" / folders[1]
    assert (one / "scaling.png").exists()  # N=1 and N=2 of the same workload
    assert not (two / "scaling.png").exists()  # one N only: no scaling to draw
    from bench.report import figures_per_workload

    figures = figures_per_workload([*small, other])
    lines = figures[CPU_BLOCK.format(512)]["top1"].axes[0].lines
    assert [line.get_label() for line in lines] == ["ddp N=2 fp32"]


def test_a_workloads_bandwidth_figure_shows_the_newest_probe_of_its_own_devices():
    """The committed README's GPU workload once drew the CPU gloo probes, and `make table`
    run again drew two lines both labelled `cpu gloo N=2`. A workload's figure now shows, for
    the devices it ran on, the newest probe of each kind: the one its table's ceiling uses."""
    from bench.report import figures_per_workload

    cpu = record("a", "ddp", 2, [3.0, 2.0], [0.1, 0.5])
    gpu = {**record("g", "ddp", 1, [3.0, 2.0], [0.1, 0.5]), "device": "cuda",
           "train_size": 50000}
    probes = [probe("old", "cpu", 1.0), probe("new", "cpu", 2.0)]
    figures = figures_per_workload([cpu, gpu], probes)
    by_device = {("cuda" if "50000" in name else "cpu"): figs for name, figs in figures.items()}
    assert "busbw" not in by_device["cuda"]
    (line,) = [line for line in by_device["cpu"]["busbw"].axes[0].lines
               if line.get_linestyle() != ":"]  # the dotted gradient size aside
    assert line.get_label() == "cpu gloo N=2" and set(line.get_ydata()) == {2.0}
    # records without a parameter count: the probe's model's gradient, named as such
    (dotted,) = [line for line in by_device["cpu"]["busbw"].axes[0].lines
                 if line.get_linestyle() == ":"]
    assert dotted.get_label() == "one resnet18-cifar gradient", dotted.get_label()
    assert set(dotted.get_xdata()) == {44880528}


def test_the_all_reduce_figure_marks_what_the_workloads_own_steps_send():
    """The committed ResNet-18 x0.125 workloads' figures marked a 42.8 MiB gradient, the
    full model's that the probe measured for, where their runs send 712 KiB (and 356 KiB
    under the fp16 hook, 23 KiB under PowerSGD): the mark says where on the curve this
    workload's all-reduce sits, so it is each size its rows send."""
    from bench.report import figures_per_workload

    small = {"width": 0.125, "parameters": 182_000}
    plain = {**record("a", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "model": small}
    hooked = {**record("b", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "model": small,
              "ddp_options": {"comm_hook": "fp16"}}
    figures = figures_per_workload([plain, hooked], [probe("p", "cpu", 2.0)])
    (figure,) = (figs["busbw"] for figs in figures.values())
    dotted = [line for line in figure.axes[0].lines if line.get_linestyle() == ":"]
    assert sorted(x for line in dotted for x in set(line.get_xdata())) == [
        2 * 182_000, 4 * 182_000]  # 44,880,528 (the probe's model) is not drawn
    labels = [line.get_label() for line in dotted if not line.get_label().startswith("_")]
    assert labels == ["this workload's gradient, as sent: 355 KiB, 711 KiB"], labels
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == [
        "cpu gloo N=2", labels[0]]


def test_rows_that_differ_in_accumulation_are_named_apart_in_where_time_goes():
    """The committed CPU table's ddp N=2 rows with and without --grad-accum 4 were two bars
    both named `ddp / N=2 / cpu fp32`."""
    from bench.report import figures_per_workload

    plain = {**record("p", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "compute_step_s": 0.1}
    accum = {**plain, "run_id": "q", "grad_accum": 4}
    figure = figures_per_workload([plain, accum])[CPU_BLOCK.format(100)]
    ticks = [t.get_text() for t in figure["where_time_goes"].axes[0].get_xticklabels()]
    assert ticks == ["ddp\nN=2\ncpu fp32", "ddp\nN=2\ncpu fp32\naccum 4"], ticks


def test_rows_that_read_alike_are_named_apart_in_every_figure():
    """The committed testbed block's time-to-target bars named four rows `ddp / N=2 / cpu
    fp32` (its 1 MB buckets, fp16 hook, PowerSGD hook and plain rows): the bars named no
    option. Rows alike but for their epochs (or their BatchNorm, where no option says it)
    were named alike in every figure. Each is named apart now, and the bars of eight rows no
    longer run into each other (the figure widens)."""
    from bench.report import figures_per_workload

    def target(rec, seconds):
        return {**rec, "target_top1": 40.0, "reached_target": True,
                "time_to_target_s": seconds, "compute_step_s": 0.1}

    plain = target(record("p", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), 10.0)
    hook = {**plain, "run_id": "h", "ddp_options": {"comm_hook": "fp16"}}
    longer = target({**record("l", "ddp", 2, [3.0, 2.0, 2.0], [0.1, 0.5, 0.6]), "epochs": 3},
                    12.0)
    plain["epochs"] = hook["epochs"] = 2
    figure = figures_per_workload([plain, hook, longer])[CPU_BLOCK.format(100)]
    for name in ("time_to_target", "where_time_goes", "epoch_time"):
        ticks = [t.get_text() for t in figure[name].axes[0].get_xticklabels()]
        assert len(set(ticks)) == 3, (name, ticks)
    ticks = [t.get_text() for t in figure["time_to_target"].axes[0].get_xticklabels()]
    assert sorted(ticks) == ["ddp\nN=2\ncpu fp32\n2 epochs", "ddp\nN=2\ncpu fp32\n3 epochs",
                             "ddp\nN=2\ncpu fp32\nfp16 hook"], ticks
    # (plain and hook trained alike: one line names both)
    curves = [line.get_label() for line in figure["top1"].axes[0].lines]
    assert sorted(curves) == ["ddp N=2 fp32 3 epochs",
                              "ddp N=2 fp32 fp16 hook\n= ddp N=2 fp32 2 epochs"], curves
    # eight bars: an inch each and room for the axis (7 inches before, whatever the count)
    eight = [{**plain, "run_id": f"r{i}", "grad_accum": i + 1} for i in range(8)]
    wide = figures_per_workload(eight)[CPU_BLOCK.format(100)]["where_time_goes"]
    assert wide.get_size_inches()[0] >= 8 * 1.0 + 1.0, wide.get_size_inches()


def test_bars_with_many_options_keep_their_names_apart():
    """Ten bars whose options are long ('static graph,no buffer broadcast', 'bucket
    view,powersgd hook r=1'): in every bar figure each bar's name, as drawn, ends before
    the next one's begins (the where-time-goes figure ran them into each other)."""
    from bench.report import figures_per_workload

    options = [{"static_graph": True, "broadcast_buffers": False},
               {"gradient_as_bucket_view": True, "comm_hook": "powersgd"},
               {"find_unused_parameters": True, "comm_hook": "fp16"}]
    rows = [{**record(f"r{i}", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "compute_step_s": 0.1,
             "target_top1": 40.0, "reached_target": True, "time_to_target_s": 10.0,
             "ddp_options": {**options[i % 3], "bucket_cap_mb": 5.0 + i},
             "memory_parts": {"peak": 2**26, "parameters": 2**20, "gradients": 2**20,
                              "optimizer_state": 2**20}}
            for i in range(10)]
    figure = figures_per_workload(rows)[CPU_BLOCK.format(100)]
    for name in ("where_time_goes", "time_to_target", "memory"):
        fig = figure[name]
        renderer = fig.canvas.get_renderer()
        boxes = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels()]
        assert len(boxes) == 10, name
        for left, right in zip(boxes, boxes[1:]):
            assert left.x1 < right.x0, (name, left, right)


def test_plots_do_not_mislead_where_a_probe_ran_slow_curves_coincide_or_one_run_has_no_ci():
    """The demo drew ddp-spawn's bar at its compute-only probe (3.4 s) where its real step
    was 2.4 s; top1.png had four legend entries and two visible lines (identical curves
    over each other); time_vs_accuracy.png spanned 99.41-99.61 % (one test image looked
    like a chasm) and said '± 95 % CI' with one run a row."""
    from bench.report import figures_per_workload

    def run(run_id, strategy, top1, step_s, compute_s):
        rec = record(run_id, strategy, 2, [3.0, 2.0], [0.1, top1])
        rec["per_epoch"] = [{**e, "step_time_p50_s": step_s} for e in rec["per_epoch"]]
        return {**rec, "compute_step_s": compute_s}

    records = [run("a", "ddp", 0.9941, 0.080, 0.050), run("b", "ddp-spawn", 0.9961, 0.080, 0.100),
               run("c", "ddp-launch", 0.9961, 0.080, 0.050),
               run("d", "ddp-zero", 0.9951, 0.080, 0.086)]  # -7.5 %: within noise
    figures = figures_per_workload(records)[CPU_BLOCK.format(100)]
    ax = figures["where_time_goes"].axes[0]
    # stacked bars: compute then exposed communication; ddp-spawn's is its measured 80 ms
    compute, exposed = ax.containers[0], ax.containers[1]
    heights = [c.get_height() + e.get_height() for c, e in zip(compute, exposed)]
    assert [round(h, 6) for h in heights] == [80.0, 80.0, 80.0, 80.0], heights
    marks = [line for line in ax.lines if "slower than the step" in line.get_label()]
    assert len(marks) == 1 and list(marks[0].get_ydata()) == [100.0]
    # the report flags exposed communication below -10 % only: ddp-zero's -7.5 % reads as
    # none there, and here a compute bar of its step (it was grey and marked suspect)
    assert [bar.get_facecolor() == compute[0].get_facecolor() for bar in compute] == [
        True, False, True, True]
    # ddp-spawn and ddp-launch trained to the same top-1 at every epoch: one line, both named
    lines = figures["top1"].axes[0].lines
    assert [line.get_label() for line in lines] == [
        "ddp N=2 fp32", "ddp-spawn N=2 fp32\n= ddp-launch N=2 fp32", "ddp-zero N=2 fp32"]
    ax = figures["time_vs_accuracy"].axes[0]
    low, high = ax.get_ylim()
    assert high - low >= 5.0 and low <= 99.41 and high >= 99.61
    assert "CI" not in ax.get_ylabel().replace("no CI", "")


def test_rows_that_differ_in_speed_options_are_lines_and_points_of_their_own():
    """The H200's workload drew plain bf16 and the fastest path (gpu loader, channels_last,
    compile, fused SGD) at N=1 as one scaling line, and named three time-vs-accuracy points
    alike, `ddp-amp N=1 cuda bf16`."""
    from bench.report import figures_per_workload

    def run(run_id, world, epoch_s, **options):
        return {**record(run_id, "ddp", world, [3.0, epoch_s], [0.1, 0.5]), **options}

    records = [run("a", 1, 2.0), run("b", 2, 1.0), run("c", 1, 0.5, loader="gpu"),
               run("d", 1, 0.4, loader="gpu", compile=True)]
    figures = figures_per_workload(records)[CPU_BLOCK.format(100)]
    lines = {line.get_label(): list(line.get_xdata())
             for line in figures["scaling"].axes[0].lines if line.get_label()[0] != "_"}
    assert lines == {"ddp fp32": [1, 2], "ddp fp32 (gpu-data)": [1],
                     "ddp fp32 (gpu-data,compile)": [1]}, lines
    labels = figures["time_vs_accuracy"].axes[0].get_legend_handles_labels()[1]
    assert sorted(labels) == ["ddp N=1 fp32", "ddp N=1 fp32 gpu-data",
                              "ddp N=1 fp32 gpu-data,compile", "ddp N=2 fp32"], labels


def test_a_run_of_other_epochs_is_neither_the_base_nor_a_point_of_the_others_line():
    """A sweep of 2 epochs (ddp N=1 at 1,000 img/s, N=2 at 2,000) and a 3-epoch ddp N=1 run
    at 800 added to its folder: the 2-epoch rows were scaled against whichever N=1 row came
    last (N=2 2.50x, its own N=1 1.25x) and drawn as one line with two points at N=1,
    joined by a zigzag. Each is scaled against the N=1 run of its own length, and each
    length is a line of its own, named by it where another line reads alike (not the
    fastest path's, of other options too); a figure whose lines all ran as many epochs does
    not name them."""
    from bench.report import figures_per_workload, summary_table

    def run(run_id, world, epoch_times, **options):
        return {**record(run_id, "ddp", world, epoch_times, [0.1] * len(epoch_times)),
                "epochs": len(epoch_times), **options}

    records = [run("two-1", 1, [2.0, 1.0]), run("two-2", 2, [1.0, 0.5]),
               run("three-1", 1, [2.0, 1.25, 1.25]), run("fast", 1, [2.0, 0.5], loader="gpu")]
    table = summary_table(records)
    speedups = {(r.world_size, r.epochs): round(r.speedup, 2) for r in table.itertuples()
                if r.options == "—"}
    assert speedups == {(1, 2): 1.0, (2, 2): 2.0, (1, 3): 1.0}, speedups
    for name in ("scaling", "scaling_efficiency"):
        figure = figures_per_workload(records)[CPU_BLOCK.format(100)][name]
        lines = {line.get_label(): list(line.get_xdata())
                 for line in figure.axes[0].lines if line.get_label()[0] not in "_i"}
        assert lines == {"ddp fp32 (2 epochs)": [1, 2], "ddp fp32 (3 epochs)": [1],
                         "ddp fp32 (gpu-data)": [1]}, lines
    figure = figures_per_workload(records[:2])[CPU_BLOCK.format(100)]["scaling"]
    assert [line.get_label() for line in figure.axes[0].lines
            if line.get_label()[0] != "_"] == ["ddp fp32"]


def _many_records(results, workloads: int = 6):
    """Six workloads of three strategies at N = 1, 2, 4: a report draws for seconds."""
    recs = [{**record(f"r{w}{s}{n}", s, n, [3.0, 1.0 + 0.1 * w * n], [0.1, 0.2 + 0.01 * w]),
             "train_size": 1000 * (w + 1)}
            for w in range(workloads) for s in ("ddp", "dp", "fsdp") for n in (1, 2, 4)]
    return write_runs(results, recs)


def _whole(folder) -> list[str]:
    """Plot files that are not whole (a PNG PIL cannot verify, an SVG not closed)."""
    from PIL import Image

    broken = []
    for path in folder.rglob("*"):
        if path.name.startswith(".") and ".tmp" in path.name:
            broken.append(f"{path.name}: a temporary file left")
        elif path.suffix == ".png":
            try:
                with Image.open(path) as image:
                    image.verify()
            except Exception as exc:  # any way a cut file fails
                broken.append(f"{path.name}: {exc}")
        elif path.suffix == ".svg":
            if not path.read_text().rstrip().endswith("</svg>"):
                broken.append(path.name)
        elif path.is_file():
            broken.append(f"{path.name}: not a plot")
    return broken


def test_a_dead_writers_temporary_file_goes_before_its_process_is_reaped(tmp_path):
    """A drawer killed with its report is a zombie until init reaps it (here a second
    later; a container's init may never): the next report kept its temporary file as a
    live writer's, and the kill test below failed whenever it came that soon. Dead is
    dead; a live writer's file stays."""
    import subprocess
    import sys

    from bench.records.files import remove_dead_temporaries

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.waitid(os.P_PID, dead.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        state = Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "Z", state
        (tmp_path / f".a.png.{dead.pid}.x1y2.tmp").write_text("cut")
        (tmp_path / f".b.png.{live.pid}.x3y4.tmp").write_text("drawing")
        remove_dead_temporaries(tmp_path)
        assert [p.name for p in tmp_path.iterdir()] == [f".b.png.{live.pid}.x3y4.tmp"]
    finally:
        live.kill()
        live.wait()
        dead.wait()


def test_a_kill_9_mid_draw_and_two_reports_at_once_leave_every_plot_whole(tmp_path):
    """Plots were removed, then drawn in place: a report killed while drawing left the
    folder with plots missing or cut, and two at once could remove each other's. Now each
    file is replaced whole, the stale ones go only after the new ones are in place, and a
    killed writer's temporary file goes with the next report."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    results = _many_records(tmp_path / "results")
    assert run_bench("report", "--results", str(results)).returncode == 0
    plots = results / "plots"
    first = sorted(p.relative_to(plots) for p in plots.rglob("*.png"))
    assert len(first) >= 12 and not _whole(plots)
    cmd = [sys.executable, "-m", "bench", "report", "--results", str(results)]
    for drawn in (1, 12):  # killed after that many of its files are drawn
        before = {p: p.stat().st_mtime_ns for p in plots.rglob("*.png")}
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while sum(not p.exists() or p.stat().st_mtime_ns != t for p, t in before.items()) \
                < drawn:
            assert time.monotonic() < deadline and proc.poll() is None, "nothing drawn"
            time.sleep(0.05)  # 20 polls a second: still mid-draw
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        shown = [p for p in plots.rglob("*") if not p.name.startswith(".")]
        assert sorted(p.relative_to(plots) for p in shown if p.suffix == ".png") == first
        assert not [b for b in _whole(plots) if "temporary" not in b], _whole(plots)
    two = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True) for _ in range(2)]
    for proc in two:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert not _whole(plots), _whole(plots)  # the killed reports' temporary files gone too
    assert sorted(p.relative_to(plots) for p in plots.rglob("*.png")) == first


DRAW = """
import sys
from pathlib import Path
from bench.records.files import load_records
from bench.report.plots import write_plots
records, _ = load_records(sys.argv[1])
write_plots(records, Path(sys.argv[2]), processes=int(sys.argv[3]))
"""


def test_workloads_drawn_side_by_side_are_the_same_bytes_and_end_with_the_report(tmp_path):
    """A report draws its workloads in forked processes, one per core (on the tests' one
    core a report draws alone, so the processes are asked for here): their files are the
    bytes one process writes, and a kill -9 of the report leaves none of them drawing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT, descendants, still_running

    def draw(results, folder, processes, **popen):
        return subprocess.Popen([sys.executable, "-c", DRAW, str(results), str(folder),
                                 str(processes)], cwd=ROOT, **popen)

    two = _many_records(tmp_path / "two", workloads=2)
    files = {}
    for processes in (1, 2):
        folder = tmp_path / f"drawn-by-{processes}"
        assert draw(two, folder, processes).wait(timeout=300) == 0
        files[processes] = {p.relative_to(folder): p.read_bytes()
                            for p in folder.rglob("*") if p.is_file()}
    assert len(files[1]) >= 8 and files[2] == files[1]  # 2 workloads, PNG and SVG each

    killed = tmp_path / "killed"
    report = draw(_many_records(tmp_path / "six"), killed, 3, start_new_session=True)
    deadline = time.monotonic() + 120
    while not any(killed.rglob("*.png")):
        assert time.monotonic() < deadline and report.poll() is None, "nothing drawn"
        time.sleep(0.05)
    drawers = descendants(report.pid)
    assert len(drawers) == 3, drawers  # the fork path ran
    os.kill(report.pid, signal.SIGKILL)
    report.wait()
    # dead within a second, not when their workloads are drawn (left alone they drew on
    # for seconds, then died of a broken pipe)
    assert not still_running(drawers, within=1), "drawers outlived the report by 1 s"


def test_memory_per_rank_is_shown_by_parts_where_rows_differ():
    """A record's memory_parts: the terminal table shows mem/rank only where a workload's
    rows differ by more than 10 %, and the memory figure stacks each row's parts."""
    from bench.report import figures_per_workload, summary_table
    from bench.report.views import to_text

    mib = 2**20

    def run(run_id, strategy, params, grads, state, peak, train_size=1000):
        rec = {**record(run_id, strategy, 2, [3.0, 2.0], [0.1, 0.5]), "train_size": train_size}
        rec["memory_parts"] = {"parameters": params * mib, "gradients": grads * mib,
                               "optimizer_state": state * mib, "peak": peak * mib,
                               "activations_and_workspace": (peak - params - grads - state) * mib}
        return rec

    records = [run("a", "ddp", 40, 40, 40, 400), run("b", "fsdp", 20, 20, 20, 300),
               run("c", "ddp", 40, 40, 40, 400, 2000), run("d", "fsdp", 20, 20, 20, 380, 2000)]
    text = to_text(summary_table(records))
    first, second = text.split("\n\n")[:2]
    assert "mem/rank" in first and "300 MiB" in first and "400 MiB" in first  # 1.33x
    assert "mem/rank" not in second  # 400 against 380: within 10 %
    figure = figures_per_workload(records)[CPU_BLOCK.format(100)]["memory"]
    bars = figure.axes[0].containers
    tops = [sum(c[i].get_height() for c in bars) for i in range(2)]
    assert tops == [400.0, 300.0]
    assert [round(c[1].get_height()) for c in bars] == [20, 20, 20, 240]


def test_an_accuracy_block_draws_top1_against_n_and_no_times():
    """The N = 1…8 block (8 ranks on 2 cores): Δ top-1 against N with each row's CI as a
    bar and the reference's as a band; no figure of times, which measure the crowding."""
    def run(run_id, n, top1):
        rec = record(run_id, "ddp", n, [10.0 * n, 10.0 * n], [top1 - 0.1, top1])
        if n > 2:
            rec["oversubscribed"] = {"processes": n, "cores": 2}
        return rec

    from bench.report import figures_per_workload

    records = [run(f"{n}-{i}", n, 0.92 - n / 1000 + i / 500) for n in (1, 2, 8)
               for i in range(3)]
    figures = figures_per_workload(records)[CPU_BLOCK.format(100)]
    assert "accuracy_vs_n" in figures and "epoch_time" not in figures, sorted(figures)
    assert not {"scaling", "time_vs_accuracy", "where_time_goes"} & set(figures)
    ax = figures["accuracy_vs_n"].axes[0]
    (line,) = [line for line in ax.lines if line.get_marker() == "o"]  # one series
    assert list(line.get_xdata()) == [1, 2, 8]
    first, _, last = line.get_ydata()
    assert first == 0.0 and last < 0
    assert ax.get_yscale() == "linear"
    # a row 20 points down (PowerSGD r=1 in the committed block): the axis turns symmetric-
    # log beyond the reference's band, so the rows within a point stay apart; lines at one
    # N stand side by side
    far = [run(f"far-{i}", 8, 0.72 + i / 20) for i in range(3)]
    for rec in far:
        rec["ddp_options"] = {"comm_hook": "powersgd", "powersgd_rank": 1}
    ax = figures_per_workload(records + far)[CPU_BLOCK.format(100)]["accuracy_vs_n"].axes[0]
    assert ax.get_yscale() == "symlog"
    xs = [line.get_xdata()[-1] for line in ax.lines if line.get_marker() == "o"]
    assert len(xs) == 2 and xs[0] != xs[1] and all(7.5 < x < 8.5 for x in xs), xs


def test_more_lines_than_colours_are_each_drawn_their_own_way():
    """matplotlib has ten colours; the committed accuracy block's 15 curves drew ddp N=1 and
    ddp-amp N=2 both as blue circles on a solid line, so the legend could not say which
    line was which. Twelve rows here, each its own curve and point: no two alike."""
    from matplotlib.colors import to_hex

    from bench.report import figures_per_workload

    rows = [{**record(f"r{i}", "ddp", 2, [3.0, 2.0 + i / 10], [0.1 + i / 100, 0.5 + i / 100]),
             "grad_accum": i + 1} for i in range(12)]
    figure = figures_per_workload(rows)[CPU_BLOCK.format(100)]
    lines = figure["top1"].axes[0].lines
    assert len(lines) == 12
    looks = {(to_hex(line.get_color()), line.get_marker(), line.get_linestyle()) for line in lines}
    assert len(looks) == 12, looks
    points = [bars.lines[0] for bars in figure["time_vs_accuracy"].axes[0].containers]
    marks = {(to_hex(p.get_color()), p.get_marker()) for p in points}
    assert len(points) == 12 and len(marks) == 12, marks


def test_a_row_that_ran_fewer_replicas_than_asked_is_named_so_in_every_figure():
    """`bench run --strategy dp --gpus 2 --cpu` runs one replica: its row is "1 (of 2 asked)"
    in the table, "dp (2 asked)" in the verdict. Beside a dp row asked for 1, its bar was
    named "dp N=1 fp32" as well, and the efficiency and scaling figures drew both on one
    line, rising straight up at N=1."""
    from bench.report import figures_per_workload

    one = record("a", "dp", 1, [3.0, 2.0], [0.1, 0.5])
    asked = {**record("b", "dp", 1, [3.0, 1.95], [0.1, 0.5]), "gpus_requested": 2}
    two = record("c", "ddp", 2, [3.0, 1.0], [0.1, 0.5])
    figures = figures_per_workload([one, asked, two])[CPU_BLOCK.format(100)]
    ticks = [t.get_text() for t in figures["epoch_time"].axes[0].get_xticklabels()]
    assert ticks[:2] == ["dp N=1 fp32", "dp N=1 (2 asked) fp32"], ticks
    for name in ("scaling", "scaling_efficiency"):
        lines = {line.get_label(): list(line.get_xdata())
                 for line in figures[name].axes[0].lines if not line.get_label().startswith("_")}
        assert lines["dp fp32"] == [1] and lines["dp fp32 (fewer replicas than asked)"] == [1], (
            name, lines)


def test_a_folder_of_one_epoch_runs_draws_what_it_has_and_says_what_it_lacks():
    """`bench run --epochs 1` trains its warm-up epoch alone: its epoch-time figure was empty
    axes from -0.04 to 0.04 s under a 'flagged' legend, and its accuracy figure numbered the
    one epoch 0.960, 0.975 ... 1.050 above a top-1 axis that went below 0 %."""
    from bench.report import figures_per_workload

    records = [record("a", "ddp", 2, [3.0], [0.0]), record("b", "ddp", 1, [4.0], [0.0])]
    figures = figures_per_workload(records)[CPU_BLOCK.format(100)]
    ax = figures["epoch_time"].axes[0]
    said = " ".join(" ".join(t.get_text().split()) for t in ax.texts)
    assert "no timed epoch: each run's only epoch was its warm-up" in said, said
    assert list(ax.get_yticks()) == []  # no scale for bars that are not there
    ax = figures["top1"].axes[0]
    figures["top1"].canvas.draw()
    assert [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] == [1.0]
    assert ax.get_ylim()[0] >= 0.0, ax.get_ylim()


def test_the_legend_of_where_time_goes_covers_no_bar():
    """A folder of one multi-rank run drew its one bar the axes' whole width, and the legend
    ('compute (sync off)', 'exposed communication') on top of its exposed part."""
    from bench.report import figures_per_workload

    for n in (1, 3, 8):
        rows = [{**record(f"r{i}", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "compute_step_s": 1.5,
                 "ddp_options": {"bucket_cap_mb": 5.0 + i}} for i in range(n)]
        fig = figures_per_workload(rows)[CPU_BLOCK.format(100)]["where_time_goes"]
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent(renderer)
        bars = [patch.get_window_extent(renderer) for patch in ax.patches]
        assert bars and not any(legend.overlaps(bar) for bar in bars), n
        assert legend.x1 <= fig.bbox.x1 + 1, n  # on the figure, not cut off at its edge


def test_the_fastest_point_of_the_scaling_plot_is_drawn_whole():
    """dp at N=1 (670 img/s) beside ddp-zero at N=2 (519): the y axis started at 0 and kept
    matplotlib's margin, a share of the points' own range, so the fastest point sat on the
    frame with the top half of its marker cut off."""
    from bench.report import figures_per_workload

    rows = [record("a", "dp", 1, [3.0, 1.0], [0.1, 0.5]),
            record("b", "ddp-zero", 2, [3.0, 1.3], [0.1, 0.5])]
    fig = figures_per_workload(rows)[CPU_BLOCK.format(100)]["scaling"]
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    frame = ax.get_window_extent(renderer)
    for line in ax.get_lines():
        size = line.get_markersize() * fig.dpi / 72  # the marker's width in pixels
        for y in ax.transData.transform(line.get_xydata())[:, 1]:
            assert y + size / 2 <= frame.y1, (line.get_label(), y, frame.y1)


def test_time_vs_accuracy_draws_time_from_0_and_every_point_whole():
    """Two rows 1 s apart in 127 s (make demo's ddp at N=1 and N=2 on 2 cores): the time
    axis was fitted to the points' own range, 126.0 to 127.1 s, and a 0.8 % gap was drawn as
    the axis's whole width. From 0, the gap is drawn as the share of the time it is."""
    from bench.report import figures_per_workload

    rows = [record("a", "ddp", 1, [50.0, 38.0, 38.5], [0.4, 0.9, 0.998]),
            record("b", "ddp", 2, [50.0, 38.0, 37.5], [0.5, 0.9, 1.0])]
    fig = figures_per_workload(rows)[CPU_BLOCK.format(100)]["time_vs_accuracy"]
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    assert low == 0, (low, high)
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    xs = []
    for container in ax.containers:  # each row's error bar: its point, then caps and bar
        line = container.lines[0]
        size = line.get_markersize() * fig.dpi / 72
        for x, y in ax.transData.transform(line.get_xydata()):
            xs.append(x)
            assert frame.x0 <= x - size / 2 and x + size / 2 <= frame.x1, (x, size, frame)
            assert y + size / 2 <= frame.y1, (y, size, frame)
    assert len(xs) == 2 and abs(xs[0] - xs[1]) < 0.05 * frame.width, (xs, frame.width)


def test_time_to_target_draws_a_whisker_only_where_runs_spread():
    """One run per row (the committed CPU table): every bar carried the caps of a zero-length
    whisker, drawn like a tight interval. A row of one run has no spread to draw; a row of
    three that reached the target spans their fastest and slowest."""
    from bench.report import figures_per_workload

    def reached(run_id, world, seconds):
        return {**record(run_id, "ddp", world, [3.0, 2.0], [0.1, 0.5]), "target_top1": 40.0,
                "reached_target": True, "time_to_target_s": seconds}

    rows = [reached("one", 1, 20.0), *(reached(f"r{s}", 2, s) for s in (8.0, 10.0, 13.0))]
    ax = figures_per_workload(rows)[CPU_BLOCK.format(100)]["time_to_target"].axes[0]
    caps = sorted(round(y, 6) for line in ax.lines for y in line.get_ydata())
    assert caps == [8.0, 13.0], caps  # N=2's fastest and slowest; nothing on N=1's bar
    assert sorted(round(p.get_height(), 6) for p in ax.patches) == [10.0, 20.0]
