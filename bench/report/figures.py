"""The report's figures beyond time and accuracy against N: time to target, where the time
of a step goes, memory per rank by parts, scaling efficiency, accuracy against N and the
probed bus bandwidth; each takes a workload's ok rows and returns a figure, or None when
it has nothing to show."""

from __future__ import annotations

import math
from typing import Any

from bench.report.flags import EXPOSED_COMM_NOISE
from bench.report.plot_labels import (
    FLAG,
    SERIES,
    legend,
    line_label,
    n_label,
    ring_flagged,
    series_label,
    sets_apart,
)
from bench.tools.plot_style import line_look
from bench.tools.terminal import message_size, wrapped_cell


def time_to_target_figure(ok):
    """A bar per row: the MLPerf-scored time to target, the whisker spanning the runs that
    reached it where two or more did (one run has no spread to draw: its zero-length
    whisker's caps sat on every bar of the committed one-run table like a tight interval);
    rows that did not converge are named with no bar."""
    import matplotlib.pyplot as plt

    rows = [r for r in ok.itertuples() if not math.isnan(r.time_to_target_s)]
    fig, ax = plt.subplots(figsize=(bars_width(len(rows)), 4))
    labels, heights, whiskers = [], [], []  # whiskers: (bar, below, above)
    for i, r in enumerate(rows):
        reached = [t for t in r.run_times_to_target if not math.isinf(t)]
        score = r.time_to_target_s if not math.isinf(r.time_to_target_s) else 0.0
        lines = [r.strategy, n_label(r), f"{r.device} {r.precision}"]
        lines += narrow([part for part in sets_apart(r) if part != FLAG])
        lines += ["shared GPU"] * r.gpu_shared
        lines += ["(did not converge)"] * math.isinf(r.time_to_target_s)
        lines += [f"{FLAG} flagged"] * bool(r.flags)
        labels.append("\n".join(lines))
        heights.append(score)
        if len(reached) > 1 and score:
            whiskers.append((i, score - min(reached), max(reached) - score))
    ax.bar(range(len(rows)), heights, color="tab:green")
    if whiskers:
        bars, below, above = zip(*whiskers)
        ax.errorbar(bars, [heights[i] for i in bars], yerr=[below, above], fmt="none",
                    ecolor="black", capsize=3)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    target = sorted({r.target_top1 for r in rows if r.target_top1 == r.target_top1})
    ax.set_ylabel("time to target (s, MLPerf score)")
    ax.set_title("Time to target accuracy" + (f" ({target[0]:g} % top-1)" if target else ""))
    return fig


def where_time_goes_figure(ok):
    """A stacked bar per multi-rank row: the compute-only step (probe steps with gradient
    sync off) and what communication added on top of it (the step's median minus that)."""
    import matplotlib.pyplot as plt

    rows = [r for r in ok.itertuples() if not math.isnan(r.compute_step_s)]
    fig, ax = plt.subplots(figsize=(bars_width(len(rows)), 4))
    # a compute-only probe slower than the real step beyond noise (exposed communication
    # below -10 %, 1 - compute / step: a slowed probe, flagged in the report; False for a
    # NaN step) cannot be part of it: the bar is the measured step, and the probe a mark
    # above it. Within noise the compute is the step, as the report reads it (a row at
    # -7 % was marked suspect here, not there).
    slow_probe = [r.compute_step_s > r.step_time_s * (1 + EXPOSED_COMM_NOISE) for r in rows]
    compute = [1000 * min(r.compute_step_s, r.step_time_s) for r in rows]
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
                label=f"{FLAG} its compute-only probe, slower than the step (suspect)")
        ax.set_ylim(0, 1.3 * max([*(c + e for c, e in zip(compute, exposed)),
                                  *(y for _, y in above)]))
    ax.set_xticks(range(len(rows)), bar_labels(rows), fontsize=7)
    ax.set_ylabel("step time (ms, median)")
    ax.set_title("Where the step time goes")
    if rows:  # beside the bars, as the memory figure's: inside, it covered a lone bar's top
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


MEMORY_BARS = (("mem_parameters", "parameters", "tab:blue"),
                ("mem_gradients", "gradients", "tab:orange"),
                ("mem_optimizer_state", "optimizer state", "tab:green"),
                ("mem_activations", "activations and workspace", "0.7"))


