"""Plausibility: what makes a row's figures suspect. Each flag goes in the row (`ok ⚠ ...`,
the CSV's `flags`), in a warning under the table naming the likely cause (views), and in
the plots (hatched)."""

from __future__ import annotations

import math
import numbers
import statistics
from typing import Any

from bench.records.describe import input_bound
from bench.tools.stats import welch

EFFICIENCY_NOISE = 0.05  # efficiency above 1 + this cannot be scaling: the N=1 run was slowed
EFFICIENCY_SIGNIFICANT = 0.05  # with repeats on both sides: an excess at p below this is real
SLOW_RUN_FACTOR = 1.5  # a repeat this much slower than its row's median epoch time
SLOW_RUN_MIN_RUNS = 3  # ... among at least this many ok runs (with two, which one is slow?)
EXPOSED_COMM_NOISE = 0.10  # compute-only steps this much slower than the run's: not a figure
CLOCK_GAP = 0.05  # a row's GPU clock this far below its workload's best row (share of max)
POWER_LIMIT_CUT = 0.05  # a GPU power limit this far below the GPU's default


def flagged_exposed(fraction: float) -> str:
    """A flagged exposed communication as a percentage that reads beyond the flag's -10 %:
    '-42 %', and '-10.4 %' where whole percents would read '-10 %', at the limit (two
    decimals at most)."""
    for digits in (0, 1, 2):
        text = f"{100 * fraction:.{digits}f}"
        if float(text) < -100 * EXPOSED_COMM_NOISE:
            break
    return f"{text} %"


def slow_runs(ok) -> list[tuple[str, float, float]]:
    """(run id, its epoch time, the row's median) for each repeat more than SLOW_RUN_FACTOR
    slower than the median of its row's ok runs."""
    times = [(i, t) for i, t in zip(ok["run_id"], ok["epoch_time_s"]) if not math.isnan(t)]
    if len(times) < SLOW_RUN_MIN_RUNS:
        return []
    median = statistics.median(t for _, t in times)
    return [(i, t, median) for i, t in times if t > SLOW_RUN_FACTOR * median]


# The flags that concern a row's top-1 as much as its times: shown in an accuracy block too.
ABOUT_TOP1 = ("other batches", "other weights", "mixed torch")


def mixed_torch(ok) -> list[tuple[str, int]]:
    """(torch version, runs) of a row's ok runs where they ran under more than one torch
    (else []): a row's runs are repeats of one configuration, and a folder that holds a
    sweep run again after an upgrade averaged both torches' runs into one row, unsaid. Two
    torches are two sides of `bench compare`."""
    counts = ok["torch"][ok["torch"] != "?"].value_counts(sort=False)  # '?': not said
    return sorted((str(v), int(n)) for v, n in counts.items()) if len(counts) > 1 else []


def _odd_ones(members: list[tuple[str, tuple]]) -> dict[str, tuple[tuple, tuple]]:
    """Of runs that should all hold one value (run id, value): each that holds another than
    most do, with its value and the one it differs from; where no value is held by most,
    every run whose value differs from another's."""
    kinds: dict[tuple, list[str]] = {}
    for run_id, value in members:
        kinds.setdefault(value, []).append(run_id)
    if len(kinds) < 2:
        return {}
    ranked = sorted(kinds.items(), key=lambda kv: -len(kv[1]))
    most = ranked[0][0] if len(ranked[0][1]) > len(ranked[1][1]) else None
    found = {}
    for value, ids in kinds.items():
        if value != most:
            other = most if most is not None else next(v for v in kinds if v != value)
            found.update({run_id: (value, other) for run_id in ids})
    return found


def _by_seed(runs, value_of) -> dict[tuple, list[tuple[str, Any]]]:
    """The ok runs of each (workload, seed, order rule) with ``value_of(run)`` (None, empty
    or NaN: not recorded, left out); not in a block at each one's largest batch (another
    batch, another order). pandas holds a column's null as NaN where other runs hold a
    value: a record without a start fingerprint was 'other weights' beside those with."""
    groups: dict[tuple, list[tuple[str, Any]]] = {}
    for r in runs.itertuples():
        value = value_of(r) if r.status == "ok" and not r.own_batch else None
        if (isinstance(value, (str, tuple)) and value and isinstance(r.seed, numbers.Real)
                and r.seed == r.seed):
            groups.setdefault((r.workload, int(r.seed), r.order_rule), []).append(
                (r.run_id, value))
    return groups


def other_batches(runs) -> dict[str, tuple[int, int]]:
    """The runs that trained on other batches than the rest of their workload's runs of the
    same seed: run id -> (the first epoch whose order differs, the seed). Every strategy is
    to see the same global batches in the same order, whatever N or launcher; each epoch's
    order is hashed into the record (``data_order_sha1``), and this is where it is checked.
    A run is compared over the epochs it shares with the others, within the runs of one
    order rule (records before ``data_order_rule`` drew seed + epoch); the order most runs
    hold is the workload's, and where none holds most, every run that differs is named."""
    found: dict[str, tuple[int, int]] = {}
    for (_, seed, _), members in _by_seed(runs, lambda r: r.data_order).items():
        shared = min(len(order) for _, order in members)
        odd = _odd_ones([(run_id, tuple(order[:shared])) for run_id, order in members])
        for run_id, (order, other) in odd.items():
            found[run_id] = (next(i for i, (a, b) in enumerate(zip(order, other)) if a != b)
                             + 1, seed)
    return found


