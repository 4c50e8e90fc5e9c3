"""The report's figures, drawn per workload: runs of different workloads never share a
figure, and a figure with nothing to show is not written."""

from __future__ import annotations

import hashlib
import math
import os
import re
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.records.describe import workload
from bench.records.files import atomic_file
from bench.report.figures import (
    accuracy_vs_n_figure,
    busbw_figure,
    efficiency_figure,
    memory_figure,
    probes_of,
    time_to_target_figure,
    where_time_goes_figure,
)
from bench.report.plot_labels import (
    FLAGGED,
    SERIES,
    at_least_points,
    legend,
    line_label,
    ring_flagged,
    row_label,
    short_row_label,
)
from bench.report.table import GROUP_KEYS, report_order, run_rows, summary_table
from bench.report.verdict import speed_not_comparable
from bench.tools.cores import usable_cores
from bench.tools.plot_style import PLAIN_TEXT, line_look, point_marker
from bench.tools.terminal import count

CEILING_SHOWN = 2.0  # the loader's ceiling is drawn where it is within this of training's rate


def make_figures(records: list[dict[str, Any]],
                 probes: list[dict[str, Any]] | None = None, table=None) -> dict[str, Any]:
    """Matplotlib figures by name: epoch_time, scaling, top1, time_to_target,
    time_vs_accuracy, where_time_goes, scaling_efficiency, and busbw (with probes).
    ``table``: these records' summary_table, when the caller has it already. Every text in
    them is plain (PLAIN_TEXT)."""
    import matplotlib

    with matplotlib.rc_context(PLAIN_TEXT):
        return _make_figures(records, probes, table)


