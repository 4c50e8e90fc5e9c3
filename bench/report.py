"""``bench report``: records -> one table (CSV, Markdown) and plots. Separate from running."""

from __future__ import annotations

import functools
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.errors import EXIT_FAILED, ConfigError
from bench.record import current_status
from bench.results import load_records, runs_dir, summarise_epochs, write_text_atomic
from bench.stats import mean_ci, welch

# gpus_requested keeps `dp --gpus 2 --cpu` (one replica, by necessity) apart from --gpus 1.
# gpu_shared keeps runs whose ranks shared GPUs (--backend gloo) apart: their timing is not
# comparable with anything.
# options keeps runs with other speed options (GPU loader, channels_last, compile, fused SGD)
# apart: the same strategy doing the work another way is another row, never a repeat.
GROUP_KEYS = ["workload", "strategy", "device", "world_size", "gpus_requested", "precision",
              "options", "grad_accum", "gpu_shared"]
COLUMNS = [
    ("workload", "workload"),
    ("strategy", "strategy"),
    ("device", "device"),
    ("world_size", "N"),
    ("processes", "procs"),
    ("precision", "precision"),
    ("options", "options"),
    ("grad_accum", "accum"),
    ("norm", "norm"),
    ("same_start", "same start"),
    ("runs", "runs"),
    ("epoch_time_s", "epoch time (s, median)"),
    ("epoch_time_spread_s", "spread (s, max-min)"),
    ("images_per_s", "img/s"),
    ("speedup", "speed-up vs N=1"),
    ("efficiency", "scaling eff."),
    ("time_to_target", "time to target (s)"),
    ("final_top1", "final top-1 (%, mean ± 95% CI)"),
    ("best_top1", "best top-1 (%)"),
    ("delta_top1", "Δ top-1 vs ref (Welch p)"),
    ("peak_mem_mib", "peak mem (MiB)"),
    ("exposed_comm", "exposed comm (%)"),
    ("mfu", "MFU (%)"),
    ("comm_ceiling", "ideal all-reduce / step (ms)"),
    ("status", "status"),
]


def _number(value: float | None) -> float:
    return math.nan if value is None else value


COLUMN_INDEX = {c: i for i, (c, _) in enumerate(COLUMNS)}
# The terminal view: what answers "which is fastest, and does it cost accuracy", one block
# per workload, in at most 120 columns; `--format wide`, the CSV and the markdown have all.
TERMINAL_COLUMNS = [
    ("strategy", "strategy"), ("device", "dev"), ("world_size", "N"),
    ("precision", "prec."), ("options", "options"), ("runs", "runs"),
    ("epoch_time_s", "epoch s"), ("images_per_s", "img/s"), ("speedup", "speed-up"),
    ("efficiency", "eff."), ("final_top1", "top-1 %"), ("delta_top1", "Δ top-1 (p)"),
    ("same_start", "start"), ("status", "status"),
]
# Columns said once in a block's heading when every row has the same value: name -> label.
_SAID_ONCE = {"dev": "", "N": "N =", "runs": "runs", "speed-up": "speed-up", "eff.": "eff.",
              "start": "same start", "options": "options"}
_SHORT_OPTIONS = {"gpu loader": "gpu-data", "channels_last": "NHWC", " SGD": "", ", ": ","}


def mlperf_seconds(times: list[float]) -> tuple[float, int]:
    """The MLPerf score of times to target (inf: did not converge) and the runs that missed
    (their time is inf). See ``mlperf_score``."""
    if not times:
        return math.nan, 0
    missed = sum(math.isinf(t) for t in times)
    score = (statistics.fmean(sorted(times)[1:-1]) if len(times) >= 5
             else statistics.median(times))
    return (math.inf if missed > 1 else score), missed


def mlperf_score(times: list[float], targets: list[float | None]) -> str | None:
    """Time to target over repeats, scored as MLPerf Training does: with 5 or more runs drop
    the fastest and the slowest and average the rest; at most one run may miss the target
    (its time is infinite, so it is the slowest). Fewer runs: the median, marked."""
    if not times or all(t is None or (isinstance(t, float) and math.isnan(t)) for t in targets):
        return None
    if len({t for t in targets}) > 1:
        return "mixed targets"
    target = targets[0]
    score, missed = mlperf_seconds(times)
    if math.isinf(score):
        return f"did not converge ({missed}/{len(times)} missed {target:g} %)"
    how = f"MLPerf, {len(times)} runs" if len(times) >= 5 else f"median of {len(times)}"
    return f"{score:.2f} ({how}{f', {missed} missed' if missed else ''})"


