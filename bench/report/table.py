"""The summary table: one row per workload x strategy x N x precision x options, from
run records (speed as medians over repeats, accuracy as means with a CI and a Welch test,
time to target scored like MLPerf). No torch import, and no code a record names: reading
records never runs anything."""

from __future__ import annotations

import math
from typing import Any

import strategies
from bench.records.describe import (
    ABNORMAL,
    as_number,
    machine,
    median_of,
    median_step_s,
    network_crossed,
    oversubscribed,
    shared_cores,
    speed_options,
    summarise_epochs,
    tuning,
    workload,
)
from bench.records.provenance import current_status
from bench.report.accuracy import add_parity, mlperf_score, mlperf_seconds
from bench.report.flags import (
    bf16_emulated,
    clock_gaps,
    efficiency_p,
    lowered_power_limit,
    mixed_torch,
    other_batches,
    other_start,
    row_flags,
    slow_runs,
)
from bench.report.verdict import accuracy_workloads, add_verdict_fields
from bench.tools.stats import mean_ci
from bench.tools.terminal import count

# gpus_requested keeps `dp --gpus 2 --cpu` (one replica, by necessity) apart from --gpus 1.
# gpu_shared keeps runs whose ranks shared GPUs (--backend gloo) apart: their timing is not
# comparable with anything.
# options keeps runs with other speed options (GPU loader, channels_last, compile, fused SGD)
# apart: the same strategy doing the work another way is another row, never a repeat.
# epochs keeps runs of another length apart: their accuracy is another schedule's.
# global_batch: a workload names its batch, except where each row trains at the largest
# batch that fits (bench sweep --batch-size max), and there the batch is the row's own.
GROUP_KEYS = ["workload", "strategy", "device", "world_size", "gpus_requested", "precision",
              "options", "grad_accum", "gpu_shared", "epochs", "global_batch", "norm"]


COLUMNS = [
    ("workload", "workload"),
    ("strategy", "strategy"),
    ("device", "device"),
    ("world_size", "N"),
    ("global_batch", "batch"),
    ("processes", "procs"),
    ("precision", "precision"),
    ("options", "options"),
    ("grad_accum", "accum"),
    ("epochs", "epochs"),
    ("norm", "norm"),
    ("same_start", "same start"),
    ("runs", "runs"),
    ("epoch_time_s", "epoch time (s, median)"),
    ("epoch_time_spread_s", "spread (s, max-min)"),
    ("images_per_s", "img/s"),
    ("loader_alone", "loader alone (img/s)"),
    ("input_wait", "input wait (%)"),
    ("speedup", "speed-up vs N=1"),
    ("efficiency", "scaling eff."),
    ("time_to_target", "time to target (s)"),
    ("final_top1", "final top-1 (%, mean ± 95% CI)"),
    ("best_top1", "best top-1 (%)"),
    ("delta_top1", "Δ top-1 vs ref (Welch p)"),
    ("peak_mem_mib", "peak mem (MiB)"),
    ("mem_rank", "mem/rank (MiB: params + grads + optimizer + activations)"),
    ("exposed_comm", "exposed comm (%)"),
    ("mfu", "MFU (%)"),
    ("comm_ceiling", "ideal all-reduce / step (ms)"),
    ("projected_efficiency", "projected eff. at 64 / 512 GPUs (bench project)"),
    ("clock_share", "GPU clock (% of max)"),
    ("gpu_util", "GPU util (%)"),
    ("images_per_joule", "img/J (GPUs)"),
    ("flags", "flags"),
    ("status", "status"),
]


COLUMN_INDEX = {c: i for i, (c, _) in enumerate(COLUMNS)}


# A run's memory per rank by parts (records' memory_parts, MiB): the report's mem/rank is
# their sum, the peak less the interpreter's baseline.
MEMORY_PARTS = ("mem_parameters", "mem_gradients", "mem_optimizer_state", "mem_activations",
                "mem_rank")


def _memory_parts_mib(rec: dict[str, Any]) -> dict[str, float]:
    parts = rec.get("memory_parts") or {}
    def mib(key: str) -> float:
        value = parts.get(key)
        return value / 2**20 if isinstance(value, (int, float)) else math.nan

    return {"mem_parameters": mib("parameters"), "mem_gradients": mib("gradients"),
            "mem_optimizer_state": mib("optimizer_state"),
            "mem_activations": mib("activations_and_workspace"), "mem_rank": mib("peak")}