def _make_figures(records: list[dict[str, Any]], probes: list[dict[str, Any]] | None,
                  table) -> dict[str, Any]:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if table is None:
        table = summary_table(records, probes=probes)
    ok = table[table["status"] == "ok"]
    figures: dict[str, Any] = {}

    fig, ax = plt.subplots(figsize=(8, 5))
    labels = [row_label(r) for r in ok.itertuples()]
    bars = ax.bar(range(len(ok)), ok["epoch_time_s"], color="tab:blue")
    for bar, flags in zip(bars, ok["flags"]):
        if flags:
            bar.set(hatch="//", edgecolor="tab:red", label=FLAGGED)
    if ok["flags"].astype(bool).any():
        top = ok["epoch_time_s"].max()
        if top == top:  # room above the bars for the legend (NaN: nothing to make room for)
            ax.set_ylim(0, 1.15 * top)
        legend(ax, fontsize=8, loc="upper right")
    ax.set_xticks(range(len(ok)), labels, fontsize=8, rotation=30, ha="right")
    if len(ok) and not ok["epoch_time_s"].notna().any():  # axes of bars of no height
        ax.text(0.5, 0.5, "no timed epoch: each run's only epoch was its warm-up\n"
                "(--epochs 2 or more times the epochs after it)", ha="center",
                va="center", transform=ax.transAxes, fontsize=9, color="dimgrey")
        ax.set_yticks([])
    ax.set_ylabel("epoch time (s)")
    ax.set_title("Epoch time per strategy and world size (median, warm-up excluded)")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figures["epoch_time"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    ceiling_label = f"loader alone (drawn within {CEILING_SHOWN:g}× of training)"
    for i, (key, grp) in enumerate(ok.groupby(SERIES)):
        grp = grp.sort_values("world_size")
        (line,) = ax.plot(grp["world_size"], grp["images_per_s"], label=line_label(key, ok),
                          **line_look(i))
        near = grp[grp["loader_alone"] <= CEILING_SHOWN * grp["images_per_s"]]
        if len(near):  # the input pipeline's ceiling, where it was close to limiting
            ax.plot(near["world_size"], near["loader_alone"], "_", markersize=16, mew=2,
                    color=line.get_color(), label=ceiling_label)
            ceiling_label = None
        ring_flagged(ax, list(grp.itertuples()), grp["world_size"], grp["images_per_s"])
        one = grp[grp["world_size"] == 1]
        if len(one):
            ns = sorted(set(grp["world_size"]))
            ax.plot(ns, [one["images_per_s"].iloc[0] * n for n in ns], ":", color="grey")
    ax.set_xlabel("world size N (GPUs or CPU processes)")
    ax.set_ylabel("images/s (training)")
    # from 0, with room above the highest point: the margin matplotlib leaves is a share of
    # the points' own range, and a lone fastest point sat on the frame, half its marker cut
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.06 * ax.dataLim.y1))
    if len(ok):
        ax.set_xticks(sorted({int(n) for n in ok["world_size"]}))
    ax.set_title("Scaling (dotted: ideal linear from N=1; dash: loader alone)"
                 if ceiling_label is None else "Scaling (dotted: ideal linear from N=1)")
    if len(ok):
        legend(ax, fontsize=8)
    figures["scaling"] = fig

    # One curve per table row (the mean over its repeats), legend outside the axes.
    fig, ax = plt.subplots(figsize=(8, 4))
    runs = run_rows(records)
    # each run's row's ``apart`` ('3 epochs'), so that its curve is named as its row is
    apart_of = {tuple(str(r[k]) for k in GROUP_KEYS): r["apart"]
                for r in table.to_dict("records")}
    runs["apart"] = [apart_of.get(tuple(str(r[k]) for k in GROUP_KEYS), "")
                     for r in runs.to_dict("records")]
    by_run = {rec.get("run_id"): rec for rec in records}
    groups = runs[runs["status"] == "ok"].groupby(GROUP_KEYS, dropna=False)
    drawn: dict[tuple, list[str]] = {}  # a curve -> the rows that have it
    for _, group in sorted(groups, key=lambda kv: report_order(dict(zip(GROUP_KEYS, kv[0])))):
        curves = [[100 * e["top1"] for e in by_run[i].get("per_epoch") or []]
                  for i in group["run_id"]]
        length = min(len(c) for c in curves)
        if not length:
            continue
        mean = [statistics.fmean(c[e] for c in curves) for e in range(length)]
        label = row_label(next(group.itertuples()))
        label += f" ({len(curves)} runs)" if len(curves) > 1 else ""
        drawn.setdefault(tuple(round(v, 6) for v in mean), []).append(label)
    for i, (curve, labels) in enumerate(drawn.items()):
        # rows that trained to the same top-1 at every epoch draw one line, not several
        # hidden under each other: the legend names them all
        label = labels[0] + "".join(f"\n= {other}" for other in labels[1:])
        ax.plot(range(1, len(curve) + 1), curve, label=label, **line_look(i))
    ax.set_xlabel("epoch")
    # whole epochs, even where there is one (two ticks at least put 0.96 beside 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_ylabel("test top-1 (%, mean over repeats)")
    ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))  # a top-1 of 0 % drew -0.04 below it
    ax.set_title("Accuracy per epoch")
    if ax.lines:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figures["top1"] = fig

    figures["time_to_target"] = time_to_target_figure(ok)

    # One point per row (median training time, mean top-1 with its 95 % CI), named in the
    # legend rather than by text beside the points, which overlaps when rows are close.
    fig, ax = plt.subplots(figsize=(7, 4))
    lengths = ok["epochs"].nunique() > 1  # then each point says its own
    repeated = bool((ok["runs"] > 1).any()) if len(ok) else False
    for i, r in enumerate(ok.itertuples()):
        ci = r.final_top1_ci if not math.isnan(r.final_top1_ci) else 0.0
        ax.errorbar(r.total_train_time_s, r.final_top1, yerr=ci, fmt=point_marker(i),
                    color=f"C{i % 10}", capsize=3,
                    label=short_row_label(r) + (f", {count(int(r.epochs), 'epoch')}" if lengths
                                                and "epochs" not in r.apart_by else "")
                    + (" (1 run)" if repeated and r.runs == 1 else ""))
    at_least_points(ax, [v for r in ok.itertuples() for v in (
        r.final_top1 - (r.final_top1_ci if r.final_top1_ci == r.final_top1_ci else 0.0),
        r.final_top1 + (r.final_top1_ci if r.final_top1_ci == r.final_top1_ci else 0.0))])
    # time from 0, with room right of the slowest point: matplotlib fits the axis to the
    # points' own range, and two rows 1 s apart in 127 (0.8 %) were drawn at its two ends
    ax.set_xlim(0, max(ax.get_xlim()[1], 1.06 * ax.dataLim.x1))
    ax.set_xlabel("total training time (s, median over runs)")
    ax.set_ylabel("final top-1 (%, mean ± 95 % CI)" if repeated
                  else "final top-1 (%, one run per row: no CI)")
    ax.set_title("Time vs accuracy")
    if len(ok):
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figures["time_vs_accuracy"] = fig
    figures["where_time_goes"] = where_time_goes_figure(ok)
    figures["memory"] = memory_figure(ok)
    figures["scaling_efficiency"] = efficiency_figure(ok)
    figures["accuracy_vs_n"] = accuracy_vs_n_figure(ok)
    shown = probes_of(set(ok["device"]), probes or [],
                       {n if isinstance(n, str) else None for n in ok["network"]})
    if shown:
        figures["busbw"] = busbw_figure(shown, sorted(
            {int(b) for b in ok["gradient_bytes"] if isinstance(b, (int, float)) and b > 0}))
    for fig in figures.values():
        fig.tight_layout()
    return figures