def _median(values: list[float]) -> float:
    """Median of the values that exist (NaN when none do)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def workload(rec: dict[str, Any]) -> str:
    """What was trained: only runs of the same workload are compared with each other."""
    width = (rec.get("model") or rec.get("config") or {}).get("width", 1.0)
    model = "resnet18" if width == 1.0 else f"resnet18 x{width:g}"
    config = rec.get("config") or {}
    size = rec.get("train_size") or config.get("train_limit") or 50_000
    data = rec.get("dataset") or config.get("data")
    if data == "synthetic" and config.get("synthetic_difficulty"):
        data += f" d={config['synthetic_difficulty']:g}"
    return f"{data} {size} img, batch {rec.get('global_batch')}, {model}"


def speed_options(rec: dict[str, Any]) -> str:
    """The run's speed options that change how (not what) it computes, "—" for none."""
    chosen = []
    if rec.get("loader") == "gpu":
        chosen.append("gpu loader")
    if rec.get("channels_last"):
        chosen.append("channels_last")
    if rec.get("compile"):
        chosen.append("compile")
    if rec.get("optimizer_impl") not in (None, "default"):
        chosen.append(f"{rec['optimizer_impl']} SGD")
    return ", ".join(chosen) or "—"


@functools.cache
def _reference_start(seed: int, width: float) -> str:
    from bench.model import initial_params_sha1

    return initial_params_sha1(seed, width)


def same_start(rec: dict[str, Any]) -> bool | None:
    """Whether the run started from the weights its seed and width define (rank 0's
    parameters before step 1, every rank alike); None for records without the fingerprint."""
    sha1 = rec.get("initial_param_fingerprint")
    if not sha1:
        return None
    width = (rec.get("model") or {}).get("width", 1.0)
    agreed = rec.get("initial_replicas_identical") is not False
    return agreed and sha1 == _reference_start(int(rec.get("seed", 0)), float(width))


def _all_same_start(values) -> str | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return "✓" if all(known) and len(known) == len(values) else "✗"


def run_rows(records: list[dict[str, Any]]):
    """One row per record; epoch times exclude the first (warm-up) epoch."""
    import pandas as pd

    rows = []
    for rec in records:
        status, error = current_status(rec)
        epochs = rec.get("per_epoch") or []
        figures = summarise_epochs(epochs)  # the one definition of "median excl. warm-up"
        rows.append(
            {
                "run_id": rec.get("run_id"),
                "strategy": rec.get("strategy"),
                "device": rec.get("device"),
                "world_size": rec.get("world_size"),
                "gpus_requested": rec.get("gpus_requested", rec.get("world_size")),
                "gpu_shared": bool(rec.get("gpu_shared")),
                "processes": rec.get("processes"),
                "precision": rec.get("precision"),
                "grad_accum": rec.get("grad_accum", 1),
                "options": speed_options(rec),
                "norm": rec.get("norm"),
                "same_start": same_start(rec),
                "status": status,
                "error": error,
                "dataset": rec.get("dataset"),
                "width": (rec.get("model") or {}).get("width"),
                "workload": workload(rec),
                "epochs_done": len(epochs),
                "epoch_time_s": _number(figures.get("median_epoch_time_s")),
                "images_per_s": _number(figures.get("median_images_per_s")),
                "final_top1": 100 * figures.get("final_top1", math.nan),
                "best_top1": 100 * figures.get("best_top1", math.nan),
                "total_train_time_s": figures.get("total_train_time_s", 0.0),
                "target_top1": rec.get("target_top1"),
                "time_to_target_s": (rec.get("time_to_target_s") if rec.get("reached_target")
                                     else math.inf),
                "peak_mem_mib": figures.get("peak_mem_bytes", math.nan) / 2**20,
                "exposed_comm": _number(rec.get("exposed_comm_fraction")),
                "compute_step_s": _number(rec.get("compute_step_s")),
                "mfu": _median([_number(e.get("mfu")) for e in epochs[1:] or epochs]),
                "step_time_s": _median([_number(e.get("step_time_p50_s"))
                                        for e in epochs[1:] or epochs]),
                "gradient_bytes": 4 * ((rec.get("model") or {}).get("parameters") or 0),
                "backend": rec.get("backend"),
            }
        )
    return pd.DataFrame(rows)


