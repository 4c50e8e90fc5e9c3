"""The projection checked against measured runs: each multi-rank run predicted from its
compute-only step, its gradient timeline and the probe of the same machines, beside the two
null models (no communication; every byte after backward); the summary kept in RESULTS
(`bench project --validate`) and the lines `bench project` prints from it."""

from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.project.from_records import (
    allreduced_bytes,
    comm_hook,
    matching_probe,
    ranks_per_node,
    series_key,
    smaller_probe,
    workload_of,
)
from bench.project.scaling import Projection, Workload, network_from_probe, project
from bench.records.describe import median_step_s, model_width
from bench.records.files import write_atomic
from bench.records.probes import contention, ideal_allreduce_s, measured_split
from bench.tools import terminal
from bench.tools.errors import ConfigError

VALIDATION_FILE = "projection-validation.json"


def calibration_lines(root: Path) -> list[str]:
    """The validations the projection rests on: RESULTS's own and those of the results
    folders inside it (results/testbed: the shaped network), each with the null models'."""
    lines = []
    for path in [root / VALIDATION_FILE, *sorted(root.glob(f"*/{VALIDATION_FILE}"))]:
        try:
            data = json.loads(path.read_text())
            line = f"validated on {path.parent} ({data['date']}): " + summary_line(data)
            stale = staleness(path.parent, data["points"])
        except OSError:
            continue
        except (ValueError, KeyError, TypeError, AttributeError):
            line = f"{path} is not a validation `bench project --validate` wrote; ignored"
        else:
            line += f"; {stale}" if stale else ""
        lines.append(line)
    return lines or ["not yet validated on these results: run `bench project RESULTS "
                     "--validate`"]


def staleness(folder: Path, points: list[dict[str, Any]]) -> str | None:
    """What the validation kept in ``folder`` no longer covers: runs added since, which it
    did not predict, and runs it predicted that are gone; None where it covers them all.
    (The validation committed in results/ said 17 runs for two days after the comparison
    table's 8 testbed runs joined them.)"""
    from bench.records.files import load_records
    from bench.records.probes import load_probes

    records, _ = load_records(folder)
    now = {rec["run_id"] for rec, *_ in predictable_runs(records, load_probes(folder))}
    then = {p["run_id"] for p in points}
    added, gone = len(now - then), len(then - now)
    if not added and not gone:
        return None
    what = " and ".join(part for part in (
        f"{terminal.count(added, 'run')} here since" if added else "",
        f"{terminal.count(gone, 'run')} it predicted gone" if gone else "") if part)
    return f"stale ({what}): run `bench project {folder} --validate` again"


def predictable_runs(records: list[dict[str, Any]], probes: list[dict[str, Any]]
                     ) -> Iterator[tuple[dict[str, Any], Workload, dict[str, Any], float]]:
    """(record, workload, probe, measured step) of each run `--validate` predicts: ok,
    multi-rank, with a compute-only step and a probe of the same machines."""
    for rec in sorted(records, key=lambda r: r.get("started_at") or ""):
        if rec.get("status") != "ok" or (rec.get("world_size") or 1) < 2:
            continue
        work, probe, measured = workload_of(rec), matching_probe(rec, probes), median_step_s(rec)
        if work is None or probe is None or math.isnan(measured):
            continue
        yield rec, work, probe, measured


def predict_measured(rec: dict[str, Any], work: Workload, probe: dict[str, Any]) -> Projection:
    """A measured run predicted at its own ranks and nodes, with the collective times of
    the probe of the same machines (all-gather and reduce-scatter where it timed them)."""
    return project(work, rec["world_size"], ranks_per_node(rec), network_from_probe(probe),
                   measured_allreduce=lambda size: ideal_allreduce_s(probe, size),
                   measured_split=_split_of(probe))