def other_start(runs) -> dict[str, int]:
    """The runs that started from other weights than the rest of their workload's runs of
    the same seed (``initial_param_fingerprint``): run id -> seed. Each record's own check
    (``same_start``) compares it with the reference its own torch drew; two benches or
    torches that draw a seed's weights differently would each pass it, and their rows, put
    side by side, would not have started alike."""
    return {run_id: seed
            for (_, seed, _), members in _by_seed(runs, lambda r: r.start_sha1).items()
            for run_id in _odd_ones(members)}


def clock_gaps(table) -> list[float]:
    """How far each row's GPU clock (median SM clock over its timed epochs, as a share of
    the maximum) fell below the best row of its workload and device: rows measured at
    different clocks are not a fair comparison. NaN for rows without clocks."""
    best: dict[tuple, float] = {}
    for r in table.itertuples():
        if r.status == "ok" and not math.isnan(r.clock_share):
            key = (r.workload, r.device)
            best[key] = max(best.get(key, 0.0), r.clock_share)
    return [best[(r.workload, r.device)] - r.clock_share
            if (r.workload, r.device) in best and r.status == "ok" else math.nan
            for r in table.itertuples()]


def clock_gap_matters(gap: float) -> bool:
    """A clock share this far below another's (more than CLOCK_GAP) makes two measurements
    unequal; False for NaN (no clocks)."""
    return gap > CLOCK_GAP


def lowered_power_limit(rec: dict) -> tuple[float, float] | None:
    """(enforced, default) W of the record's GPU whose power limit was cut most, when one was
    set more than POWER_LIMIT_CUT below its default (`nvidia-smi -pl`); else None."""
    pairs = [(e, d) for e, d in rec.get("gpu_power_limits_w") or []
             if isinstance(e, (int, float)) and isinstance(d, (int, float)) and d > 0]
    if not pairs:
        return None
    enforced, default = min(pairs, key=lambda p: p[0] / p[1])
    return (enforced, default) if enforced < (1 - POWER_LIMIT_CUT) * default else None


def bf16_emulated(rec: dict) -> str | None:
    """The CPU capability ('AVX2') of a bf16 CPU run whose machine had no bf16 arithmetic
    (``env.cpu_bf16`` false: autocast emulated bf16, many times slower than fp32), else
    None; records from before the field: None."""
    env = rec.get("env") or {}
    if (rec.get("device") == "cpu" and "bf16" in str(rec.get("precision"))
            and env.get("cpu_bf16") is False):
        return env.get("cpu_capability") or "not said"
    return None


def efficiency_p(rates: list[float], base_rates: list[float], world_size: int) -> float:
    """Welch's two-sided p of a row's img/s per replica (each run's, over N) against the
    img/s of its N=1 row's runs, where each side has two or more runs; NaN otherwise. An
    efficiency above 100 % is only a sign of a slowed N=1 run when the repeats say it is
    beyond their own spread: two rows of 2 runs that vary by 10 % each land at 106 % by
    chance, and the verdict above calls them tied."""
    return welch([v / world_size for v in rates], base_rates)[1]


def row_flags(r) -> str:
    """Why a row's figures are suspect, in a few words each ('' when nothing is)."""
    flags = []
    if (r.status == "ok" and r.efficiency == r.efficiency and r.efficiency > 1 + EFFICIENCY_NOISE
            and not r.efficiency_p >= EFFICIENCY_SIGNIFICANT):  # NaN (too few runs): flagged
        flags.append("efficiency > 100 %")
    if r.status == "ok" and r.exposed_comm < -EXPOSED_COMM_NOISE:  # False for NaN
        flags.append("exposed comm < 0")
    if r.status == "ok" and input_bound(r.images_per_s, r.loader_alone):
        flags.append("input-bound")
    if r.oversubscribed:
        flags.append("CPU oversubscribed")
    if r.shared_cores:
        flags.append("shared cores")
    if r.gpu_shared:
        flags.append("shared GPUs")
    if clock_gap_matters(r.clock_gap):
        flags.append(f"GPU clock -{100 * r.clock_gap:.0f} %")
    if r.power_limit:
        flags.append("GPU power limit lowered")
    if isinstance(r.bf16_emulated, str):  # (pandas reads a row's None as NaN)
        flags.append("bf16 emulated")
    if r.abnormal_slowdowns:
        flags.append("GPU " + " / ".join(r.abnormal_slowdowns))
    if r.slow_runs:
        flags.append(f"{len(r.slow_runs)} slow run{'s' * (len(r.slow_runs) > 1)}")
    if r.restarted:
        flags.append("restarted")
    if r.other_batches:
        flags.append(ABOUT_TOP1[0])
    if r.other_start:
        flags.append(ABOUT_TOP1[1])
    if r.torches:
        flags.append(ABOUT_TOP1[2])
    return ", ".join(flags)
