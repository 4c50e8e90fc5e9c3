"""Scores over a row's repeats: time to target as MLPerf Training scores it, and each row's
final top-1 against the reference row (difference of means, Welch's p-value)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from bench.tools.errors import ConfigError
from bench.tools.stats import welch


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
    (its time is infinite, so it is the slowest). Fewer runs: the median, marked; one run:
    its time, '(1 run)'."""
    if not times or all(t is None or (isinstance(t, float) and math.isnan(t)) for t in targets):
        return None
    if len({t for t in targets}) > 1:
        return "mixed targets"
    target = targets[0]
    score, missed = mlperf_seconds(times)
    if math.isinf(score):
        return f"did not converge ({missed}/{len(times)} missed {target:g} %)"
    how = (f"MLPerf, {len(times)} runs" if len(times) >= 5
           else f"median of {len(times)}" if len(times) > 1 else "1 run")
    return f"{score:.2f} ({how}{f', {missed} missed' if missed else ''})"


def parse_reference(text: str) -> tuple[str, int]:
    """``strategy[:N]`` (N default 1) -> (strategy, N)."""
    name, _, world = text.partition(":")
    try:
        world_size = int(world or 1)
    except ValueError:
        world_size = 0  # refused below, as N = 0 is
    if not name or world_size < 1:
        raise ConfigError(f"--reference must be STRATEGY[:N] with N at least 1, e.g. ddp:1 "
                          f"(got {text!r})")
    return name, world_size


def _options(text: str) -> list[str]:
    """A row's options, one by one ("—": none)."""
    return [] if text == "—" else [o.strip() for o in text.split(",")]


def add_parity(table, reference: str):
    """Δ final top-1 (mean) against the reference row of the same workload and device, and
    Welch's p-value over the repeats. The reference row is the strategy at N replicas on its
    own GPUs, fp32 where it exists (else tf32, else the first precision), and without speed
    or compression options where such a row exists (a PowerSGD row is no reference), else
    with the fewest, and of those the one whose options most rows share. A row
    that trained for another number of epochs than its reference is not compared: its
    accuracy is another schedule's (``other_epochs``: its count, else 0). Where each row
    trains at the largest batch it fits (``own_batch``), none is compared: the batches,
    and the learning rates scaled with them, differ."""
    name, world = parse_reference(reference)
    # how many rows of each workload and device carry each option: among candidates alike
    # in the rest, the reference is the one whose options the others build on (a folder
    # whose runs all set --lr 0.1 compares them with "lr 0.1", not with "lr 0.0125")
    shared = Counter((r.workload, r.device, option) for r in table.itertuples()
                     for option in _options(r.options))
    refs: dict[tuple, Any] = {}
    for r in table.itertuples():
        if (r.strategy, r.world_size, r.gpu_shared, r.status) != (name, world, False, "ok"):
            continue
        if r.own_batch:
            continue
        options = _options(r.options)
        rank = ({"fp32": 0, "tf32": 1}.get(r.precision, 2), len(options),
                -min((shared[(r.workload, r.device, o)] for o in options), default=0))
        key = (r.workload, r.device)
        if key not in refs or rank < refs[key][0]:
            refs[key] = (rank, r.Index, r.finals, r.epochs)
    deltas, pvalues, is_ref, other_epochs = [], [], [], []
    for r in table.itertuples():
        found = refs.get((r.workload, r.device))
        longer = found is not None and r.status == "ok" and r.epochs != found[3]
        other_epochs.append(r.epochs if longer else 0)
        if found is None or r.status != "ok" or longer:
            deltas.append(math.nan), pvalues.append(math.nan), is_ref.append(False)
            continue
        diff, p = welch(r.finals, found[2])
        deltas.append(diff), pvalues.append(p), is_ref.append(r.Index == found[1])
    table["delta_top1"], table["p_value"], table["is_reference"] = deltas, pvalues, is_ref
    table["other_epochs"] = other_epochs
    table["differs"] = [p < 0.05 for p in pvalues]
    return table