def summary_table(records: list[dict[str, Any]], reference: str = "ddp:1",
                  probes: list[dict[str, Any]] | None = None):
    """One row per strategy x device x N x precision; repeats aggregated by their median
    (speed) or their mean with a 95 % confidence interval (accuracy), and each row's final
    top-1 compared with the reference row of its workload (``strategy:N``) by Welch's t-test.
    Failed and unavailable runs stay in the table with their reason."""
    import pandas as pd

    runs = run_rows(records)
    if runs.empty:
        return pd.DataFrame(columns=[c for c, _ in COLUMNS] + ["error"])
    out = []
    for key, group in runs.groupby(GROUP_KEYS, dropna=False, sort=True):
        ok = group[group["status"] == "ok"]
        use = ok if len(ok) else group
        row = dict(zip(GROUP_KEYS, key))
        times = [t for t in ok["epoch_time_s"] if not math.isnan(t)]
        final_top1, final_top1_ci = mean_ci(list(ok["final_top1"]))
        row.update(
            processes=use["processes"].iloc[-1],
            norm=use["norm"].iloc[-1],
            same_start=_all_same_start(list(ok["same_start"])),
            runs=len(ok),
            failed_runs=len(group) - len(ok),
            epoch_time_s=_median(list(ok["epoch_time_s"])),
            epoch_time_spread_s=(max(times) - min(times)) if len(times) > 1 else math.nan,
            images_per_s=_median(list(ok["images_per_s"])),
            final_top1=final_top1,
            final_top1_ci=final_top1_ci,
            best_top1=mean_ci(list(ok["best_top1"]))[0],
            finals=list(ok["final_top1"]),
            peak_mem_mib=_median(list(ok["peak_mem_mib"])),
            time_to_target=mlperf_score(list(ok["time_to_target_s"]), list(ok["target_top1"])),
            time_to_target_s=(mlperf_seconds(list(ok["time_to_target_s"]))[0]
                              if ok["target_top1"].notna().any() else math.nan),
            run_images_per_s=list(ok["images_per_s"]),
            run_times_to_target=list(ok["time_to_target_s"]),
            total_train_time_s=_median(list(ok["total_train_time_s"])),
            target_top1=use["target_top1"].iloc[-1],
            exposed_comm=_median(list(ok["exposed_comm"])),
            compute_step_s=_median(list(ok["compute_step_s"])),
            mfu=_median(list(ok["mfu"])),
            step_time_s=_median(list(ok["step_time_s"])),
            comm_ceiling=comm_ceiling(probes or [], use.iloc[-1]),
            status="ok" if len(ok) else group["status"].iloc[-1],
            error=None if len(ok) else group["error"].iloc[-1],
            dataset=use["dataset"].iloc[-1],
            width=use["width"].iloc[-1],
        )
        out.append(row)
    table = pd.DataFrame(out)
    def family(r) -> tuple:
        return (r.workload, r.strategy, r.device, r.precision, r.options, r.grad_accum)

    base = {family(r): r.images_per_s for r in table.itertuples()
            if r.world_size == 1 and r.gpus_requested == 1 and r.status == "ok"
            and not r.gpu_shared}
    table["speedup"] = [
        r.images_per_s / base[family(r)]
        if family(r) in base and r.status == "ok" and not r.gpu_shared else math.nan
        for r in table.itertuples()
    ]
    table["efficiency"] = table["speedup"] / table["world_size"]
    table = add_parity(table, reference)
    import strategies

    order = {name: i for i, name in enumerate(strategies.names())}
    table["_order"] = [order.get(name, len(order)) for name in table["strategy"]]
    table["_cpu"] = table["device"] != "cuda"  # GPU rows first
    table = table.sort_values(["_cpu", "workload", "_order", "world_size", "precision",
                               "options"])
    return table.drop(columns=["_order", "_cpu"]).reset_index(drop=True)


