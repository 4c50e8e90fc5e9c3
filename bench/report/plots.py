"""The report's figures, drawn per workload: runs of different workloads never share a
figure, and a figure with nothing to show is not written."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from typing import Any

from bench.records.describe import short_options, workload
from bench.records.files import atomic_file
from bench.report.table import GROUP_KEYS, report_order, run_rows, summary_table
from bench.report.verdict import speed_not_comparable


def row_label(r) -> str:
    """A row's name in plots: strategy, N, precision and what else sets it apart."""
    return " ".join([r.strategy, f"N={r.world_size}", r.precision, *_sets_apart(r)])


def _sets_apart(r) -> list[str]:
    """What else tells a row from its workload's others: speed options, accumulation, a
    flag."""
    options = short_options(r.options)
    extra = [] if options == "—" else [options]
    if r.grad_accum > 1:
        extra.append(f"accum {r.grad_accum}")
    if getattr(r, "flags", ""):
        extra.append(_FLAG)
    return extra


_FLAG = "⚠"
_FLAGGED = "⚠ flagged: suspect (see `bench report`)"


def _legend(ax, **kwargs) -> None:
    """A legend with each label once (every line's flagged points share one entry)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), **kwargs)


def _ring_flagged(ax, rows, xs, ys) -> None:
    """A red ring around each point whose row is flagged."""
    points = [(x, y) for r, x, y in zip(rows, xs, ys) if r.flags]
    if points:
        ax.scatter(*zip(*points), s=160, facecolors="none", edgecolors="tab:red",
                   linewidths=1.5, zorder=5, label=_FLAGGED)


CEILING_SHOWN = 2.0  # the loader's ceiling is drawn where it is within this of training's rate


def make_figures(records: list[dict[str, Any]],
                 probes: list[dict[str, Any]] | None = None, table=None) -> dict[str, Any]:
    """Matplotlib figures by name: epoch_time, scaling, top1, time_to_target,
    time_vs_accuracy, where_time_goes, scaling_efficiency, and busbw (with probes).
    ``table``: these records' summary_table, when the caller has it already."""
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
            bar.set(hatch="//", edgecolor="tab:red", label=_FLAGGED)
    if ok["flags"].astype(bool).any():
        top = ok["epoch_time_s"].max()
        if top == top:  # room above the bars for the legend (NaN: nothing to make room for)
            ax.set_ylim(0, 1.15 * top)
        _legend(ax, fontsize=8, loc="upper right")
    ax.set_xticks(range(len(ok)), labels, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("epoch time (s)")
    ax.set_title("Epoch time per strategy and world size (median, warm-up excluded)")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figures["epoch_time"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    ceiling_label = f"loader alone (drawn within {CEILING_SHOWN:g}× of training)"
    for key, grp in ok.groupby(_SERIES):
        grp = grp.sort_values("world_size")
        (line,) = ax.plot(grp["world_size"], grp["images_per_s"], "o-",
                          label=_series_label(*key))
        near = grp[grp["loader_alone"] <= CEILING_SHOWN * grp["images_per_s"]]
        if len(near):  # the input pipeline's ceiling, where it was close to limiting
            ax.plot(near["world_size"], near["loader_alone"], "_", markersize=16, mew=2,
                    color=line.get_color(), label=ceiling_label)
            ceiling_label = None
        _ring_flagged(ax, list(grp.itertuples()), grp["world_size"], grp["images_per_s"])
        one = grp[grp["world_size"] == 1]
        if len(one):
            ns = sorted(set(grp["world_size"]))
            ax.plot(ns, [one["images_per_s"].iloc[0] * n for n in ns], ":", color="grey")
    ax.set_xlabel("world size N (GPUs or CPU processes)")
    ax.set_ylabel("images/s (training)")
    ax.set_ylim(bottom=0)
    if len(ok):
        ax.set_xticks(sorted({int(n) for n in ok["world_size"]}))
    ax.set_title("Scaling (dotted: ideal linear from N=1; dash: loader alone)"
                 if ceiling_label is None else "Scaling (dotted: ideal linear from N=1)")
    if len(ok):
        _legend(ax, fontsize=8)
    figures["scaling"] = fig

    # One curve per table row (the mean over its repeats), legend outside the axes.
    fig, ax = plt.subplots(figsize=(8, 4))
    runs = run_rows(records)
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
    for curve, labels in drawn.items():
        # rows that trained to the same top-1 at every epoch draw one line, not several
        # hidden under each other: the legend names them all
        label = labels[0] + "".join(f"\n= {other}" for other in labels[1:])
        ax.plot(range(1, len(curve) + 1), curve, "o-", label=label)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("test top-1 (%, mean over repeats)")
    ax.set_title("Accuracy per epoch")
    if ax.lines:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figures["top1"] = fig

    figures["time_to_target"] = _time_to_target_figure(ok)

    # One point per row (median training time, mean top-1 with its 95 % CI), named in the
    # legend rather than by text beside the points, which overlaps when rows are close.
    fig, ax = plt.subplots(figsize=(7, 4))
    markers = "osD^v<>phX*"
    lengths = ok["epochs"].nunique() > 1  # then each point says its own
    repeated = bool((ok["runs"] > 1).any()) if len(ok) else False
    for i, r in enumerate(ok.itertuples()):
        ci = r.final_top1_ci if not math.isnan(r.final_top1_ci) else 0.0
        ax.errorbar(r.total_train_time_s, r.final_top1, yerr=ci, fmt=markers[i % len(markers)],
                    capsize=3, label=_row_label(r) + (f", {r.epochs:g} epochs" if lengths else "")
                    + (" (1 run)" if repeated and r.runs == 1 else ""))
    _at_least_points(ax, [v for r in ok.itertuples() for v in (
        r.final_top1 - (r.final_top1_ci if r.final_top1_ci == r.final_top1_ci else 0.0),
        r.final_top1 + (r.final_top1_ci if r.final_top1_ci == r.final_top1_ci else 0.0))])
    ax.set_xlabel("total training time (s, median over runs)")
    ax.set_ylabel("final top-1 (%, mean ± 95 % CI)" if repeated
                  else "final top-1 (%, one run per row: no CI)")
    ax.set_title("Time vs accuracy")
    if len(ok):
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figures["time_vs_accuracy"] = fig
    figures["where_time_goes"] = _where_time_goes_figure(ok)
    figures["memory"] = _memory_figure(ok)
    figures["scaling_efficiency"] = _efficiency_figure(ok)
    figures["accuracy_vs_n"] = _accuracy_vs_n_figure(ok)
    shown = _probes_of(set(ok["device"]), probes or [],
                       {n if isinstance(n, str) else None for n in ok["network"]})
    if shown:
        figures["busbw"] = _busbw_figure(shown)
    for fig in figures.values():
        fig.tight_layout()
    return figures


ACCURACY_SPAN = 5.0  # points: an accuracy axis never spans less (one test image is no chasm)


def _at_least_points(ax, values: list[float], span: float = ACCURACY_SPAN) -> None:
    """Widen a top-1 axis to at least ``span`` points around its data, within 0-100, so
    that differences of a few test images look as small as they are."""
    values = [v for v in values if v == v and math.isfinite(v)]
    if not values or max(values) - min(values) >= span:
        return
    middle = (max(values) + min(values)) / 2
    low = min(max(0.0, middle - span / 2), 100.0 - span)
    ax.set_ylim(low - 0.5, low + span + 0.5)


def _row_label(r) -> str:
    return row_label(r) + (" shared GPU" if r.gpu_shared else "")


# A line over N: the rows that differ only in N (one way of working, its options included:
# the fastest path at N=1 is not a point of plain bf16's line).
_SERIES = ["strategy", "precision", "options", "grad_accum", "gpu_shared"]


def _series_label(strategy: str, precision: str, options: str, grad_accum: int,
                  gpu_shared: bool) -> str:
    extra = [] if options == "—" else [short_options(options)]
    extra += [f"accum {grad_accum}"] * (grad_accum > 1) + ["shared GPU"] * gpu_shared
    return f"{strategy} {precision}" + (f" ({', '.join(extra)})" if extra else "")


def _time_to_target_figure(ok):
    """A bar per row: the MLPerf-scored time to target, the whisker spanning the runs that
    reached it; rows that did not converge are named with no bar."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rows = [r for r in ok.itertuples() if not math.isnan(r.time_to_target_s)]
    labels, heights, low, high = [], [], [], []
    for r in rows:
        reached = [t for t in r.run_times_to_target if not math.isinf(t)]
        score = r.time_to_target_s if not math.isinf(r.time_to_target_s) else 0.0
        lines = [r.strategy, f"N={r.world_size}", f"{r.device} {r.precision}"]
        lines += [f"accum {r.grad_accum}"] * (r.grad_accum != 1) + ["shared GPU"] * r.gpu_shared
        lines += ["(did not converge)"] * math.isinf(r.time_to_target_s)
        lines += [f"{_FLAG} flagged"] * bool(r.flags)
        labels.append("\n".join(lines))
        heights.append(score)
        low.append(score - min(reached) if reached and score else 0.0)
        high.append(max(reached) - score if reached and score else 0.0)
    ax.bar(range(len(rows)), heights, yerr=[low, high], capsize=3, color="tab:green")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    target = sorted({r.target_top1 for r in rows if r.target_top1 == r.target_top1})
    ax.set_ylabel("time to target (s, MLPerf score)")
    ax.set_title("Time to target accuracy" + (f" ({target[0]:g} % top-1)" if target else ""))
    return fig


def _where_time_goes_figure(ok):
    """A stacked bar per multi-rank row: the compute-only step (probe steps with gradient
    sync off) and what communication added on top of it (the step's median minus that)."""
    import matplotlib.pyplot as plt

    rows = [r for r in ok.itertuples() if not math.isnan(r.compute_step_s)]
    fig, ax = plt.subplots(figsize=(7, 4))
    # a compute-only probe slower than the real step (exposed communication < 0: a slowed
    # probe, flagged in the report) cannot be part of it: the bar is the measured step, and
    # the probe a mark above it
    slow_probe = [r.compute_step_s > r.step_time_s for r in rows]  # False for a NaN step
    compute = [1000 * (r.step_time_s if slow else r.compute_step_s)
               for r, slow in zip(rows, slow_probe)]
    exposed = [max(0.0, 1000 * (r.step_time_s - r.compute_step_s)) for r in rows]
    ax.bar(range(len(rows)), compute, color=["0.6" if slow else "tab:blue" for slow in slow_probe],
           label="compute (sync off)")
    ax.bar(range(len(rows)), exposed, bottom=compute, color="tab:red",
           label="exposed communication")
    above = [(i, 1000 * r.compute_step_s) for i, (r, slow) in enumerate(zip(rows, slow_probe))
             if slow]
    if above:
        ax.bar([0], [0], color="0.6", label="measured step (split unknown)")
        ax.plot(*zip(*above), "v", color="tab:red", markersize=9,
                label=f"{_FLAG} its compute-only probe, slower than the step (suspect)")
        ax.set_ylim(0, 1.3 * max([*(c + e for c, e in zip(compute, exposed)),
                                  *(y for _, y in above)]))
    ax.set_xticks(range(len(rows)), _bar_labels(rows), fontsize=7)
    ax.set_ylabel("step time (ms, median)")
    ax.set_title("Where the step time goes")
    if rows:
        ax.legend(fontsize=8)
    return fig


_MEMORY_BARS = (("mem_parameters", "parameters", "tab:blue"),
                ("mem_gradients", "gradients", "tab:orange"),
                ("mem_optimizer_state", "optimizer state", "tab:green"),
                ("mem_activations", "activations and workspace", "0.7"))


def _memory_figure(ok):
    """A stacked bar per row (strategy and N): what one rank holds, by parts (records'
    memory_parts), the peak less the interpreter's baseline in all."""
    import matplotlib.pyplot as plt

    rows = [r for r in ok.itertuples() if getattr(r, "mem_rank", math.nan) == r.mem_rank]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(rows)
    for column, label, color in _MEMORY_BARS:
        heights = [getattr(r, column) if getattr(r, column) == getattr(r, column) else 0.0
                   for r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottom, color=color, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(rows)), _bar_labels(rows), fontsize=7)
    ax.set_ylabel("memory per rank (MiB)")
    ax.set_title("What one rank holds (peak, by parts)")
    if rows:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _bar_labels(rows) -> list[str]:
    """A bar per row, named on lines: strategy, N, device and precision, what sets it apart."""
    return ["\n".join([r.strategy, f"N={r.world_size}", f"{r.device} {r.precision}",
                       *_sets_apart(r)]) for r in rows]


def _efficiency_figure(ok):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    worlds = sorted({int(n) for n in ok["world_size"]}) if len(ok) else [1]
    ax.plot(worlds, [100] * len(worlds), ":", color="grey", label="ideal (100 %)")
    for key, grp in ok.groupby(_SERIES):
        grp = grp[grp["efficiency"].notna()].sort_values("world_size")
        if len(grp):
            ax.plot(grp["world_size"], 100 * grp["efficiency"], "o-",
                    label=_series_label(*key))
            _ring_flagged(ax, list(grp.itertuples()), grp["world_size"],
                          100 * grp["efficiency"])
    ax.set_xlabel("world size N")
    ax.set_ylabel("scaling efficiency (%): speed-up / N")
    ax.set_xticks(worlds)
    ax.set_ylim(bottom=0)
    ax.set_title("Scaling efficiency")
    _legend(ax, fontsize=7)
    return fig


def _accuracy_vs_n_figure(ok):
    """Δ top-1 against the block's reference (ddp N=1) over N, a line per way of working,
    each point with its row's 95 % CI as a bar and the reference's CI as a band around 0:
    "does it cost accuracy" as the number of replicas grows."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    reference = ok[ok["is_reference"].astype(bool)] if "is_reference" in ok else ok.iloc[:0]
    worlds = sorted({int(n) for n in ok["world_size"]}) if len(ok) else [1]
    band = reference["final_top1_ci"].iloc[0] if len(reference) else math.nan
    if band == band:
        ax.axhspan(-band, band, color="0.85", label=f"reference's 95 % CI (±{band:.2f})")
    ax.axhline(0, color="grey", lw=0.8)
    series = [*_SERIES, "norm"]
    reach = [0.0, *([band, -band] if band == band else [])]  # what the axis must show
    for key, grp in ok.groupby(series, dropna=False):
        grp = grp[grp["delta_top1"].notna() | grp["is_reference"].astype(bool)]
        grp = grp.sort_values("world_size")
        if not len(grp):
            continue
        deltas = [0.0 if r.is_reference else r.delta_top1 for r in grp.itertuples()]
        cis = [0.0 if r.final_top1_ci != r.final_top1_ci else r.final_top1_ci
               for r in grp.itertuples()]
        norm = "" if key[-1] != "per-replica-bn" else ", per-replica BN"
        ax.errorbar(grp["world_size"], deltas, yerr=cis, fmt="o-", capsize=3,
                    label=_series_label(*key[:-1]) + norm)
        reach += [d + c for d, c in zip(deltas, cis)] + [d - c for d, c in zip(deltas, cis)]
    ax.set_xscale("log", base=2)
    ax.set_xticks(worlds, [str(n) for n in worlds])
    ax.set_xlabel("replicas N")
    ax.set_ylabel("Δ final top-1 vs reference (points)")
    low, high = min(reach), max(reach)
    pad = max(0.0, 2.0 - (high - low)) / 2 + 0.05 * (high - low)  # at least 2 points
    ax.set_ylim(low - pad, high + pad)
    ax.set_title("Accuracy against N (bars: each row's 95 % CI)")
    _legend(ax, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _probes_of(devices: set[str], probes: list[dict[str, Any]],
               networks: set[str | None]) -> list[dict[str, Any]]:
    """The probes a workload's figure shows: of the devices and networks it ran on (a
    probe's ``--tag`` names its network; None: untagged, the machine's own), the newest of
    each device, backend, ranks and nodes (the one its table's ceiling uses; probes come
    oldest first). A CPU probe says nothing about a GPU workload, a shaped link's nothing
    about loopback, and an older probe of the same kind would be a second line with the
    same label."""
    from bench.records.probes import probe_kind

    newest = {probe_kind(p): p for p in probes
              if p.get("device") in devices and (p.get("tag") or None) in networks}
    return list(newest.values())


def _busbw_figure(probes: list[dict[str, Any]]):
    """Bus bandwidth against message size, one line per probe (device, backend, N)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for probe in probes:
        rows = probe["results"]
        nodes = probe.get("nodes") or 1
        ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-",
                label=f"{probe['device']} {probe['backend']} N={probe['world_size']}"
                      + (f", {nodes} nodes" if nodes > 1 else ""))
        ax.axvline(probe["gradient_bytes"], color="grey", linestyle=":")
    models = {probe.get("model") for probe in probes}
    model = models.pop() if len(models) == 1 else None
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"message size (bytes; dotted: one {model or 'model'} gradient)")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
    ax.set_title("All-reduce ceiling (bench probe)")
    ax.legend(fontsize=7)
    return fig


