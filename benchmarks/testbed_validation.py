"""`bench project`'s model against real communication: 2-node runs across the shaped testbed
(benchmarks/testbed.py: two network namespaces, a veth link that `tc tbf` holds to a rate), no
injected delay. Each rate gets its own `bench probe` (tagged with the rate, as are the runs over
it, so that `bench project` pairs them), then DDP at every width x bucket cap, and at one rate
fsdp, `--ddp-comm-hook fp16` and gradient accumulation 4; every point
`--repeats` times, the repeats of a rate interleaved. Then `bench project OUTPUT --validate`
predicts each run from its own compute-only step, gradient timeline and its rate's probe, and
prints the errors beside the two null models'.
Horovod is not among them: it spans machines through horovodrun's ssh, and the namespaces
run no ssh server.

    python benchmarks/testbed_validation.py [--output results/testbed] [--repeats 3]
        [--only fsdp]   (that strategy's points again, after a change to how it is measured)

Root only (namespaces). Each node's processes are held to one core of their own, as if the
two nodes were two machines. tests/test_project.py runs a small version of it in CI."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.testbed import Testbed, unavailable  # noqa: E402

RATES_MBIT = (100, 1000, 10000)
WIDTHS = (0.25, 0.5)  # 2.8 MB and 11.2 MB of fp32 gradients
BUCKET_CAPS_MB = (1, 25)
OTHERS_RATE_MBIT = 100  # the other strategies and options: where communication leads
OTHERS_WIDTH = 0.5
# 16 px images: a quarter of the compute of 32 px at the same gradient, so that the rates
# span steps from compute-bound (10 Gbit/s) to communication-bound (100 Mbit/s) on one core
IMAGE_SIZE = 16


@dataclass(frozen=True)
class Point:
    """One configuration of the matrix (run ``repeats`` times)."""

    rate_mbit: float
    width: float
    bucket_cap_mb: float = 25
    strategy: str = "ddp"
    options: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        extra = " ".join(self.options)
        return (f"{self.rate_mbit:g} Mbit/s {self.strategy} x{self.width:g} buckets "
                f"{self.bucket_cap_mb:g} MB {extra}").strip()


def matrix(rates: tuple[float, ...]) -> list[Point]:
    points = [Point(rate, width, cap) for rate in rates for width in WIDTHS
              for cap in BUCKET_CAPS_MB]
    if OTHERS_RATE_MBIT in rates:
        others = [Point(OTHERS_RATE_MBIT, OTHERS_WIDTH, strategy="fsdp"),
                  Point(OTHERS_RATE_MBIT, OTHERS_WIDTH, options=("--ddp-comm-hook", "fp16")),
                  Point(OTHERS_RATE_MBIT, OTHERS_WIDTH, options=("--grad-accum", "4"))]
        # No SyncBN point: DDP refuses SyncBatchNorm for CPU tensors, so every CPU run's
        # BatchNorm is per replica (its record says per-replica-bn) with or without it.
        points += others
    return points


def tag(rate_mbit: float) -> str:
    """The network's name in the probe and in every run over it."""
    return f"testbed-{rate_mbit:g}mbit"


def _on_core(core: int):
    """What a child runs before it starts: it and its descendants keep to ``core``."""
    return lambda: os.sched_setaffinity(0, {core})


def on_nodes(net: Testbed, argv: list[str], timeout: float,
                  check: bool = True, nodes: int = 2) -> list[str]:
    """``bench ARGV --node-rank i`` in node i (its processes on core i, modulo the cores)
    of the first ``nodes``, all at once; what each printed. ``check``: a node whose bench
    fails ends the script with its output."""
    cores = sorted(os.sched_getaffinity(0))
    procs = [net.popen(i, [sys.executable, "-m", "bench", *argv, "--node-rank", str(i)],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       preexec_fn=_on_core(cores[i % len(cores)]))
             for i in range(nodes)]
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        if check and proc.returncode != 0:
            raise SystemExit(f"bench {' '.join(argv[:3])}... failed ({proc.returncode}):\n"
                             f"{out[-3000:]}")
        outs.append(out)
    return outs