def comm_ceiling(probes: list[dict[str, Any]], run) -> str | None:
    """The ideal time to all-reduce this row's gradient (from the newest ``bench probe`` of
    the same device, backend and world size) beside the measured step."""
    from bench.probe import ideal_allreduce_s

    match = [p for p in probes if (p.get("device"), p.get("backend"), p.get("world_size"))
             == (run["device"], run["backend"], run["world_size"])]
    if not match or not run["gradient_bytes"] or run["world_size"] < 2:
        return None
    ideal = ideal_allreduce_s(match[-1], run["gradient_bytes"])
    step = run["step_time_s"]
    return f"{1000 * ideal:.1f} / {1000 * step:.1f}" if not math.isnan(step) else (
        f"{1000 * ideal:.1f} / —")


def parse_reference(text: str) -> tuple[str, int]:
    """``strategy[:N]`` (N default 1) -> (strategy, N)."""
    name, _, world = text.partition(":")
    try:
        return name, int(world or 1)
    except ValueError:
        raise ConfigError(f"--reference must be STRATEGY[:N], e.g. ddp:1 (got {text!r})") from None


def add_parity(table, reference: str):
    """Δ final top-1 (mean) against the reference row of the same workload and device, and
    Welch's p-value over the repeats. The reference row is the strategy at N replicas on its
    own GPUs, fp32 where it exists (else tf32, else the first precision)."""
    name, world = parse_reference(reference)
    refs: dict[tuple, Any] = {}
    for r in table.itertuples():
        if (r.strategy, r.world_size, r.gpu_shared, r.status) != (name, world, False, "ok"):
            continue
        rank = {"fp32": 0, "tf32": 1}.get(r.precision, 2)
        key = (r.workload, r.device)
        if key not in refs or rank < refs[key][0]:
            refs[key] = (rank, r.Index, r.finals)
    deltas, pvalues, is_ref = [], [], []
    for r in table.itertuples():
        found = refs.get((r.workload, r.device))
        if found is None or r.status != "ok":
            deltas.append(math.nan), pvalues.append(math.nan), is_ref.append(False)
            continue
        diff, p = welch(r.finals, found[2])
        deltas.append(diff), pvalues.append(p), is_ref.append(r.Index == found[1])
    table["delta_top1"], table["p_value"], table["is_reference"] = deltas, pvalues, is_ref
    table["differs"] = [p < 0.05 for p in pvalues]
    return table


def _parity_cell(r: dict) -> str:
    if r.get("is_reference"):
        return "ref"
    delta, p = r.get("delta_top1", math.nan), r.get("p_value", math.nan)
    if delta is None or math.isnan(delta):
        return "—"
    if math.isnan(p):
        return f"{delta:+.2f} (p —)"
    return f"{delta:+.2f} (p {p:.2g}){' ≠' if p < 0.05 else ''}"


