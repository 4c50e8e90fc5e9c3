"""What `bench report` costs on a large results folder: wall time and peak memory.

Writes N run records of one workload (default 3,000: 8 strategies x world sizes 1, 2, 4, 8
x repeats, each with 10 epochs, a few failed), made from a committed record with the figures
varied, then times `bench report` on them in a fresh process, with the tables and plots
written and with `--no-write`. Peak memory is the child's maximum resident set size.

    python benchmarks/report_cost.py               # 3,000 records
    python benchmarks/report_cost.py --records 300 --keep /tmp/many
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ["dp", "ddp", "ddp-spawn", "ddp-launch", "ddp-amp", "ddp-apex", "horovod", "fsdp"]
WORLD_SIZES = [1, 2, 4, 8]


def template_record() -> dict:
    """A committed record to vary: the newest ok CPU ddp run with 2 processes (`make table`
    measures it again, so no file name is fixed)."""
    paths = sorted((ROOT / "results" / "runs").glob("*-ddp-2cpu-*.json"), reverse=True)
    for path in paths:
        rec = json.loads(path.read_text())
        if rec.get("status") == "ok" and rec.get("grad_accum", 1) == 1 and rec.get(
                "device") == "cpu" and rec.get("per_epoch"):
            return rec
    raise SystemExit("report_cost: no ok CPU ddp record with 2 processes in results/runs "
                     "(`make table` writes one)")


def make_records(folder: Path, count: int, epochs: int = 10, seed: int = 0) -> None:
    """``count`` records of one workload in ``folder/runs``."""
    rng = random.Random(seed)
    template = template_record()
    runs = folder / "runs"
    runs.mkdir(parents=True)
    combos = [(s, n) for s in STRATEGIES for n in WORLD_SIZES]
    for index in range(count):
        strategy, world = combos[index % len(combos)]
        repeat = index // len(combos)
        rec = copy.deepcopy(template)
        run_id = f"2026{index:08d}Z-{strategy}-{world}cpu-{index:06x}"
        speed = 70.0 * world * (0.85 + 0.1 * rng.random())
        rec.update(run_id=run_id, strategy=strategy, world_size=world, processes=world,
                   gpus_requested=world, seed=repeat, global_batch=64,
                   per_rank_batch=max(1, 64 // world))
        rec["config"].update(strategy=strategy, gpus=world, seed=repeat)
        # as this version writes it: the reference start drawn by the run itself
        rec["initial_reference_fingerprint"] = rec["initial_param_fingerprint"]
        first = rec["per_epoch"][-1]
        rec["per_epoch"] = []
        for epoch in range(1, epochs + 1):
            time = 1536 / (speed * rng.uniform(0.97, 1.03)) * (1.3 if epoch == 1 else 1.0)
            row = dict(first, epoch=epoch, warmup=epoch == 1, train_time_s=time,
                       train_images=1536, images_per_s=1536 / time,  # as a run writes it
                       top1=min(0.99, 0.1 * epoch + 0.02 * rng.random()))
            rec["per_epoch"].append(row)
        if index % 97 == 13:  # a few failed runs, as a long sweep has
            rec.update(status="failed", error="rank 1: RuntimeError: injected fault [in train "
                       "epoch 2 step 3]")
            rec["per_epoch"] = rec["per_epoch"][:1]
        times = [e["train_time_s"] for e in rec["per_epoch"] if not e["warmup"]]
        rec["summary"].update(median_epoch_time_s=sorted(times)[len(times) // 2] if times
                              else None, median_images_per_s=speed,
                              final_top1=rec["per_epoch"][-1]["top1"], timed_epochs=len(times))
        (runs / f"{run_id}.json").write_text(json.dumps(rec))


def time_report(folder: Path, *extra: str) -> tuple[float, float]:
    """(seconds, peak MiB) of one `bench report` in a fresh process."""
    cmd = [sys.executable, "-m", "bench", "report", "--results", str(folder), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench report failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:  # an earlier child was bigger: ru_maxrss keeps the largest
        print("note: peak memory not below an earlier run's; figure is an upper bound")
    return seconds, peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--keep", help="write the records here and keep them")
    args = parser.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-report-"))
    if args.keep and folder.exists():
        shutil.rmtree(folder)
    try:
        start = time.perf_counter()
        make_records(folder, args.records)
        print(f"{args.records} records written in {time.perf_counter() - start:.1f} s "
              f"({sum(p.stat().st_size for p in (folder / 'runs').iterdir()) / 2**20:.0f} MiB)")
        # --no-write first: ru_maxrss only grows, so the smaller job goes first.
        for label, extra in (("table only (--no-write)", ["--no-write"]),
                             ("tables and plots written", [])):
            seconds, mib = time_report(folder, *extra)
            print(f"bench report, {label:<24} {seconds:6.2f} s   peak {mib:6.0f} MiB")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