def workload_slug(name: str) -> str:
    """A folder name for a workload: 'synthetic d=1 50000 img, batch 512, resnet18' ->
    'synthetic-d1-50000img-batch512-resnet18'."""
    text = name.replace("=", "").replace(" img", "img").replace("batch ", "batch")
    return "-".join(re.findall(r"[A-Za-z0-9.]+", text)).replace(".", "_")


# The figures of times, which an accuracy block (ranks oversubscribing the cores) leaves out.
_TIME_FIGURES = ("epoch_time", "scaling", "time_to_target", "time_vs_accuracy",
                 "where_time_goes", "scaling_efficiency")


def figures_per_workload(records: list[dict[str, Any]],
                         probes: list[dict[str, Any]] | None = None
                         ) -> dict[str, dict[str, Any]]:
    """make_figures for each workload's records alone (runs of different workloads are never
    drawn together), keeping only figures that show data."""
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_workload.setdefault(workload(rec), []).append(rec)
    import matplotlib.pyplot as plt

    out = {}
    for name, recs in by_workload.items():
        figures = {}
        table = summary_table(recs, probes=probes)
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
        for key, fig in make_figures(recs, probes, table).items():
            if shows.get(key, True) and any(ax.has_data() for ax in fig.axes):
                fig.text(0.005, 0.005, f"workload: {name}", fontsize=7, color="0.4")
                figures[key] = fig
            else:  # e.g. time to target when no run set a target
                plt.close(fig)
        out[name] = figures
    return out