def _fmt(value: Any, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if column in ("epoch_time_s", "epoch_time_spread_s"):
        return f"{value:.2f}"
    if column in ("images_per_s", "peak_mem_mib"):
        return f"{value:.0f}"
    if column in ("speedup",):
        return f"{value:.2f}×"
    if column == "efficiency":
        return f"{100 * value:.0f} %"
    if column in ("exposed_comm", "mfu"):
        return f"{100 * value:.1f}"
    if column in ("final_top1", "best_top1"):
        return f"{value:.2f}"
    return str(value)


def _cells(table) -> list[list[str]]:
    rows = []
    for r in table.to_dict("records"):
        cells = [_fmt(r.get(c), c) for c, _ in COLUMNS]
        ci = r.get("final_top1_ci", math.nan)
        if ci is not None and not math.isnan(ci):
            cells[COLUMN_INDEX["final_top1"]] += f" ± {ci:.2f}"
        cells[COLUMN_INDEX["delta_top1"]] = _parity_cell(r)
        if r.get("gpus_requested") not in (None, r.get("world_size")):
            cells[COLUMN_INDEX["world_size"]] += f" (of {r['gpus_requested']} asked)"
        if r.get("status") == "ok" and math.isnan(r.get("epoch_time_s", math.nan)):
            cells[COLUMN_INDEX["epoch_time_s"]] = "— (1 epoch: warm-up only)"
        if r.get("gpu_shared"):
            cells[COLUMN_INDEX["epoch_time_s"]] += " (ranks shared GPUs: not comparable)"
        if r.get("status") == "ok" and r.get("failed_runs"):
            cells[COLUMN_INDEX["runs"]] += f" (+{r['failed_runs']} not ok)"
        if r.get("status") != "ok" and r.get("error"):
            reason = str(r["error"]).split("; build")[0]  # the fix is in the record and CSV
            reason = reason if len(reason) <= 110 else reason[:107] + "..."
            cells[-1] = f"{r['status']}: {reason}"
        rows.append(cells)
    return rows


def to_markdown(table) -> str:
    header = [h for _, h in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in _cells(table)]
    return "\n".join(lines) + "\n"


def plausibility_warnings(table, records: list[dict[str, Any]]) -> list[str]:
    """Figures that cannot be right as measured, each named with the likely cause."""
    lines = []
    for r in table.itertuples():
        if r.status == "ok" and r.efficiency == r.efficiency and r.efficiency > 1.05:
            lines.append(f"{r.strategy} N={r.world_size} ({r.workload}): scaling efficiency "
                         f"{100 * r.efficiency:.0f} % is above 100 %, which no data-parallel "
                         "run reaches: the N=1 run was slowed (a loaded machine?); rerun both")
    crowded = set()
    for rec in records:
        over = rec.get("oversubscribed")
        if isinstance(over, dict) and all(isinstance(over.get(k), int)
                                          for k in ("processes", "cores")):
            crowded.add((rec["strategy"], rec["world_size"], workload(rec),
                         over["processes"], over["cores"]))
    for strategy, world, name, procs, cores in sorted(crowded):
        lines.append(f"{strategy} N={world} ({name}) ran {procs} CPU processes on {cores} "
                     "cores: its times say little about scaling")
    return lines


def to_wide_text(table) -> str:
    """Every column, one line per row (wide: for a wide terminal or a pager)."""
    header = [h for _, h in COLUMNS]
    rows = _cells(table)
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines) + "\n"


def to_text(table, width: int = 120) -> str:
    """The key columns, one block per workload, each line at most ``width`` characters."""
    header = [h for _, h in TERMINAL_COLUMNS]
    picked = [COLUMN_INDEX[c] for c, _ in TERMINAL_COLUMNS]
    blocks: dict[str, list[list[str]]] = {}
    for record, cells in zip(table.to_dict("records"), _cells(table)):
        row = [cells[i] for i in picked]
        options = [] if row[4] == "—" else [row[4]]
        if record.get("grad_accum", 1) > 1:
            options.append(f"accum {record['grad_accum']}")
        row[4] = ", ".join(options) or "—"
        for long, short in _SHORT_OPTIONS.items():
            row[4] = row[4].replace(long, short)
        row[2] = row[2].replace(" (of ", " (").replace(" asked)", " asked)")
        row[10] = row[10].replace(" ± ", "±")
        row[11] = row[11].replace(" (p —)", "")  # one run each: no test, only the difference
        row[9] = row[9].replace(" %", "%")
        blocks.setdefault(record["workload"], []).append(row)
    out = []
    for workload, rows in blocks.items():
        # A column with one value in the whole block is said once, in its heading.
        names, same = list(header), []
        for name in _SAID_ONCE:
            i = names.index(name)
            values = {row[i] for row in rows}
            if len(values) == 1:
                value = values.pop()
                if value not in ("—", ""):
                    same.append(f"{_SAID_ONCE[name]} {value}".strip())
                names.pop(i)
                rows = [row[:i] + row[i + 1:] for row in rows]
        heading = workload + (f" — {', '.join(same)}" if same else "")
        delta = names.index("Δ top-1 (p)")
        if not any("(p" in row[delta] for row in rows):
            names[delta] = "Δ top-1"  # no repeats, no p-values
        widths = [max(len(x.partition(": ")[0]) for x in col) for col in zip(names, *rows)]
        out += ([""] if out else []) + [heading]
        for cells in [names, *rows]:
            status, _, reason = cells[-1].partition(": ")
            text = "  ".join(c.ljust(w) for c, w in zip([*cells[:-1], status], widths))
            out.append(text.rstrip()[:width])
            if reason:  # why a row is not ok, on a line of its own
                out.append(f"    {status}: {reason}"[:width])
    out.append(f"(key columns; `--format wide`, summary.csv and summary.md have all "
               f"{len(COLUMNS)})")
    return "\n".join(out) + "\n"


