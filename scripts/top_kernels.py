"""Where a profiled run's device time goes: its record's last epoch (time, img/s, MFU) and the
kernels of its torch.profiler trace summed by name, the largest first (on CPU, where a trace
has no kernels, its operators).

    python3 scripts/top_kernels.py OUTPUT [--top 15]

OUTPUT is a `bench run --profile-steps K --output OUTPUT` folder (runs/*.json, traces/).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report.trace_breakdown import read_trace


def epoch_line(record: dict) -> str:
    if not record.get("per_epoch"):
        return f"{record.get('run_id')}: no epoch ({record.get('status')})"
    last = record["per_epoch"][-1]
    mfu = last.get("mfu")
    return (f"{record['run_id']}: last epoch {last['train_time_s']:.3f} s, "
            f"{last['images_per_s']:,.0f} img/s, MFU "
            f"{'—' if mfu is None else f'{100 * mfu:.1f} %'}, compile "
            f"{record.get('compile_time_s') or 0:.0f} s")


def top(trace: Path, count: int) -> list[str]:
    events = read_trace(trace).get("traceEvents") or []
    cats = {ev.get("cat") for ev in events}
    cat = "kernel" if "kernel" in cats else "cpu_op"
    spent: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for ev in events:
        if ev.get("cat") == cat and "dur" in ev:
            spent[ev["name"]] += ev["dur"]
            calls[ev["name"]] += 1
    total = sum(spent.values())
    if not total:
        return [f"{trace.name}: no {cat} events"]
    lines = [f"{trace.name}: {total / 1e3:.1f} ms of {cat} time over the profiled steps"]
    for name, micros in spent.most_common(count):
        lines.append(f"  {100 * micros / total:5.1f} %  {micros / 1e3:9.2f} ms  "
                     f"x{calls[name]:<5d} {name[:100]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    records = sorted((args.output / "runs").glob("*.json"))
    traces = sorted((args.output / "traces").glob("*.json*"))
    if not records and not traces:
        print(f"top_kernels: no runs/*.json or traces/ under {args.output}", file=sys.stderr)
        return 2
    for path in records:
        print(epoch_line(json.loads(path.read_text())))
    for trace in traces:
        print("\n".join(top(trace, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
