"""`bench probe` across two nodes of the testbed (benchmarks/testbed.py) at several link rates:
what bus bandwidth the shaped link gives a gloo all-reduce, against the rate it was given.
Root only (network namespaces). The probes' records go to OUTPUT/probes/ (one per rate).

    python benchmarks/testbed_probe.py --rates 100,1000,10000 --output results/testbed
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.testbed import Testbed, unavailable

ROOT = Path(__file__).resolve().parents[1]


def probe(rate_mbit: float, output: Path, max_mib: float, width: float) -> dict:
    before = set((output / "probes").glob("*.json"))
    with Testbed(nodes=2, rate_mbit=rate_mbit) as net:
        procs = [net.popen(i, [sys.executable, "-m", "bench", "probe", "--cpu", "--gpus", "1",
                               "--nodes", "2", "--node-rank", str(i), "--rdzv-endpoint",
                               f"{net.address(0)}:29400", "--width", str(width),
                               "--max-size", str(max_mib), "--timeout", "300",
                               "--output", str(output)],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(2)]
        for proc in procs:
            out, _ = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise SystemExit(f"probe at {rate_mbit:g} Mbit/s failed:\n{out[-3000:]}")
    [path] = set((output / "probes").glob("*.json")) - before
    record = json.loads(path.read_text())
    record["testbed"] = {"nodes": 2, "link_rate_mbit": rate_mbit,
                         "shaping": "tc tbf on each veth end (no added delay: no netem here)"}
    path.write_text(json.dumps(record, indent=1))
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,1000,10000", help="Mbit/s, comma-separated")
    parser.add_argument("--output", default="results/testbed", help="results folder")
    parser.add_argument("--max-size", type=float, default=64, help="largest message, MiB")
    parser.add_argument("--width", type=float, default=1.0, help="the model gradient probed")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"testbed_probe: {why}", file=sys.stderr)
        return 2
    output = Path(args.output)
    # the smallest message's median call and its mean: on a busy host the two part, the
    # median landing on 0.3 ms or on a scheduler tick (docs/projection.md)
    print(f"{'link (Mbit/s)':>14} {'largest message':>16} {'busbw (MB/s)':>13} {'of the link':>12}"
          f" {'1 KiB latency (ms)':>19} {'1 KiB mean (ms)':>16}")
    for rate in [float(r) for r in args.rates.split(",")]:
        rec = probe(rate, output, args.max_size, args.width)
        rows = sorted(rec["results"], key=lambda r: r["bytes"])
        big, small = rows[-1], rows[0]
        busbw = big["busbw_GBps"] * 1000
        print(f"{rate:14g} {big['bytes'] / 2**20:13.1f} MiB {busbw:13.1f} "
              f"{busbw / (rate / 8):11.0%} {1000 * small['time_s']:19.3f} "
              f"{1000 * small['time_mean_s']:16.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