def workload_slug(name: str) -> str:
    """A folder name for a workload: 'synthetic d=1 50000 img, batch 512, resnet18' ->
    'synthetic-d1-50000img-batch512-resnet18'. One longer than SLUG_CHARS keeps its start
    and a hash of the whole name: a file system's names end at 255 bytes, and a long CPU or
    ImageFolder name ended the report ('File name too long: write elsewhere', which could
    not help). Only a count's ' img' and the 'batch ' of a number are joined: an ImageFolder
    named 'imgs' or 'batches' stays a word of its own."""
    text = re.sub(r"(\d) img\b", r"\1img", name.replace("=", ""))
    text = re.sub(r"\bbatch (\d)", r"batch\1", text)
    slug = "-".join(re.findall(r"[A-Za-z0-9.]+", text)).replace(".", "_")
    if len(slug) <= SLUG_CHARS:
        return slug
    return f"{slug[:SLUG_CHARS - 9].rstrip('-')}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


SLUG_CHARS = 120


# The figures of times, which an accuracy block (ranks oversubscribing the cores) leaves out.
_TIME_FIGURES = ("epoch_time", "scaling", "time_to_target", "time_vs_accuracy",
                 "where_time_goes", "scaling_efficiency")


def records_by_workload(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by workload, in the order each workload first appears."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(workload(rec), []).append(rec)
    return groups


def workload_figures(name: str, records: list[dict[str, Any]],
                     probes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """make_figures for one workload's records (``name``: the workload), keeping only the
    figures that show data, each signed with the workload's name."""
    import matplotlib.pyplot as plt

    figures = {}
    table = summary_table(records, probes=probes)
    shows = {  # what a figure needs to say anything
        "time_to_target": bool(table["time_to_target_s"].notna().any()
                               and (table["time_to_target_s"] < math.inf).any()),
        "scaling": table["world_size"].nunique() > 1,
        "scaling_efficiency": table["world_size"].nunique() > 1,
        "memory": bool(table["mem_rank"].notna().any()) if "mem_rank" in table else False,
        "accuracy_vs_n": (table["world_size"].nunique() > 1
                          and bool(table["delta_top1"].notna().any())
                          and bool((table["runs"] > 1).any())),
    }
    if speed_not_comparable(table.to_dict("records")):  # an accuracy block: no times
        shows.update(dict.fromkeys(_TIME_FIGURES, False))
    for key, fig in make_figures(records, probes, table).items():
        if shows.get(key, True) and any(ax.has_data() for ax in fig.axes):
            fig.text(0.005, 0.005, f"workload: {name}", fontsize=7, color="0.4",
                     parse_math=False)
            figures[key] = fig
        else:  # e.g. time to target when no run set a target
            plt.close(fig)
    return figures


def figures_per_workload(records: list[dict[str, Any]],
                         probes: list[dict[str, Any]] | None = None
                         ) -> dict[str, dict[str, Any]]:
    """workload_figures for each workload's records alone (runs of different workloads are
    never drawn together), all open at once: for a few records. What shows every workload
    (the page, the notebook) draws one at a time with ``each_workload_figures``."""
    return dict(each_workload_figures(records, probes))


def each_workload_figures(records: list[dict[str, Any]],
                          probes: list[dict[str, Any]] | None = None
                          ) -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload, its figures), drawn as the caller asks for the next, so that it can show
    and close one workload's before the next are drawn: all at once, the committed
    results' 6 workloads held 40 figures open, and matplotlib warned past 20 ("More than
    20 figures have been opened") under the page and in the notebook."""
    for name, recs in records_by_workload(records).items():
        yield name, workload_figures(name, recs, probes)


def _draw_workload(job: tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, Path]
                   ) -> list[Path]:
    """One workload's figures written under ``folder/<workload>/``, each file aside and
    renamed into place (bench.records.files.atomic_file); the paths written."""
    import matplotlib.pyplot as plt

    name, records, probes, folder = job
    sub = folder / workload_slug(name)
    written = []
    for key, fig in workload_figures(name, records, probes).items():
        for ext in ("png", "svg"):
            path = sub / f"{key}.{ext}"
            with atomic_file(path) as tmp:
                fig.savefig(tmp, dpi=120, format=ext,
                            metadata={"Date": None} if ext == "svg" else None)
            written.append(path)
        plt.close(fig)
    return written


