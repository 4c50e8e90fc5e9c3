"""Training throughput per strategy on synthetic data, in the style of Horovod's synthetic
benchmark: a warm-up epoch, then N timed epochs of a fixed number of steps; images/s as
mean ± 1.96σ over the timed epochs, in total and per replica. Each run is a normal
``bench run`` whose record lands in ``--output`` (default ``results/throughput``), so
``bench report --results results/throughput`` tables and plots them.

    python benchmarks/throughput.py --cpu --strategies dp,ddp,ddp-spawn,horovod --gpus 2
    python benchmarks/throughput.py --strategies ddp,ddp-amp --gpus 1,2,4 --loader gpu
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default="dp,ddp,ddp-spawn,ddp-amp,horovod,fsdp")
    parser.add_argument("--gpus", default="2", help="comma-separated world sizes")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=4, help="1 warm-up + N timed")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--loader", default="gpu")
    parser.add_argument("--output", default=str(ROOT / "results" / "throughput"))
    parser.add_argument("extra", nargs="*", help="more `bench run` options after --")
    opts = parser.parse_args()
    rows, failures = [], 0
    for strategy in opts.strategies.split(","):
        for world in (int(n) for n in opts.gpus.split(",")):
            cmd = [sys.executable, "-m", "bench", "run", "--strategy", strategy,
                   "--gpus", str(world), "--data", "synthetic", "--loader", opts.loader,
                   "--epochs", str(opts.epochs), "--batch-size", str(opts.batch_size),
                   "--train-limit", str(opts.steps * opts.batch_size), "--test-limit", "256",
                   "--width", str(opts.width), "--no-progress", "--output", opts.output,
                   "--tag", "throughput", *opts.extra]
            if opts.cpu:
                cmd.append("--cpu")
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            found = re.search(r"record:? (\S+\.json)", out.stdout)
            if not found:
                failures += 1
                print(f"{strategy} N={world}: {out.stderr.strip().splitlines()[-1:]}")
                continue
            path = Path(found.group(1))
            record = json.loads(path.read_text())
            if record["status"] != "ok":
                failures += 1
                rows.append((strategy, world, record["precision"], None, None, record["error"]))
                continue
            rates = [e["images_per_s"] for e in record["per_epoch"][1:]]
            mean = statistics.fmean(rates)
            spread = 1.96 * statistics.stdev(rates) if len(rates) > 1 else 0.0
            rows.append((strategy, record["world_size"], record["precision"], mean, spread,
                         mean / record["world_size"]))
    print(f"{'strategy':<10} {'N':>2} {'precision':<9} {'img/s (mean ± 1.96σ)':>22} "
          f"{'per replica':>12}")
    for strategy, world, precision, mean, spread, per in rows:
        if mean is None:
            print(f"{strategy:<10} {world:>2} {precision:<9} {'—':>22} {per}")
        else:
            print(f"{strategy:<10} {world:>2} {precision:<9} {f'{mean:.1f} ± {spread:.1f}':>22} "
                  f"{per:>12.1f}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