def memory_figure(ok):
    """A stacked bar per row (strategy and N): what one rank holds, by parts (records'
    memory_parts), the peak less the interpreter's baseline in all."""
    import matplotlib.pyplot as plt

    rows = [r for r in ok.itertuples() if getattr(r, "mem_rank", math.nan) == r.mem_rank]
    fig, ax = plt.subplots(figsize=(bars_width(len(rows)), 4))
    bottom = [0.0] * len(rows)
    for column, label, color in MEMORY_BARS:
        heights = [getattr(r, column) if getattr(r, column) == getattr(r, column) else 0.0
                   for r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottom, color=color, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(rows)), bar_labels(rows), fontsize=7)
    ax.set_ylabel("memory per rank (MiB)")
    ax.set_title("What one rank holds (peak, by parts)")
    if rows:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def bars_width(bars: int) -> float:
    """Inches for a figure of ``bars`` named bars: 7, or about an inch a bar where more
    need it (eight bars in 7 inches ran 'fp16 hook' into 'powersgd hook r=1')."""
    return max(7.0, 1.05 * bars + 1.2)


BAR_LABEL_CHARACTERS = 14  # a line of a bar's name at 7 points: under its inch of figure


def bar_labels(rows) -> list[str]:
    """A bar per row, named on lines: strategy, N, device and precision, what sets it apart,
    its options broken after a comma where they pass the bar's width ('bucket
    view,powersgd hook r=1' ran into the next bar's name)."""
    return ["\n".join([r.strategy, n_label(r), f"{r.device} {r.precision}",
                       *narrow(sets_apart(r))]) for r in rows]


def narrow(parts: list[str]) -> list[str]:
    """Each part on lines of at most BAR_LABEL_CHARACTERS, broken after its commas."""
    return [line for part in parts for line in wrapped_cell(part, BAR_LABEL_CHARACTERS)]


def efficiency_figure(ok):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    worlds = sorted({int(n) for n in ok["world_size"]}) if len(ok) else [1]
    ax.plot(worlds, [100] * len(worlds), ":", color="grey", label="ideal (100 %)")
    drawn = 0
    for key, grp in ok.groupby(SERIES):
        grp = grp[grp["efficiency"].notna()].sort_values("world_size")
        if len(grp):
            ax.plot(grp["world_size"], 100 * grp["efficiency"], label=line_label(key, ok),
                    **line_look(drawn))
            drawn += 1
            ring_flagged(ax, list(grp.itertuples()), grp["world_size"],
                          100 * grp["efficiency"])
    ax.set_xlabel("world size N")
    ax.set_ylabel("scaling efficiency (%): speed-up / N")
    ax.set_xticks(worlds)
    ax.set_ylim(bottom=0)
    ax.set_title("Scaling efficiency")
    legend(ax, fontsize=7)
    return fig


SYMLOG_SPAN = 8.0  # points: an accuracy-against-N axis wider than this goes symmetric-log