def to_csv(table) -> str:
    columns = [c for c, _ in COLUMNS] + ["final_top1_ci", "p_value", "differs", "error",
                                          "dataset", "width", "failed_runs"]
    out = table.reindex(columns=columns)
    out["same_start"] = out["same_start"].map({"✓": "true", "✗": "false"})
    return out.to_csv(index=False)


def to_json(table) -> str:
    """Strict JSON: NaN and infinities become null."""
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    rows = [{k: clean(v) for k, v in r.items()} for r in table.to_dict("records")]
    return json.dumps(rows, indent=2, default=str, allow_nan=False) + "\n"


def row_label(r) -> str:
    """A row's name in plots: strategy, N, precision and what else sets it apart."""
    options = r.options
    for long, short in _SHORT_OPTIONS.items():
        options = options.replace(long, short)
    extra = [] if options == "—" else [options]
    if r.grad_accum > 1:
        extra.append(f"accum {r.grad_accum}")
    return " ".join([r.strategy, f"N={r.world_size}", r.precision, *extra])


def make_figures(records: list[dict[str, Any]],
                 probes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Matplotlib figures by name: epoch_time, scaling, top1, time_to_target,
    time_vs_accuracy, where_time_goes, scaling_efficiency, and busbw (with probes)."""
    import matplotlib.pyplot as plt

    table = summary_table(records, probes=probes)
    ok = table[table["status"] == "ok"]
    figures: dict[str, Any] = {}

    fig, ax = plt.subplots(figsize=(8, 5))
    labels = [row_label(r) for r in ok.itertuples()]
    ax.bar(range(len(ok)), ok["epoch_time_s"], color="tab:blue")
    ax.set_xticks(range(len(ok)), labels, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("epoch time (s)")
    ax.set_title("Epoch time per strategy and world size (median, warm-up excluded)")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figures["epoch_time"] = fig

    fig, ax = plt.subplots(figsize=(6, 4))
    for (strategy, device, precision), grp in ok.groupby(["strategy", "device", "precision"]):
        grp = grp.sort_values("world_size")
        ax.plot(grp["world_size"], grp["images_per_s"], "o-",
                label=f"{strategy} ({device}, {precision})")
        one = grp[grp["world_size"] == 1]
        if len(one):
            ns = sorted(set(grp["world_size"]))
            ax.plot(ns, [one["images_per_s"].iloc[0] * n for n in ns], ":", color="grey")
    ax.set_xlabel("world size N (GPUs or CPU processes)")
    ax.set_ylabel("images/s (training)")
    ax.set_ylim(bottom=0)
    if len(ok):
        ax.set_xticks(sorted({int(n) for n in ok["world_size"]}))
    ax.set_title("Scaling (dotted: ideal linear from N=1)")
    if len(ok):
        ax.legend(fontsize=8)
    figures["scaling"] = fig

    # One curve per table row (the mean over its repeats), legend outside the axes.
    fig, ax = plt.subplots(figsize=(8, 4))
    runs = run_rows(records)
    by_run = {rec.get("run_id"): rec for rec in records}
    for _, group in runs[runs["status"] == "ok"].groupby(GROUP_KEYS, dropna=False):
        curves = [[100 * e["top1"] for e in by_run[i].get("per_epoch") or []]
                  for i in group["run_id"]]
        length = min(len(c) for c in curves)
        if not length:
            continue
        mean = [statistics.fmean(c[e] for c in curves) for e in range(length)]
        label = row_label(next(group.itertuples()))
        label += f" ({len(curves)} runs)" if len(curves) > 1 else ""
        ax.plot(range(1, length + 1), mean, "o-", label=label)
    ax.set_xlabel("epoch")
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
    for i, r in enumerate(ok.itertuples()):
        ci = r.final_top1_ci if not math.isnan(r.final_top1_ci) else 0.0
        ax.errorbar(r.total_train_time_s, r.final_top1, yerr=ci, fmt=markers[i % len(markers)],
                    capsize=3, label=_row_label(r))
    ax.set_xlabel("total training time (s, median over runs)")
    ax.set_ylabel("final top-1 (%, mean ± 95 % CI)")
    ax.set_title("Time vs accuracy")
    if len(ok):
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figures["time_vs_accuracy"] = fig
    figures["where_time_goes"] = _where_time_goes_figure(ok)
    figures["scaling_efficiency"] = _efficiency_figure(ok)
    if probes:
        figures["busbw"] = _busbw_figure(probes)
    for fig in figures.values():
        fig.tight_layout()
    return figures


def _row_label(r) -> str:
    shared = ", shared GPU" if r.gpu_shared else ""
    accum = f", accum {r.grad_accum}" if r.grad_accum != 1 else ""
    return f"{r.strategy} N={r.world_size} {r.device} {r.precision}{accum}{shared}"


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
    compute = [1000 * r.compute_step_s for r in rows]
    exposed = [max(0.0, 1000 * (r.step_time_s - r.compute_step_s)) for r in rows]
    ax.bar(range(len(rows)), compute, color="tab:blue", label="compute (sync off)")
    ax.bar(range(len(rows)), exposed, bottom=compute, color="tab:red",
           label="exposed communication")
    ax.set_xticks(range(len(rows)), ["\n".join([r.strategy, f"N={r.world_size}",
                                                 f"{r.device} {r.precision}"]) for r in rows],
                  fontsize=7)
    ax.set_ylabel("step time (ms, median)")
    ax.set_title("Where the step time goes")
    if rows:
        ax.legend(fontsize=8)
    return fig


def _efficiency_figure(ok):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    worlds = sorted({int(n) for n in ok["world_size"]}) if len(ok) else [1]
    ax.plot(worlds, [100] * len(worlds), ":", color="grey", label="ideal (100 %)")
    for (strategy, device, precision), grp in ok.groupby(["strategy", "device", "precision"]):
        grp = grp[grp["efficiency"].notna()].sort_values("world_size")
        if len(grp):
            ax.plot(grp["world_size"], 100 * grp["efficiency"], "o-",
                    label=f"{strategy} ({device}, {precision})")
    ax.set_xlabel("world size N")
    ax.set_ylabel("scaling efficiency (%): speed-up / N")
    ax.set_xticks(worlds)
    ax.set_ylim(bottom=0)
    ax.set_title("Scaling efficiency")
    ax.legend(fontsize=7)
    return fig


def _busbw_figure(probes: list[dict[str, Any]]):
    """Bus bandwidth against message size, one line per probe (device, backend, N)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for probe in probes:
        rows = probe["results"]
        ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-",
                label=f"{probe['device']} {probe['backend']} N={probe['world_size']}")
        ax.axvline(probe["gradient_bytes"], color="grey", linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes; dotted: one ResNet-18 gradient)")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
    ax.set_title("All-reduce ceiling (bench probe)")
    ax.legend(fontsize=7)
    return fig