def probe(net: Testbed, rate_mbit: float, output: Path, port: int) -> None:
    on_nodes(net, ["probe", "--cpu", "--gpus", "1", "--nodes", "2", "--rdzv-endpoint",
                         f"{net.address(0)}:{port}", "--width", "0.5", "--max-size", "16",
                         "--timeout", "600", "--tag", tag(rate_mbit), "--output", str(output)],
                   timeout=1800)


def probed_split(output: Path, rate_mbit: float) -> bool:
    """Whether the newest probe of this rate timed all-gather and reduce-scatter too (probes
    before 2026-11-27 did not: FSDP's points are predicted from them)."""
    from bench.records.probes import load_probes, measured_split

    kept = [p for p in load_probes(output) if p.get("tag") == tag(rate_mbit)]
    return bool(kept) and measured_split(kept[-1])


def run(net: Testbed, point: Point, output: Path, port: int, args: argparse.Namespace) -> str:
    argv = ["run", "--strategy", point.strategy, "--cpu", "--gpus", "1", "--nodes", "2",
            "--rdzv-endpoint", f"{net.address(0)}:{port}", "--data", "synthetic",
            "--synthetic-difficulty", "0", "--image-size", str(IMAGE_SIZE),
            "--train-limit", str(args.train_limit),
            "--test-limit", "64", "--epochs", str(args.epochs), "--batch-size", "32",
            "--width", f"{point.width:g}", "--comm-probe-steps", str(args.probe_steps),
            "--no-progress", "--timeout", "900", "--tag", tag(point.rate_mbit),
            "--output", str(output), *point.options]
    if point.strategy == "ddp":
        argv += ["--bucket-cap-mb", f"{point.bucket_cap_mb:g}"]
    outs = on_nodes(net, argv, timeout=3600)
    return next((line for line in outs[0].splitlines() if line.startswith("bench: ok")), "")


def supersede(output: Path, strategy: str, tags: set[str]) -> None:
    """Move the records of ``strategy`` over these networks aside: measured again, they
    would otherwise be repeats of a point measured another way."""
    runs = output / "runs"
    for path in sorted(runs.glob("*.json")):
        rec = json.loads(path.read_text())
        if rec.get("strategy") == strategy and rec.get("tag") in tags:
            (runs / "superseded").mkdir(exist_ok=True)
            path.rename(runs / "superseded" / path.name)
            print(f"testbed_validation: {path.name} -> superseded/", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="results/testbed", help="results folder")
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES_MBIT),
                        help="link rates in Mbit/s, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="the first is the warm-up")
    parser.add_argument("--train-limit", type=int, default=384,
                        help="images an epoch (a global batch of 32: 12 steps)")
    parser.add_argument("--probe-steps", type=int, default=6,
                        help="--comm-probe-steps: the compute-only step each run measures")
    parser.add_argument("--only", default=None, metavar="STRATEGY",
                        help="measure that strategy's points again, and no other (the old "
                             "records of those points go to OUTPUT/runs/superseded/; each "
                             "rate's probe is kept unless it lacks all-gather and "
                             "reduce-scatter times)")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"testbed_validation: {why}", file=sys.stderr)
        return 2
    output = Path(args.output)
    rates = tuple(float(r) for r in args.rates.split(","))
    points = matrix(rates)
    if args.only:
        points = [p for p in points if p.strategy == args.only]
        rates = tuple(r for r in rates if any(p.rate_mbit == r for p in points))
        if not points:
            print(f"testbed_validation: no {args.only} point at these rates", file=sys.stderr)
            return 2
        supersede(output, args.only, {tag(r) for r in rates})
    port, start = 29500, time.monotonic()
    for index, rate in enumerate(rates, start=20):
        with Testbed(nodes=2, rate_mbit=rate, index=index) as net:
            if not args.only or not probed_split(output, rate):
                probe(net, rate, output, port)
                port += 1
                print(f"[{time.monotonic() - start:6.0f} s] probe at {rate:g} Mbit/s done",
                      flush=True)
            for repeat in range(args.repeats):
                for point in (p for p in points if p.rate_mbit == rate):
                    done = run(net, point, output, port, args)
                    port += 1
                    print(f"[{time.monotonic() - start:6.0f} s] {point.label} #{repeat + 1}: "
                          f"{done}", flush=True)
    return subprocess.run([sys.executable, "-m", "bench", "project", str(output), "--validate"],
                          cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main())