def extrapolated(rec: dict[str, Any], work: Workload, probes: list[dict[str, Any]],
                 measured: float) -> dict[str, Any]:
    """The run predicted as `bench project` predicts more ranks than a probe had: from the
    probe at the fewest ranks below the run's (``smaller_probe``), its all-reduce taken to
    the run's ranks by the model (a ring's 2(N-1) steps and 2(N-1)/N of the bytes), not
    measured; beside it the null model "communication as at the probe's ranks" (the run's
    compute-only step, communication projected at the probe's ranks). Nones where no
    smaller probe is here."""
    small = smaller_probe(rec, probes)
    if small is None:
        return {"extrapolated_from": None, "extrapolated_ms": None,
                "extrapolated_error_pct": None, "comm_as_probed_ms": None,
                "comm_as_probed_error_pct": None}
    net, m = network_from_probe(small), small["world_size"]
    predicted = project(work, rec["world_size"], ranks_per_node(rec), net).step_s
    as_probed = project(work, m, ranks_per_node(rec), net).step_s
    return {"extrapolated_from": m, "extrapolated_ms": 1000 * predicted,
            "extrapolated_error_pct": 100 * (predicted - measured) / measured,
            "comm_as_probed_ms": 1000 * as_probed,
            "comm_as_probed_error_pct": 100 * (as_probed - measured) / measured}


def _split_of(probe: dict[str, Any]):
    """The probe's (all-gather, reduce-scatter) time functions, or None."""
    if not measured_split(probe):
        return None
    return (lambda size: ideal_allreduce_s(probe, size, "all_gather_s"),
            lambda size: ideal_allreduce_s(probe, size, "reduce_scatter_s"))


def validate_records(records: list[dict[str, Any]], probes: list[dict[str, Any]],
                     root: Path) -> int:
    """Predict every measured multi-rank run from its own compute-only step and gradient
    timeline and the probe of the same device, backend, ranks, nodes and network (tag); print
    and keep the errors beside those of the null models, and the spread of each point's
    repeats (runs of the same configuration on the same network)."""
    points = []
    for rec, work, probe, measured in predictable_runs(records, probes):
        predicted = predict_measured(rec, work, probe)
        error = 100 * (predicted.step_s - measured) / measured
        no_comm, no_overlap = null_models(rec, work, probe)
        label = f"{rec['strategy']} x{model_width(rec):g}" + (f" accum {work.grad_accum}"
                                                               if work.grad_accum > 1 else "")
        points.append({"run_id": rec["run_id"], "label": label, "strategy": rec["strategy"],
                       "world_size": rec["world_size"], "nodes": rec.get("nodes") or 1,
                       "network": rec.get("tag") if probe.get("tag") else None,
                       "point": repr((series_key(rec, work), comm_hook(rec), work.syncbn,
                                      probe.get("tag"), rec["world_size"],
                                      rec.get("nodes") or 1)),
                       "bucket_cap_mb": work.bucket_bytes / 2**20,
                       "buckets_ran": rec.get("gradient_buckets"),
                       # (FSDP's "buckets" are its units, modelled as equal stages)
                       "buckets_modelled": None if rec["strategy"] == "fsdp" else [
                           round(size / work.sent_fraction)
                           for size, _ in work.buckets(work.bucket_bytes)],
                       "injected_delay_ms": 1000 * work.hook_delay_s,
                       # what the probe measured overlap to cost (None: not measured)
                       "contention": contention(probe),
                       "comm_hook": comm_hook(rec), "hook_work_ms": 1000 * work.hook_work_s,
                       "gradient_timeline": work.timeline is not None,
                       "compute_ms": 1000 * work.compute_step_s,
                       "predicted_ms": 1000 * predicted.step_s, "measured_ms": 1000 * measured,
                       "comm_share": max(0.0, 1 - work.compute_step_s / measured),
                       "error_pct": error,
                       "no_communication_error_pct": 100 * (no_comm - measured) / measured,
                       "no_overlap_error_pct": 100 * (no_overlap - measured) / measured,
                       **extrapolated(rec, work, probes, measured)})
    if not points:
        raise ConfigError("nothing to validate: it needs ok multi-rank runs with "
                          "compute_step_s (--comm-probe-steps > 0) and a `bench probe` of the "
                          "same device, backend, ranks and nodes in RESULTS/probes")
    add_spread(points)
    print(validation_table(points))
    summary = {"date": _dt.date.today().isoformat(), **validation_summary(points),
               "points": points}
    write_atomic(root / VALIDATION_FILE, summary)
    print(terminal.fill(summary_line(summary) + f"; kept in {root / VALIDATION_FILE}",
                        subsequent_indent="  "), file=sys.stderr)
    return 0


COMM_HEAVY = 0.25  # of the measured step: where a prediction must beat the null models most