def workload_slug(name: str) -> str:
    """A folder name for a workload: 'synthetic d=1 50000 img, batch 512, resnet18' ->
    'synthetic-d1-50000img-batch512-resnet18'."""
    text = name.replace("=", "").replace(" img", "img").replace("batch ", "batch")
    return "-".join(re.findall(r"[A-Za-z0-9.]+", text)).replace(".", "_")


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
        table = summary_table(recs)
        shows = {  # what a figure needs to say anything
            "time_to_target": bool(table["time_to_target_s"].notna().any()
                                   and (table["time_to_target_s"] < math.inf).any()),
            "scaling": table["world_size"].nunique() > 1,
            "scaling_efficiency": table["world_size"].nunique() > 1,
        }
        for key, fig in make_figures(recs, probes).items():
            if shows.get(key, True) and any(ax.has_data() for ax in fig.axes):
                fig.text(0.005, 0.005, f"workload: {name}", fontsize=7, color="0.4")
                figures[key] = fig
            else:  # e.g. time to target when no run set a target
                plt.close(fig)
        out[name] = figures
    return out


def write_plots(records: list[dict[str, Any]], folder: Path,
                probes: list[dict[str, Any]] | None = None) -> list[Path]:
    """Every figure with data, per workload: ``folder/<workload>/<name>.{png,svg}``. Plots
    written by an earlier report (this folder's PNG/SVG files) are replaced, not mixed in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["figure.max_open_warning"] = 0  # closed once written
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.png"), *folder.glob("*.svg"), *folder.glob("*/*.png"),
                *folder.glob("*/*.svg")]:
        old.unlink()
    written: list[Path] = []
    for name, figures in figures_per_workload(records, probes).items():
        sub = folder / workload_slug(name)
        sub.mkdir(exist_ok=True)
        for key, fig in figures.items():
            for ext in ("png", "svg"):
                path = sub / f"{key}.{ext}"
                fig.savefig(path, dpi=120, metadata={"Date": None} if ext == "svg" else None)
                written.append(path)
            plt.close(fig)
    for empty in folder.iterdir():
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()
    return written


README_START = "<!-- bench-table:start (generated by `bench report --update-readme`) -->"
README_END = "<!-- bench-table:end -->"


def hardware_lines(records: list[dict[str, Any]]) -> list[str]:
    """One line per distinct machine the records were measured on."""
    seen = []
    for rec in records:
        env = rec.get("env") or {}
        gpus = env.get("gpus") or []
        if rec.get("device") == "cuda" and gpus:
            what = f"{len(gpus)} × {gpus[0]}, driver {env.get('driver')}, CUDA {env.get('cuda')}"
        else:
            what = f"CPU only: {env.get('cpu')}, {env.get('cpu_count')} cores"
        line = f"{what}; torch {env.get('torch')}, Python {env.get('python')}"
        if line not in seen:
            seen.append(line)
    return seen


def readme_block(records: list[dict[str, Any]],
                 probes: list[dict[str, Any]] | None = None) -> str:
    """The README's table: the Markdown summary plus the hardware it was measured on."""
    table = to_markdown(summary_table(records, probes=probes))
    machines = "\n".join(f"- {line}" for line in hardware_lines(records))
    return (
        f"{README_START}\n{table}\nMeasured on:\n{machines}\n\n"
        f"Epoch time: median over epochs 2.. (the first is warm-up). "
        f"{len(records)} records in `results/runs/`.\n{README_END}"
    )