def same_start(rec: dict[str, Any]) -> bool | None:
    """Whether the run started from the weights its seed and model define (rank 0's
    parameters before step 1, every rank alike); None (unknown) for a record without the
    fingerprint or without its reference. The reference is data the run wrote (drawn by the
    torch that ran), never drawn here: drawing it would build the model the record names,
    and a record naming ``os:system`` would make reading it run a command."""
    sha1 = rec.get("initial_param_fingerprint")
    reference = rec.get("initial_reference_fingerprint")
    if not sha1 or not reference:
        return None
    return rec.get("initial_replicas_identical") is not False and sha1 == reference


def _all_same_start(values) -> str | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return "✓" if all(known) and len(known) == len(values) else "✗"


def run_rows(records: list[dict[str, Any]]):
    """One row per record; epoch times exclude the first (warm-up) epoch."""
    import pandas as pd

    from bench.project.from_records import (
        allreduced_bytes,  # bench.project.from_records imports this module
    )

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
                "global_batch": rec.get("global_batch"),
                # bench sweep --batch-size max: the row's batch is the largest it fits
                "own_batch": bool((rec.get("config") or {}).get("batch_fits_in")),
                # --gpus is per node: a 2-node run of --gpus 1 asked for 2
                "gpus_requested": (rec["gpus_requested"] * (rec.get("nodes") or 1)
                                   if isinstance(rec.get("gpus_requested"), int)
                                   else rec.get("world_size")),
                "gpu_shared": bool(rec.get("gpu_shared")),
                "processes": rec.get("processes"),
                "precision": rec.get("precision") or "?",  # null: not recorded
                "grad_accum": rec.get("grad_accum") or 1,  # null: not recorded
                "epochs": rec.get("epochs") or (rec.get("config") or {}).get("epochs") or 0,
                "options": speed_options(rec),
                "norm": rec.get("norm"),
                "same_start": same_start(rec),
                "start_sha1": rec.get("initial_param_fingerprint"),
                "seed": rec.get("seed"),
                "torch": str((rec.get("env") or {}).get("torch") or "?"),
                # records from before the rule was named drew seed + epoch (torch's)
                "order_rule": rec.get("data_order_rule") or "seed + epoch",
                "data_order": tuple(e.get("data_order_sha1") for e in epochs
                                    if isinstance(e.get("data_order_sha1"), str)),
                "status": status,
                "error": error,
                "dataset": rec.get("dataset"),
                "width": (rec.get("model") or {}).get("width"),
                "workload": workload(rec),
                "network": network_crossed(rec),
                "workload_here": workload(rec, link=False),  # what a row over a link scales by
                "workload_alone": workload(rec, on=False),  # bench compare across machines
                "machine": machine(rec),
                "epochs_done": len(epochs),
                "epoch_time_s": as_number(figures.get("median_epoch_time_s")),
                "images_per_s": as_number(figures.get("median_images_per_s")),
                "loader_alone": as_number(rec.get("loader_alone_images_per_s")),
                "input_wait": as_number(figures.get("input_wait_share")),
                "final_top1": 100 * figures.get("final_top1", math.nan),
                "best_top1": 100 * figures.get("best_top1", math.nan),
                "total_train_time_s": figures.get("total_train_time_s", 0.0),
                "target_top1": rec.get("target_top1"),
                "time_to_target_s": (rec.get("time_to_target_s") if rec.get("reached_target")
                                     else math.inf),
                "peak_mem_mib": figures.get("steady_peak_mem_bytes", math.nan) / 2**20,
                **_memory_parts_mib(rec),
                "exposed_comm": as_number(rec.get("exposed_comm_fraction")),
                "compute_step_s": as_number(rec.get("compute_step_s")),
                "mfu": median_of([as_number(e.get("mfu")) for e in epochs[1:] or epochs]),
                "step_time_s": median_step_s(rec),
                "gradient_bytes": allreduced_bytes(rec),
                "backend": rec.get("backend"),
                "nodes": rec.get("nodes") or 1,
                "oversubscribed": oversubscribed(rec),
                # torch's intra-op threads in each process (CPU: the cores over the processes)
                "threads": as_number(rec.get("threads_per_process")),
                "tuning": tuning(rec),
                "restarts": rec.get("restarts") or 0,  # torchrun's (--max-restarts)
                "restart_lost_s": as_number(rec.get("restart_lost_s")),
                "restart_cause": rec.get("restart_cause"),
                "shared_cores": shared_cores(rec),  # what others took (SharedCores) or None
                "clock_share": as_number(figures.get("gpu_clock_share")),
                "gpu_util": as_number(figures.get("gpu_util_median")),
                "images_per_joule": as_number(figures.get("images_per_joule")),
                "slowdowns": figures.get("gpu_slowdowns") or [],
                "power_limit": lowered_power_limit(rec),
                "bf16_emulated": bf16_emulated(rec),
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
    by_id = {rec.get("run_id"): rec for rec in records}
    if runs.empty:
        return pd.DataFrame(columns=[c for c, _ in COLUMNS] + ["error"])
    out = []
    differ, started = other_batches(runs), other_start(runs)
    # an accuracy block's times are the crowding: nothing is projected from them (bench
    # project leaves such a workload out alike); its runs say so as its rows will
    crowded = accuracy_workloads(runs[["workload", "status", "oversubscribed"]].to_dict("records"))
    for key, group in runs.groupby(GROUP_KEYS, dropna=False, sort=True):
        ok = group[group["status"] == "ok"]
        use = ok if len(ok) else group
        row = dict(zip(GROUP_KEYS, key))
        timed = row["workload"] not in crowded
        elsewhere: list[tuple[str, str, str]] = []  # figures from a probe not of its own
        times = [t for t in ok["epoch_time_s"] if not math.isnan(t)]
        final_top1, final_top1_ci = mean_ci(list(ok["final_top1"]))
        row.update(
            processes=use["processes"].iloc[-1],
            norm=use["norm"].iloc[-1],
            same_start=("✗" if any(i in started for i in ok["run_id"])
                        else _all_same_start(list(ok["same_start"]))),
            runs=len(ok),
            failed_runs=len(group) - len(ok),
            epoch_time_s=median_of(list(ok["epoch_time_s"])),
            epoch_time_spread_s=(max(times) - min(times)) if len(times) > 1 else math.nan,
            images_per_s=median_of(list(ok["images_per_s"])),
            loader_alone=median_of(list(ok["loader_alone"])),
            input_wait=median_of(list(ok["input_wait"])),
            final_top1=final_top1,
            final_top1_ci=final_top1_ci,
            best_top1=mean_ci(list(ok["best_top1"]))[0],
            finals=list(ok["final_top1"]),
            peak_mem_mib=median_of(list(ok["peak_mem_mib"])),
            **{part: median_of(list(ok[part])) for part in MEMORY_PARTS},
            time_to_target=mlperf_score(list(ok["time_to_target_s"]), list(ok["target_top1"])),
            time_to_target_s=(mlperf_seconds(list(ok["time_to_target_s"]))[0]
                              if ok["target_top1"].notna().any() else math.nan),
            run_images_per_s=list(ok["images_per_s"]),
            run_times_to_target=list(ok["time_to_target_s"]),
            total_train_time_s=median_of(list(ok["total_train_time_s"])),
            target_top1=use["target_top1"].iloc[-1],
            exposed_comm=median_of(list(ok["exposed_comm"])),
            compute_step_s=median_of(list(ok["compute_step_s"])),
            mfu=median_of(list(ok["mfu"])),
            step_time_s=median_of(list(ok["step_time_s"])),
            gradient_bytes=use["gradient_bytes"].iloc[-1],
            comm_ceiling=comm_ceiling(probes or [], use.iloc[-1],
                                      (by_id.get(use["run_id"].iloc[-1]) or {}).get("tag"),
                                      elsewhere) if timed else None,
            projected_efficiency=projected_efficiency(
                probes or [], by_id.get(ok["run_id"].iloc[-1]) if len(ok) and timed else None,
                elsewhere),
            probes_elsewhere=elsewhere,
            oversubscribed=bool(ok["oversubscribed"].any()),
            threads=median_of(list(ok["threads"])),
            tuning=use["tuning"].iloc[-1],
            shared_cores=max((s for s in ok["shared_cores"] if s), default=None),
            slow_runs=slow_runs(ok),
            restarted=[(i, n, lost, cause) for i, n, lost, cause in
                       zip(ok["run_id"], ok["restarts"], ok["restart_lost_s"],
                           ok["restart_cause"]) if n],
            other_batches=[(i, *differ[i]) for i in ok["run_id"] if i in differ],
            other_start=[(i, started[i]) for i in ok["run_id"] if i in started],
            torches=mixed_torch(ok),
            torch=" + ".join(sorted(set(use["torch"]) - {"?"})) or None,  # bench compare's
            clock_share=median_of(list(ok["clock_share"])),
            gpu_util=median_of(list(ok["gpu_util"])),
            images_per_joule=median_of(list(ok["images_per_joule"])),
            abnormal_slowdowns=sorted({r for rs in ok["slowdowns"] for r in rs
                                       if r in ABNORMAL}),
            power_limit=next((p for p in ok["power_limit"] if p), None),
            bf16_emulated=next((c for c in ok["bf16_emulated"] if isinstance(c, str)), None),
            status="ok" if len(ok) else group["status"].iloc[-1],
            error=None if len(ok) else group["error"].iloc[-1],
            dataset=use["dataset"].iloc[-1],
            own_batch=bool(use["own_batch"].iloc[-1]),
            workload_alone=use["workload_alone"].iloc[-1],
            workload_here=use["workload_here"].iloc[-1],
            network=use["network"].iloc[-1],
            machine=use["machine"].iloc[-1],
            width=use["width"].iloc[-1],
        )
        out.append(row)
    table = pd.DataFrame(out)

    def family(r) -> tuple:
        # a row over a network is scaled against one process of the same work (no network)
        # and of as many epochs: beside a 3-epoch N=1 run, a sweep's 2-epoch rows were all
        # scaled against it, whichever came last (its own N=1 row at 1.03x)
        return (r.workload_here, r.strategy, r.device, r.precision, r.options, r.grad_accum,
                r.epochs)

    bases = {family(r): r for r in table.itertuples()
             if r.world_size == 1 and r.gpus_requested == 1 and r.status == "ok"
             and not r.gpu_shared}
    table["speedup"] = [
        r.images_per_s / bases[family(r)].images_per_s
        if family(r) in bases and r.status == "ok" and not r.gpu_shared else math.nan
        for r in table.itertuples()
    ]
    table["efficiency"] = table["speedup"] / table["world_size"]
    # what the N=1 run's process had against each of this row's: one process on 2 cores
    # against 2 of 1 thread each is not the same work split (see plausibility_warnings)
    table["base_threads"] = [bases[family(r)].threads if family(r) in bases else math.nan
                             for r in table.itertuples()]
    table["base_tuning"] = [bases[family(r)].tuning if family(r) in bases else None
                            for r in table.itertuples()]
    table["fewer_than_asked"] = table["world_size"] < table["gpus_requested"]
    table["efficiency_p"] = [
        efficiency_p(r.run_images_per_s, bases[family(r)].run_images_per_s, r.world_size)
        if family(r) in bases and r.status == "ok" and not r.gpu_shared else math.nan
        for r in table.itertuples()
    ]
    table["clock_gap"] = clock_gaps(table)
    table["flags"] = [row_flags(r) for r in table.itertuples()]
    rows = table.to_dict("records")
    table["apart_by"] = apart_by(rows)
    table["apart"] = [apart(r, keys) for r, keys in zip(rows, table["apart_by"])]
    table = add_parity(table, reference)
    rows = table[GROUP_KEYS].to_dict("records")
    order = sorted(range(len(rows)), key=lambda i: report_order(rows[i]))  # stable
    return add_verdict_fields(table.iloc[order].reset_index(drop=True), reference)


