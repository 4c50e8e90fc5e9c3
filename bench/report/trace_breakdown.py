"""Where a GPU's time went during the profiled steps (``--profile-steps``): compute,
communication, memory copies and idle, as Holistic Trace Analysis's temporal breakdown
defines them, read from the torch.profiler trace's kernel events (no torch import).

Over the window from the first kernel's start to the last kernel's end on a device, time is
counted once, in this order: *compute* when any compute kernel runs; *communication* when
only collectives (NCCL kernels) run, i.e. communication not hidden under compute;
*memory* when only copies or memsets run; *idle* when nothing runs. The four add up to the
window. CPU-only traces have no kernel events and no breakdown.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from bench.tools import terminal

KINDS = ("compute", "communication", "memory", "idle")
_GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def kind_of(event: dict[str, Any]) -> str:
    """compute | communication | memory, for one GPU event."""
    if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    name = str(event.get("name", "")).lower()
    return "communication" if "nccl" in name else "compute"


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of the intervals."""
    total, end = 0.0, -float("inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def breakdown(events: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per device: seconds of each kind and the window, from Chrome-trace events (µs)."""
    by_device: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for ev in events:
        if not isinstance(ev, dict) or ev.get("cat") not in _GPU_CATEGORIES or ev.get(
                "ph", "X") != "X":
            continue
        try:  # an event whose figures are not numbers (a hand-edited trace) times nothing
            start, dur = float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0))
            args = ev.get("args")
            device = int((args if isinstance(args, dict) else {}).get("device", 0))
        except (TypeError, ValueError):
            continue
        kinds = by_device.setdefault(device, {k: [] for k in KINDS[:3]})
        kinds[kind_of(ev)].append((start, start + dur))
    result = {}
    for device, kinds in sorted(by_device.items()):
        every = kinds["compute"] + kinds["communication"] + kinds["memory"]
        window = max(stop for _, stop in every) - min(start for start, _ in every)
        compute = _covered(kinds["compute"])
        with_comm = _covered(kinds["compute"] + kinds["communication"])
        busy = _covered(every)
        result[device] = {
            "window_s": window / 1e6, "compute_s": compute / 1e6,
            "communication_s": (with_comm - compute) / 1e6,
            "memory_s": (busy - with_comm) / 1e6, "idle_s": (window - busy) / 1e6,
        }
    return result


# A profile of a few steps is tens of MB; a file far larger is not one (a record may name
# any path: /proc/kcore, a sparse file, a gzip bomb), and json would hold it all in memory.
MAX_TRACE_BYTES = 1 << 30
TRACE_SUFFIXES = (".trace.json", ".trace.json.gz")


def read_trace(path: Path, max_bytes: int = MAX_TRACE_BYTES) -> dict[str, Any]:
    """The Chrome trace at ``path`` (gzipped where it ends in .gz); ValueError where it is
    none: a file cut short (a run killed while its trace was written or compressed), over
    ``max_bytes`` (decompressed), or JSON of another shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except EOFError as exc:  # gzip's stream cut short: neither OSError nor ValueError
        raise ValueError(f"{path.name} is cut short ({exc})") from None
    if len(data) > max_bytes:
        raise ValueError(f"{path.name} holds over {max_bytes / 2**30:g} GiB, more than a "
                         "profile of a few steps; read it with Holistic Trace Analysis")
    try:
        trace = json.loads(data)
    except RecursionError:  # '[' nested deeper than Python's stack
        raise ValueError(f"{path.name} nests too deep to be a Chrome trace") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents", []), list):
        raise ValueError(f"{path.name} is not a Chrome trace (an object with a traceEvents "
                         "list)")
    return trace


def trace_of(rec: dict[str, Any], results: Path) -> Path | None:
    """The record's trace: where it says, else beside its results (records move). Only a
    ``*.trace.json[.gz]`` in a ``traces`` folder, what --profile-steps writes: a record
    that names another file (a shared record naming a key or a device) has it left unread."""
    named = rec.get("profile_trace")
    if not named or not isinstance(named, str):
        return None
    given = Path(named)
    if given.parent.name != "traces" or not given.name.endswith(TRACE_SUFFIXES):
        shown = named if len(named) <= 60 else "..." + named[-57:]
        raise ValueError(f"the record names {shown} as its trace, not a "
                         f"traces/*{TRACE_SUFFIXES[0]}[.gz] file")
    for path in (given, results / "traces" / given.name):
        if path.is_file():
            return path
    return None


def trace_rows(records: list[dict[str, Any]], results: Path) -> list[dict[str, Any]]:
    """One row per (run, device) whose trace exists and holds GPU kernels."""
    rows = []
    for rec in records:
        try:
            path = trace_of(rec, Path(results))
            if path is None:
                continue
            trace = read_trace(path)
        except (OSError, ValueError) as exc:
            rows.append({"run_id": rec.get("run_id"), "note": f"unreadable trace: {exc}"})
            continue
        info = trace.get("distributedInfo")
        rank = info.get("rank", 0) if isinstance(info, dict) else 0
        for device, secs in breakdown(trace.get("traceEvents") or []).items():
            window = secs["window_s"] or float("nan")
            rows.append({"run_id": rec.get("run_id"), "strategy": rec.get("strategy"),
                         "world_size": rec.get("world_size"), "rank": rank, "device": device,
                         "steps": rec.get("profile_steps"), "window_ms": 1e3 * window,
                         **{f"{k}_pct": 100 * secs[f"{k}_s"] / window for k in KINDS}})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The terminal view: one line per run and device."""
    run = max([len("run"), *(len(str(r["run_id"])) for r in rows)])
    lines = ["GPU time in profiler traces (HTA temporal breakdown, rank 0's profiled steps):",
             f"  {'run':<{run}}  {'strategy':<10} {'N':>3} {'window ms':>9}  "
             + "  ".join(f"{k:>{max(len(k), 6)}}" for k in KINDS)]
    for r in rows:
        if "note" in r:
            lines += terminal.wrap(f"  {r['run_id']:<{run}}  {r['note']}",
                                   subsequent_indent=" " * (run + 4))
            continue
        lines.append(f"  {r['run_id']:<{run}}  {r['strategy']:<10} {r['world_size']:>3} "
                     f"{r['window_ms']:>9.1f}  "
                     + "  ".join(f"{r[k + '_pct']:>{max(len(k), 6) - 1}.1f}%" for k in KINDS))
    return "\n".join(lines) + "\n"