def update_readme(readme: Path, records: list[dict[str, Any]],
                  probes: list[dict[str, Any]] | None = None) -> bool:
    """Rewrite the block between the markers; True when the file changed."""
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < 0:
        from bench.errors import ConfigError

        raise ConfigError(f"{readme} has no table markers; add {README_START} ... {README_END}")
    new = text[:start] + readme_block(records, probes) + text[end + len(README_END):]
    readme.write_text(new)
    return new != text


def cmd_report(results: str, fmt: str = "text", write: bool = True,
               readme: str | None = None, reference: str = "ddp:1") -> int:
    parse_reference(reference)
    if not Path(results).is_dir():
        raise ConfigError(f"--results {results} is not a folder; point it at a results folder "
                          "(the one `bench run --output` wrote)")
    records, warnings = load_records(results)
    for rec in records:
        status, error = current_status(rec)
        if status != rec.get("status"):
            warnings.append(f"{rec['run_id']} says {rec.get('status')}, counted as {status} "
                            f"({error})")
    for line in warnings:
        print(f"bench report: {line}", file=sys.stderr)
    if not records:
        print(f"bench report: no run records in {results} (nor in {runs_dir(results)}); "
              "nothing written", file=sys.stderr)
        return EXIT_FAILED
    from bench.probe import load_probes

    table = summary_table(records, reference, load_probes(results))
    for line in plausibility_warnings(table, records):
        print(f"bench report: {line}", file=sys.stderr)
    if fmt == "json":
        print(to_json(table), end="")
    elif fmt == "wide":
        print(to_wide_text(table), end="")
    elif fmt == "csv":
        print(to_csv(table), end="")
    elif fmt == "markdown":
        print(to_markdown(table), end="")
    else:
        print(to_text(table), end="")
    from bench.trace_breakdown import format_rows, trace_rows

    traced = trace_rows(records, Path(results))
    if traced and fmt == "text":
        print("\n" + format_rows(traced), end="")
    if write:
        root = Path(results)
        root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(root / "summary.csv", to_csv(table))
        write_text_atomic(root / "summary.md", to_markdown(table))
        if traced:
            import pandas as pd

            write_text_atomic(root / "trace_breakdown.csv", pd.DataFrame(traced).to_csv(
                index=False, float_format="%.2f"))
        plots = write_plots(records, root / "plots", load_probes(results))
        print(f"wrote {root / 'summary.csv'}, {root / 'summary.md'} and {len(plots)} plot files "
              f"under {root / 'plots'}", file=sys.stderr)
    if readme:
        changed = update_readme(Path(readme), records, load_probes(results))
        print(f"{readme}: table {'updated' if changed else 'already up to date'}",
              file=sys.stderr)
    return 0