def _drawing_worker(report: int) -> None:
    """A forked drawer: killed with the report (``report``: its pid; a kill -9 of it leaves
    no drawer behind, only temporary files, which the next report removes); Ctrl-C is the
    report's to handle (it then ends the drawers), a stop signal ends the drawer."""
    import signal

    from bench.tools.lifetime import die_with_parent

    die_with_parent(report)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def drawing_processes(workloads: int) -> int:
    """Processes to draw in: one per core this process may run on, one per workload at
    most. Each workload's figures are drawn alone, so that the files are the same bytes
    whichever process drew them."""
    return max(1, min(usable_cores(), workloads))


def write_plots(records: list[dict[str, Any]], folder: Path,
                probes: list[dict[str, Any]] | None = None,
                processes: int | None = None) -> list[Path]:
    """Every figure with data, per workload: ``folder/<workload>/<name>.{png,svg}``, the
    workloads drawn side by side in ``processes`` forked processes (default:
    drawing_processes; 1: in this process). Each file is written aside and renamed into place
    (bench.records.files.atomic_file), then the plots of an earlier report that this one did
    not draw are removed: a report killed while it draws, or two reports of one folder at
    once, leave whole files, never cut ones (the temporary files of a report killed
    mid-draw go with the next: bench report's start)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # loaded once, before any fork (its fonts too)

    matplotlib.rcParams["figure.max_open_warning"] = 0  # closed once written
    matplotlib.rcParams["svg.hashsalt"] = "parallel-bench"  # same figure, same file
    jobs = [(name, recs, probes, folder) for name, recs in records_by_workload(records).items()]
    processes = drawing_processes(len(jobs)) if processes is None else processes
    if processes > 1 and threading.active_count() > 1:
        processes = 1  # a caller with threads (a notebook's kernel) is not forked: a lock
        # another thread held at the fork would stay held in the copy
    if processes <= 1:
        drawn = [_draw_workload(job) for job in jobs]
    else:
        import multiprocessing

        # forked: the report loads no torch and runs no thread, and a fork copies the
        # imports and the settings above instead of starting Python again
        with multiprocessing.get_context("fork").Pool(
                processes, initializer=_drawing_worker, initargs=(os.getpid(),)) as pool:
            drawn = pool.map(_draw_workload, jobs, chunksize=1)
    written = [path for paths in drawn for path in paths]
    kept = set(written)
    for old in [*folder.glob("*.png"), *folder.glob("*.svg"), *folder.glob("*/*.png"),
                *folder.glob("*/*.svg")]:
        if old not in kept:
            old.unlink(missing_ok=True)
    for empty in folder.iterdir() if folder.is_dir() else []:
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()
    return written