def comm_ceiling(probes: list[dict[str, Any]], run, tag: str | None = None,
                 elsewhere: list[tuple[str, str, str]] | None = None) -> str | None:
    """The ideal time to all-reduce what this row's step sends (from the newest ``bench
    probe`` of the same device, backend, ranks, nodes and network ``tag``, as ``bench
    project`` picks it) beside the measured step; marked, and what the probe measured
    instead appended to ``elsewhere``, where it is not of the row's machine and network."""
    from bench.project.from_records import matching_probe, probe_elsewhere
    from bench.records.probes import ideal_allreduce_s

    rec = {"device": run["device"], "backend": run["backend"], "world_size": run["world_size"],
           "nodes": run["nodes"], "tag": tag, "machine": run["machine"]}
    probe = matching_probe(rec, probes)
    if probe is None or not run["gradient_bytes"] or run["world_size"] < 2:
        return None
    ideal = ideal_allreduce_s(probe, run["gradient_bytes"])
    step = run["step_time_s"]
    cell = f"{1000 * ideal:.1f} / " + ("—" if math.isnan(step) else f"{1000 * step:.1f}")
    kind = _elsewhere(probe_elsewhere(rec, probe), "ideal all-reduce", elsewhere)
    return cell + (f" ({kind})" if kind else "")