def accuracy_vs_n_figure(ok):
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
    series = [*SERIES, "norm"]
    reach = [0.0, *([band, -band] if band == band else [])]  # what the axis must show
    judged = ok[ok["delta_top1"].notna() | ok["is_reference"].astype(bool)]
    groups = [(key, grp.sort_values("world_size"))
              for key, grp in judged.groupby(series, dropna=False)]
    # an option every line shares (the block's learning rate) is said once, not per line
    shared = set.intersection(*[set(str(key[2]).split(", ")) for key, _ in groups]) \
        if groups else set()
    shared.discard("—")
    for i, (key, grp) in enumerate(groups):
        deltas = [0.0 if r.is_reference else r.delta_top1 for r in grp.itertuples()]
        cis = [0.0 if r.final_top1_ci != r.final_top1_ci else r.final_top1_ci
               for r in grp.itertuples()]
        norm = "" if key[-1] != "per-replica-bn" else ", per-replica BN"
        options = ", ".join(o for o in str(key[2]).split(", ") if o not in shared) or "—"
        # lines side by side around each N, so that points and bars at one N do not hide
        # one another (a factor on the log axis)
        dodge = 2 ** (0.035 * (i - (len(groups) - 1) / 2))
        # its epochs where a line alike but for them ran another number
        lengths = {k[-2] for k, _ in groups if (k[:-2], k[-1]) == (key[:-2], key[-1])}
        ax.errorbar(grp["world_size"] * dodge, deltas, yerr=cis, fmt="o-", capsize=3,
                    markersize=4, label=series_label(
                        key[0], key[1], options, *key[3:-2],
                        epochs=key[-2] if len(lengths) > 1 else None) + norm)
        reach += [d + c for d, c in zip(deltas, cis)] + [d - c for d, c in zip(deltas, cis)]
    ax.set_xscale("log", base=2)
    ax.set_xticks(worlds, [str(n) for n in worlds])
    ax.set_xlabel("replicas N")
    low, high = min(reach), max(reach)
    linthresh = max(1.0, 2 * band) if band == band else 1.0
    if high - low > max(SYMLOG_SPAN, 4 * linthresh):  # a row far off the others: linear
        # within ±linthresh, log beyond, so that the rest stay legible
        ax.set_yscale("symlog", linthresh=linthresh, linscale=1.5)
        ax.set_ylabel(f"Δ final top-1 vs reference (points;\nlinear within ±{linthresh:.2g}, "
                      "log beyond)")
        bottom, top = (low * 1.3 if low < 0 else -linthresh,
                       high * 1.3 if high > 0 else linthresh)
        ax.set_ylim(bottom, top)
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

        # inside the linear part 0 and ±1; beyond it steps of about 2x, none so close to
        # the bend that its label meets ±1's
        steps = (5, 10, 20, 40, 80)
        ticks = [t for t in (*(-v for v in steps), -1, 0, 1, *steps)
                 if bottom <= t <= top and (abs(t) <= 1 or abs(t) >= 2.5 * linthresh)]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:+g}" if v else "0"))
    else:
        ax.set_ylabel("Δ final top-1 vs reference (points)")
        pad = max(0.0, 2.0 - (high - low)) / 2 + 0.05 * (high - low)  # at least 2 points
        ax.set_ylim(low - pad, high + pad)
    ax.set_title("Accuracy against N (bars: each row's 95 % CI)")
    legend(ax, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5),
           title=f"every line: {', '.join(sorted(shared))}" if shared else None,
           title_fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def probes_of(devices: set[str], probes: list[dict[str, Any]],
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


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def plain_powers(axis) -> None:
    """A base-2 log axis labelled 2¹¹ in plain text: matplotlib's own labels are formulas,
    which the report's figures do not parse (a record's '$' is text: plot_style.PLAIN_TEXT)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def label(value: float, _) -> str:
        power = math.log2(value) if value > 0 else math.nan
        whole = math.isfinite(power) and power == round(power)
        return f"2{str(round(power)).translate(_SUPERSCRIPT)}" if whole else ""

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(NullFormatter())


def busbw_figure(probes: list[dict[str, Any]], gradients: list[int] | None = None):
    """Bus bandwidth against message size, one line per probe (device, backend, N), and
    dotted where the workload's step all-reduces (``gradients``: the bytes its rows send,
    in the precision they send them). The probe's own model was drawn instead: the
    committed ResNet-18 x0.125 workload's figure marked the full model's 42.8 MiB, where
    its runs send 0.7 MiB. Without the workload's sizes (records without a parameter
    count), the probe's model's gradient is marked and named."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for probe in probes:
        rows = probe["results"]
        nodes = probe.get("nodes") or 1
        ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-",
                label=f"{probe['device']} {probe['backend']} N={probe['world_size']}"
                      + (f", {nodes} nodes" if nodes > 1 else ""))
    if gradients:
        sizes = sorted(gradients)
        label = "this workload's gradient, as sent: " + ", ".join(map(message_size, sizes))
    else:
        sizes = sorted({probe["gradient_bytes"] for probe in probes})
        models = {probe.get("model") for probe in probes}
        label = f"one {models.pop() if len(models) == 1 else 'model'} gradient"
    for i, size in enumerate(sizes):
        ax.axvline(size, color="grey", linestyle=":", label=None if i else label)
    ax.set_xscale("log", base=2)
    plain_powers(ax.xaxis)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
    ax.set_title("All-reduce ceiling (bench probe)")
    ax.legend(fontsize=7)
    return fig
