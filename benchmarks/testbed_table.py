"""`make table`'s communication-bound block: the strategies at N=2 across two nodes joined by a
shaped link (benchmarks/testbed.py: two network namespaces, a veth pair that `tc tbf` holds
to --rate-mbit, each node's processes on a core of their own, as if on two machines).

On loopback every CPU row is compute-bound and the strategies tie; over 1 Gbit/s the full
ResNet-18's 44.7 MB gradient takes ~0.36 s a step, a third of its compute here, so what a
strategy sends and when it sends it shows: fp16 and PowerSGD compression, smaller buckets
(more overlap), FSDP's all-gathers and reduce-scatters, ZeRO's parameter broadcast, fewer
all-reduces with gradient accumulation. The link is probed first and every run carries its
name (``--tag testbed-<rate>mbit``), so `bench report` keeps these rows in a block of their
own ("..., over testbed-1000mbit") and `bench project` pairs them with that probe.

Horovod is left out: horovodrun reaches another machine by ssh, and the namespaces run no
ssh server. dp, ddp-spawn and ddp-launch start one machine's ranks only.

    python benchmarks/testbed_table.py [--rate-mbit 1000] BENCH RUN OPTIONS (with --output)

Root only (namespaces): elsewhere it says why and exits 2, writing nothing."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.testbed import Testbed, unavailable  # noqa: E402
from benchmarks.testbed_validation import on_nodes, tag  # noqa: E402

# (row, strategy, options): each a row of the block
ROWS = (
    ("ddp", "ddp", ()),
    ("ddp-amp", "ddp-amp", ()),
    ("ddp-zero", "ddp-zero", ()),
    ("fsdp", "fsdp", ()),
    ("ddp fp16 hook", "ddp", ("--ddp-comm-hook", "fp16")),
    ("ddp powersgd hook", "ddp", ("--ddp-comm-hook", "powersgd")),
    ("ddp buckets 1 MB", "ddp", ("--bucket-cap-mb", "1")),
    ("ddp accum 4", "ddp", ("--grad-accum", "4")),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)  # the rest are bench run's options
    parser.add_argument("--rate-mbit", type=float, default=1000.0)
    parser.add_argument("--output", required=True, help="results folder (bench run's)")
    parser.add_argument("--port", type=int, default=29600, help="first rendezvous port")
    args, run_args = parser.parse_known_args()
    why = unavailable()
    if why:
        print(f"testbed_table: no testbed here ({why}): the communication-bound block is "
              "not measured", file=sys.stderr)
        return 2
    name, port, start = tag(args.rate_mbit), args.port, time.monotonic()
    with Testbed(nodes=2, rate_mbit=args.rate_mbit, index=30) as net:
        endpoint = ["--nodes", "2", "--gpus", "1", "--rdzv-endpoint"]
        on_nodes(net, ["probe", "--cpu", *endpoint, f"{net.address(0)}:{port}",
                             "--max-size", "64", "--timeout", "600", "--tag", name,
                             "--output", args.output], timeout=1800)
        print(f"[{time.monotonic() - start:5.0f} s] probe of {name} done", flush=True)
        for row, strategy, options in ROWS:
            port += 1
            # a row that fails is a row of the table too (its record says why): go on
            outs = on_nodes(net, ["run", "--strategy", strategy, *run_args, *endpoint,
                                       f"{net.address(0)}:{port}", "--tag", name,
                                       "--timeout", "900", "--output", args.output,
                                       *options], timeout=3600, check=False)
            done = ([line for line in outs[0].splitlines() if line.startswith("bench: ")]
                    or ["?"])[-1]  # its last word: ok, failed and why
            print(f"[{time.monotonic() - start:5.0f} s] {row} over {name}: {done}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