def _elsewhere(caveat: tuple[str, str] | None, figure: str,
               elsewhere: list[tuple[str, str, str]] | None) -> str | None:
    """What kind of probe not of the row's own machine and network a cell's ``figure`` took
    ('another machine'), which the row's note then names: (figure, kind, which) appended to
    ``elsewhere``; None where it is its own."""
    if caveat is None:
        return None
    if elsewhere is not None:
        elsewhere.append((figure, *caveat))
    return caveat[0]


# What else keeps rows apart (GROUP_KEYS) whose strategy, N, precision and options are alike,
# as a label says it.
_APART = {"epochs": lambda n: count(int(n), "epoch"), "norm": str,
          "global_batch": "batch {}".format}


def apart_by(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """For each row (a dict of GROUP_KEYS: the summary table's, or `bench compare`'s), the
    keys of _APART in which the rows that read as it does (same workload, strategy, N,
    precision, options, accumulation) differ: ('epochs',) for a run of 3 epochs beside one
    of 2; () for a row alone. The one rule for what labels add (``apart``) and for which
    columns a view shows (epochs, BN): or two rows read as one, 'ddp is fastest, 1.05× ddp'."""
    identity = [k for k in GROUP_KEYS if k not in _APART]
    alike: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        alike.setdefault(tuple(str(r.get(k)) for k in identity), []).append(i)
    out: list[tuple[str, ...]] = [()] * len(rows)
    for group in alike.values():
        differ = tuple(key for key in _APART if len({str(rows[i].get(key)) for i in group}) > 1)
        for i in group:
            out[i] = differ
    return out


def apart(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    """What sets ``row`` apart, in words ('3 epochs', 'per-replica-bn'), for ``keys``."""
    return " ".join(_APART[k](row[k]) for k in keys if row.get(k) is not None)


PROJECTED_AT = (64, 512)  # GPUs, 8 per node, on the network of the newest probe of the device


def projected_efficiency(probes: list[dict[str, Any]], rec: dict[str, Any] | None,
                         elsewhere: list[tuple[str, str, str]] | None = None) -> str | None:
    """bench project's efficiency for this row's newest ok run at 64 and 512 GPUs (8 per
    node) over the network measured by the newest ``bench probe`` of its device (of its
    machine and of the network it crossed, its ``--tag``, where one is here: the AMD EPYC
    rows were projected over the Intel Xeon's 1 Gbit/s testbed link, 58 % at 64 GPUs where
    their own loopback gives 94 %); marked as a projection, and as over another machine or
    network where its own has no probe here (what that probe measured then appended to
    ``elsewhere``). None without a probe of its device, or a run the model cannot take."""
    from bench.project.from_records import probe_elsewhere, probe_for, workload_of
    from bench.project.scaling import network_from_probe, project

    probe = probe_for(rec, probes) if rec is not None else None
    work = workload_of(rec) if probe and rec.get("strategy") != "dp" else None
    if work is None:
        return None
    net = network_from_probe(probe)
    cells = [f"{100 * project(work, n, 8, net).efficiency:.0f}%" for n in PROJECTED_AT]
    kind = _elsewhere(probe_elsewhere(rec, probe), "projection", elsewhere)
    return " / ".join(cells) + (f" (projected over {kind})" if kind else " (projected)")


def report_order(row: dict[str, Any]) -> tuple:
    """Where a row stands in every table: GPU rows first, then by workload, strategy (the
    order `bench list` gives), N, precision and options."""
    listed = strategies.names()  # the registry's order
    order = listed.index(row["strategy"]) if row["strategy"] in listed else len(listed)
    return (row["device"] != "cuda", str(row["workload"]), order, row["world_size"],
            str(row["precision"]), str(row["options"]))
