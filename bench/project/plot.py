"""`bench project --plot FILE`: efficiency against GPU count (log scale), one panel per
workload, the projection as a line per strategy and the measured runs as points over it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from bench.project.from_records import run_options, series_key, workload_of
from bench.project.scaling import Network, Workload, project
from bench.records.describe import median_step_s, workload
from bench.records.files import atomic_file
from bench.tools.plot_style import PLAIN_TEXT, line_look


def curve_gpus(asked: list[int]) -> list[int]:
    """Powers of two from 1 to the largest count asked, and the counts asked."""
    top = max(asked)
    return sorted({2**k for k in range(int(math.log2(top)) + 1)} | set(asked))


def measured_efficiency(rec: dict[str, Any]) -> float | None:
    """A multi-rank run's compute-only step over its step: the projection's efficiency,
    measured."""
    compute, step = rec.get("compute_step_s"), median_step_s(rec)
    if not isinstance(compute, (int, float)) or not step or math.isnan(step):
        return None
    return compute / step


def write_projection_plot(path: Path, chosen: list[tuple[dict, Workload]],
                          records: list[dict[str, Any]], asked: list[int], gpus_per_node: int,
                          net_of: Callable[[dict[str, Any]], Network]) -> None:
    """Efficiency against GPUs, a panel per workload: the projection of each series as a
    line (over the network ``net_of(record)`` gives its run: a panel is one machine's), the
    measured runs of the same series as points."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "parallel-bench"
    with matplotlib.rc_context(PLAIN_TEXT):  # a record's '$' is text
        _draw_projection(path, chosen, records, asked, gpus_per_node, net_of)


def _draw_projection(path: Path, chosen: list[tuple[dict, Workload]],
                     records: list[dict[str, Any]], asked: list[int], gpus_per_node: int,
                     net_of: Callable[[dict[str, Any]], Network]) -> None:
    import matplotlib.pyplot as plt

    panels: dict[str, list[tuple[dict, Workload]]] = {}
    for rec, work in chosen:
        if work.strategy != "dp":  # one process: nothing to project
            panels.setdefault(workload(rec), []).append((rec, work))
    if not panels:
        return
    measured: dict[tuple, list[tuple[int, float]]] = {}  # series_key -> (N, efficiency)
    for r in records:
        if r.get("status") != "ok" or (r.get("world_size") or 1) < 2:
            continue
        w, efficiency = workload_of(r), measured_efficiency(r)
        if w is not None and efficiency is not None:
            measured.setdefault(series_key(r, w), []).append((r["world_size"], efficiency))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 4.2 * len(panels)), squeeze=False)
    xs = curve_gpus(asked)
    for ax, (name, runs) in zip(axes[:, 0], panels.items()):
        lowest = 100.0
        points = False
        for index, (rec, work) in enumerate(runs):
            look = line_look(index)  # past ten lines, dashed: not the first's twin
            color = look["color"]
            options = run_options(rec, work)
            label = " ".join([work.strategy, str(rec.get("precision")),
                              *([] if options == "—" else [options])])
            ys = [100 * project(work, n, gpus_per_node, net_of(rec)).efficiency for n in xs]
            lowest = min(lowest, *ys)
            ax.plot(xs, ys, color=color, linestyle=look["linestyle"],
                    label=f"{label}: projected")
            seen = measured.get(series_key(rec, work), [])
            if seen:
                points = True
                lowest = min(lowest, *(100 * e for _, e in seen))
                ax.plot(*zip(*[(n, 100 * e) for n, e in seen]), "o", color=color,
                        markeredgecolor="black", label=f"{label}: measured")
        ax.axhline(100, linestyle=":", color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(n) for n in xs], fontsize=7)
        ax.set_ylim(max(0.0, 10 * math.floor(lowest / 10) - 10), 102)
        ax.set_xlabel(f"GPUs ({gpus_per_node} per node)")
        ax.set_ylabel("efficiency: compute step / step (%)")
        ax.set_title(f"{name}\nprojected on {net_of(runs[0][0]).name} (lines)"
                     + (", measured (points)" if points else "; no measured efficiency to draw"),
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png",
                    metadata={"Date": None} if path.suffix == ".svg" else None)
    plt.close(fig)