def write_plots(records: list[dict[str, Any]], folder: Path,
                probes: list[dict[str, Any]] | None = None) -> list[Path]:
    """Every figure with data, per workload: ``folder/<workload>/<name>.{png,svg}``. Each
    file is written aside and renamed into place (bench.records.files.atomic_file), then the plots
    of an earlier report that this one did not draw are removed: a report killed while it
    draws, or two reports of one folder at once, leave whole files, never cut ones (the
    temporary files of a report killed mid-draw go with the next: bench report's start)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["figure.max_open_warning"] = 0  # closed once written
    matplotlib.rcParams["svg.hashsalt"] = "parallel-bench"  # same figure, same file
    written: list[Path] = []
    for name, figures in figures_per_workload(records, probes).items():
        sub = folder / workload_slug(name)
        for key, fig in figures.items():
            for ext in ("png", "svg"):
                path = sub / f"{key}.{ext}"
                with atomic_file(path) as tmp:
                    fig.savefig(tmp, dpi=120, format=ext,
                                metadata={"Date": None} if ext == "svg" else None)
                written.append(path)
            plt.close(fig)
    kept = set(written)
    for old in [*folder.glob("*.png"), *folder.glob("*.svg"), *folder.glob("*/*.png"),
                *folder.glob("*/*.svg")]:
        if old not in kept:
            old.unlink(missing_ok=True)
    for empty in folder.iterdir() if folder.is_dir() else []:
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()
    return written