def add_spread(points: list[dict[str, Any]]) -> None:
    """Each run's ``spread_pct``: how far its point's repeats lie apart, (max - min) / median
    of their measured steps (None: measured once)."""
    by_point: dict[str, list[float]] = {}
    for p in points:
        by_point.setdefault(p["point"], []).append(p["measured_ms"])
    for p in points:
        steps = by_point[p["point"]]
        p["repeats"] = len(steps)
        p["spread_pct"] = (100 * (max(steps) - min(steps)) / statistics.median(steps)
                           if len(steps) > 1 else None)


def validation_summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| of the model and of each null model, over every run and
    over the runs whose communication is at least COMM_HEAVY of the step."""
    out: dict[str, Any] = {}
    heavy = [p for p in points if p["comm_share"] >= COMM_HEAVY]
    for key, name in (("error_pct", ""), ("no_communication_error_pct", "no_communication_"),
                      ("no_overlap_error_pct", "no_overlap_")):
        errors = [abs(p[key]) for p in points]
        out[f"{name}median_error_pct"] = statistics.median(errors)
        out[f"{name}worst_error_pct"] = max(errors)
        if heavy:
            out[f"{name}comm_heavy_median_error_pct"] = statistics.median(
                abs(p[key]) for p in heavy)
    out["comm_heavy_runs"] = len(heavy)
    spreads = [p["spread_pct"] for p in points if p["spread_pct"] is not None]
    out["median_repeat_spread_pct"] = statistics.median(spreads) if spreads else None
    reached = [p for p in points if p.get("extrapolated_error_pct") is not None]
    out["extrapolated_runs"] = len(reached)
    if reached:
        out["extrapolated_ranks"] = sorted({p["world_size"] for p in reached})
        out["extrapolated_from"] = sorted({p["extrapolated_from"] for p in reached})
        for key in ("extrapolated_error_pct", "comm_as_probed_error_pct"):
            out[f"{key.removesuffix('_error_pct')}_median_error_pct"] = statistics.median(
                abs(p[key]) for p in reached)
        out["extrapolated_worst_error_pct"] = max(
            abs(p["extrapolated_error_pct"]) for p in reached)
    return out


def summary_line(s: dict[str, Any]) -> str:
    line = (f"median |error| {s['median_error_pct']:.1f} %, worst {s['worst_error_pct']:.1f} "
            f"% over {terminal.count(len(s['points']), 'run')}")
    if "no_overlap_worst_error_pct" not in s:  # written before the null models were
        return line
    line += (f"; the null models (median / worst): no communication "
             f"{s['no_communication_median_error_pct']:.1f} / "
             f"{s['no_communication_worst_error_pct']:.1f} %, no overlap "
             f"{s['no_overlap_median_error_pct']:.1f} / {s['no_overlap_worst_error_pct']:.1f} %")
    if s.get("comm_heavy_runs"):
        line += (f"; where communication is {100 * COMM_HEAVY:.0f} % of the step or more "
                 f"({terminal.count(s['comm_heavy_runs'], 'run')}), median |error| "
                 f"{s['comm_heavy_median_error_pct']:.1f} % against no communication "
                 f"{s['no_communication_comm_heavy_median_error_pct']:.1f} % and no overlap "
                 f"{s['no_overlap_comm_heavy_median_error_pct']:.1f} %")
    if s.get("median_repeat_spread_pct") is not None:
        line += (f"; repeats of a point lie {s['median_repeat_spread_pct']:.1f} % apart "
                 "(median)")
    return line + "; " + null_verdict(s) + extrapolation_clause(s)


def extrapolation_clause(s: dict[str, Any]) -> str:
    """What the runs at more ranks than a probe of theirs say of the projection's step past
    its probe, in words ("" where no run had a smaller probe)."""
    if not s.get("extrapolated_runs"):
        return ""
    ranks = "/".join(map(str, s["extrapolated_ranks"]))
    probed = "/".join(map(str, s["extrapolated_from"]))
    return (f". From a probe at fewer ranks, as it projects: "
            f"{terminal.count(s['extrapolated_runs'], 'run')} at N={ranks} from N={probed}, "
            f"median |error| {s['extrapolated_median_error_pct']:.1f} % (worst "
            f"{s['extrapolated_worst_error_pct']:.1f} %) against "
            f"{s['comm_as_probed_median_error_pct']:.1f} % with communication as at the "
            "probe's ranks")


def null_verdict(s: dict[str, Any]) -> str:
    """What the model gains over each null model, in words: a prediction is worth what it
    gains over the obvious guess. Its median |error| against each null's, over every run
    and over the communication-heavy ones; a difference within half the median spread of
    a point's repeats (what the measured step itself moves by) is no gain. The numbers
    alone left the reader to find that on the loopback runs the model was no closer than
    the guess that communication costs nothing."""
    noise = (s.get("median_repeat_spread_pct") or 0.0) / 2

    def against(gain: float, name: str) -> str:
        if gain > noise:
            return f"closer than {name} by {gain:.1f} points"
        if gain < -noise:
            return f"further than {name} by {-gain:.1f} points"
        return f"no closer than {name}"

    def both(runs: str) -> str:
        gains = {name: s[f"{null}{runs}median_error_pct"] - s[f"{runs}median_error_pct"]
                 for null, name in (("no_communication_", "no communication"),
                                    ("no_overlap_", "no overlap"))}
        if all(abs(gain) <= noise for gain in gains.values()):
            return "no closer than either"
        return " and ".join(against(gain, name) for name, gain in gains.items())

    out = f"so the model is {both('')}"
    if s.get("comm_heavy_runs"):
        out += (f" (where communication is {100 * COMM_HEAVY:.0f} % or more: "
                f"{both('comm_heavy_')})")
    return out + (f", a difference within ±{noise:.1f}% (half the repeats' spread) counting "
                  "as none" if noise else " (no repeats here say how far a point's step moves)")


def validation_table(points: list[dict[str, Any]]) -> str:
    """A line per run, grouped by network: its configuration, the prediction against the
    measured step, the spread of its repeats and the null models' errors."""
    # 113 columns: the hook's are 8, for 'powersgd' whole (it read 'powers')
    row = ("{:<22} {:>5} {:>6} {:<8} {:>5} {:>7} {:>9} {:>8} {:>6} {:>4} {:>7} {:>7}"
           " {:>7}")
    lines = [row.format("run (ids in the json)", "N", "bucket", "hook", "delay", "compute",
                        "predicted", "measured", "spread", "comm", "error", "no comm", "no ovl."),
             row.format("", "", "MB", "", "ms", "ms", "ms", "ms", "±%", "", "", "error",
                        "error").rstrip()]
    network = "-"
    for p in sorted(points, key=lambda p: (p["network"] or "", p["point"])):
        if p["network"] != network and any(q["network"] for q in points):
            lines.append(f"network {p['network'] or '(untagged probes)'}:")
            network = p["network"]
        ranks = (str(p["world_size"]) if p["nodes"] == 1
                 else f"{p['world_size']}/{p['nodes']}n")  # ranks / nodes
        spread = "—" if p["spread_pct"] is None else f"{p['spread_pct'] / 2:.1f}"
        lines.append(row.format(
            p.get("label", p["run_id"])[:22], ranks, f"{p['bucket_cap_mb']:g}",
            p["comm_hook"][:8], f"{p['injected_delay_ms']:g}", f"{p['compute_ms']:.1f}",
            f"{p['predicted_ms']:.1f}", f"{p['measured_ms']:.1f}", spread,
            f"{p['comm_share']:.0%}", f"{p['error_pct']:+.1f}%",
            f"{p['no_communication_error_pct']:+.1f}%", f"{p['no_overlap_error_pct']:+.1f}%"))
    return "\n".join(lines)


def null_models(rec: dict[str, Any], work: Workload, probe: dict[str, Any]
                ) -> tuple[float, float]:
    """The obvious guesses a prediction must beat (seconds per step): "no communication"
    (the compute-only step) and "no overlap" (the compute-only step, then every byte the
    step all-reduces at the probe's speed, and any injected wait of every bucket, none of it
    hidden behind backward; FSDP's two all-gathers and reduce-scatter at the probe's times
    for them, or half an all-reduce each)."""
    buckets = len(work.buckets(work.bucket_bytes))
    split = _split_of(probe) if rec.get("strategy") == "fsdp" else None
    if split:
        exchange = 2 * split[0](work.gradient_bytes) + split[1](work.gradient_bytes)
    elif rec.get("strategy") == "fsdp":
        exchange = 1.5 * ideal_allreduce_s(probe, work.gradient_bytes)
    else:
        exchange = ideal_allreduce_s(probe, allreduced_bytes(rec))
    return (work.compute_step_s,
            work.compute_step_s + exchange + buckets * work.hook_delay_s + work.hook_work_s)
