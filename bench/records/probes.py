"""`bench probe`'s records read back: their schema check, their kind, their table, and the
ideal all-reduce time they imply (for the report's comm ceiling and the projection)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.records.files import read_record
from bench.records.schema import NUMBER, optional_problem, wrong_type
from bench.tools.terminal import message_size, printable

KIB, MIB = 1024, 1024 * 1024
SPLIT_COLLECTIVES = ("all_gather_s", "reduce_scatter_s")  # a result's optional keys
MEAN = "time_mean_s"  # the all-reduce's mean call beside its median (from 2026-12-03)


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n."""
    return 2 * (world - 1) / world


def probe_table(record: dict[str, Any]) -> str:
    """The probe's figures a line per size: the all-reduce's median call (its bandwidths
    are the median's, and bench project fits it) and, where it kept it (from 2026-12-03),
    its mean call: the two part where a host delays some calls by a scheduler tick; the
    all-gather's and reduce-scatter's times where it measured them (probes from before
    2026-11-27 did not)."""
    split = measured_split(record)
    mean = all(MEAN in r for r in record["results"])
    lines = [f"{'size':>10} {'time (ms)':>10}" + (f" {'mean (ms)':>10}" if mean else "")
             + f" {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"
             + (f"  {'all-gather (ms)':>15}  {'reduce-scatter (ms)':>19}" if split else "")]
    for r in record["results"]:
        size = r["bytes"]
        label = message_size(size)
        mark = "  <- one gradient" if size == record["gradient_bytes"] else ""
        both = (f"  {1000 * r['all_gather_s']:>15.3f}  {1000 * r['reduce_scatter_s']:>19.3f}"
                if split else "")
        lines.append(f"{label:>10} {1000 * r['time_s']:>10.3f}"
                     + (f" {1000 * r[MEAN]:>10.3f}" if mean else "")
                     + f" {r['algbw_GBps']:>13.3f} {r['busbw_GBps']:>13.3f}{both}{mark}")
    return "\n".join(lines) + "\n"


def probe_kind(record: dict[str, Any]) -> tuple:
    """What a probe measured, and what a run is matched to its probes by: device, backend,
    ranks and nodes (of a probe record or a run record alike)."""
    return (record.get("device"), record.get("backend"), record.get("world_size"),
            record.get("nodes") or 1)


def load_probes(results: str | Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The all-reduce probes under ``results/probes``; a file that is no probe, or whose
    figures cannot be (a size or a time of zero, a bandwidth that is not a positive number),
    is left out, with a line in ``warnings`` when a list is given."""
    folder = Path(results) / "probes"
    probes = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = read_record(path, for_display=True)
        except (OSError, ValueError) as exc:
            problem = f"not readable JSON ({printable(str(exc))})"
        else:
            problem = probe_problem(data)
        if problem is None:
            probes.append(data)
        elif warnings is not None:
            warnings.append(f"skipped {printable(str(path))}: {problem}")
    return probes


# A probe's fields besides its results that are read (absent: not said); a nodes of [1, 'a']
# was a traceback in the report, a gradient_bytes of 'x' or an env of 3 in bench project
_PROBE_OPTIONAL = {"backend": str, "nodes": int, "gradient_bytes": int, "env": dict,
                   "probe_id": str, "tag": str, "model": str, "dtype": str, "width": NUMBER,
                   "contention": dict}
CONTENTION_KEYS = ("compute_slowdown", "comm_slowdown")  # what bench project reads of it


def probe_problem(data: Any) -> str | None:
    """What makes this JSON unusable as an all-reduce probe, or None."""
    if not isinstance(data, dict) or data.get("kind") != "allreduce-probe":
        return "not an all-reduce probe (kind is not allreduce-probe)"
    world = data.get("world_size")
    if wrong_type(world, int) or world < 2:
        return f"world_size is {world!r}, not a count of 2 ranks or more"
    if not isinstance(data.get("device"), str):
        return "device missing or not a string"
    for key, kind in _PROBE_OPTIONAL.items():  # what the report and bench project read
        problem = optional_problem(key, key, data.get(key), kind)
        if problem:
            return problem
    for key in ("nodes", "gradient_bytes"):
        if data.get(key) is not None and data[key] < 1:
            return f"{key} is {data[key]}, not a positive count"
    for key in CONTENTION_KEYS if data.get("contention") is not None else ():
        value = data["contention"].get(key)
        if value is not None and (wrong_type(value, NUMBER) or value <= -1):
            return f"contention.{key} is {value!r}, not a number above -1"
    results = data.get("results")
    if not isinstance(results, list) or not results:
        return "results missing or empty"
    for i, point in enumerate(results):
        if not isinstance(point, dict):
            return f"results[{i}] is not an object"
        for key in ("bytes", "time_s", "busbw_GBps", *SPLIT_COLLECTIVES, MEAN):
            value = point.get(key)
            if key in (*SPLIT_COLLECTIVES, MEAN) and value is None:
                continue  # optional: older probes timed all-reduce alone, and its median
            if wrong_type(value, NUMBER) or value <= 0:
                return f"results[{i}].{key} is {value!r}, not a positive number"
    # the network's figures are fitted to the smallest and the largest message (bench
    # project: bandwidth from the time the extra bytes add, latency from the rest)
    points = sorted((r["bytes"], r["time_s"]) for r in results)
    (small, t_small), (large, t_large) = points[0], points[-1]
    if not (large > small and t_large > t_small):
        return (f"its largest message ({large:g} bytes, {t_large:g} s) is not larger and slower "
                f"than its smallest ({small:g} bytes, {t_small:g} s): no bandwidth to read")
    return None


def contention(probe: dict[str, Any]) -> tuple[float, float] | None:
    """(compute_slowdown, comm_slowdown) the probe measured: how much longer the model's
    compute took beside all-reduces of its gradient, and they beside it (each at least 0:
    below is the host's noise, not a gain); None for probes before 2026-12-03."""
    found = probe.get("contention")
    if not isinstance(found, dict) or found.get("compute_slowdown") is None:
        return None
    return (max(0.0, found["compute_slowdown"]), max(0.0, found.get("comm_slowdown") or 0.0))


def measured_split(probe: dict[str, Any]) -> bool:
    """Whether the probe timed the all-gather and reduce-scatter at every size."""
    return all(key in r for r in probe["results"] for key in SPLIT_COLLECTIVES)


def ideal_allreduce_s(probe: dict[str, Any], size: int, key: str = "time_s") -> float:
    """The probe's all-reduce time at ``size`` bytes, interpolated log-log between sizes
    (``key``: "all_gather_s" or "reduce_scatter_s" for those collectives of a tensor of
    ``size`` bytes, where ``measured_split``)."""
    points = sorted((r["bytes"], r[key]) for r in probe["results"])
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if b0 <= size <= b1:
            if b0 == b1:
                return t0
            f = (math.log(size) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return points[-1][1] * size / points[-1][0] if size > points[-1][0] else points[0][1]
