"""`bench project`'s model against runs it can check on this machine: 2 CPU ranks over gloo,
with several injected communication delays (BENCH_SLOW_COMM_MS: a blocking wait before each
DDP bucket's all-reduce, as a slow link would add), small and large --bucket-cap-mb, 2
loopback nodes, and PowerSGD (its own work measured by the run, its collectives blocking
backward over gloo). Each run is predicted from its own compute-only step, its measured gradient
timeline and the `bench probe` of the same ranks and nodes; the errors are printed, and also
those of the model without the timeline (gradients assumed ready evenly over backward).

    python benchmarks/projection_validation.py [--output DIR] [--epochs 3]

tests/test_project.py runs five of its points (every delay, bucket size, node count and hook
once) on every CI run."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tools.ports import free_port  # noqa: E402

WIDTH = "0.25"  # ResNet-18 at a quarter width: 2.8 MB of fp32 gradients


@dataclass(frozen=True)
class Point:
    label: str
    bucket_cap_mb: float
    delay_ms: float
    nodes: int = 1
    comm_hook: str = "none"


MATRIX = (
    Point("buckets 1 MB", 1, 0),
    Point("buckets 1 MB", 1, 10),
    Point("buckets 1 MB", 1, 30),
    Point("buckets 0.25 MB", 0.25, 10),
    Point("buckets 25 MB", 25, 30),
    Point("2 loopback nodes", 1, 10, nodes=2),
    Point("PowerSGD rank 1, buckets 1 MB", 1, 0, comm_hook="powersgd"),
)


def _bench(args: list[str], env: dict[str, str] | None = None,
           cores: set[int] | None = None) -> subprocess.Popen:
    """``python -m bench ARGS``; ``cores``: the CPUs it (and its ranks) may use, as if this
    machine were one of several (bench sizes its threads by the CPUs it may use)."""
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores
                            else None)


def _wait(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        out = proc.communicate(timeout=600)[0]
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, proc.args))} failed:\n{out}")


def _per_node(args: list[str], nodes: int, env: dict[str, str] | None = None) -> None:
    """Run ``bench ARGS`` once (1 node: 2 ranks) or on 2 loopback nodes (1 rank each, each
    node on its own share of the CPUs: two processes that each sized their threads for the
    whole machine would spin against each other, as no two real nodes do)."""
    if nodes == 1:
        _wait([_bench([*args, "--gpus", "2"], env)])
        return
    endpoint = f"127.0.0.1:{free_port()}"
    cpus = sorted(os.sched_getaffinity(0))
    _wait([_bench([*args, "--gpus", "1", "--nodes", str(nodes), "--node-rank", str(rank),
                   "--rdzv-endpoint", endpoint, *(["--rdzv-id", "loopback"] if args[0] == "run"
                                                  else [])], env,
                  cores=set(cpus[rank::nodes]) or set(cpus))
           for rank in range(nodes)])


def run_matrix(output: Path, epochs: int = 2, matrix: tuple[Point, ...] = MATRIX) -> None:
    """A probe per node count, then each point's run, into ``output``."""
    for nodes in sorted({p.nodes for p in matrix}):
        _per_node(["probe", "--cpu", "--width", WIDTH, "--max-size", "16",
                   "--output", str(output)], nodes)
    for p in matrix:
        _per_node(["run", "--strategy", "ddp", "--cpu", "--width", WIDTH, "--batch-size", "64",
                   "--epochs", str(epochs), "--train-limit", "512", "--test-limit", "64",
                   "--data", "synthetic", "--bucket-cap-mb", f"{p.bucket_cap_mb:g}",
                   "--comm-probe-steps", "10", "--ddp-comm-hook", p.comm_hook, "--no-progress",
                   "--output", str(output)],
                  p.nodes, {"BENCH_SLOW_COMM_MS": f"{p.delay_ms:g}"})


def without_timeline(output: Path) -> list[float]:
    """The same predictions with gradients assumed ready evenly over backward (the model
    before the timeline was measured): errors in %, in the validation file's order."""
    from bench.project.from_records import matching_probe, workload_of
    from bench.project.validation import predict_measured
    from bench.records.files import load_records
    from bench.records.probes import load_probes

    records = {r["run_id"]: r for r in load_records(output)[0]}
    probes = load_probes(output)
    errors = []
    for point in json.loads((output / "projection-validation.json").read_text())["points"]:
        rec = records[point["run_id"]]
        work = replace(workload_of(rec), timeline=None)
        step = predict_measured(rec, work, matching_probe(rec, probes)).step_s
        errors.append(100 * (1000 * step - point["measured_ms"]) / point["measured_ms"])
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, help="results folder (default: a temporary one)")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    output = args.output or Path(tempfile.mkdtemp(prefix="projection-validation-"))
    run_matrix(output, args.epochs)
    done = subprocess.run([sys.executable, "-m", "bench", "project", str(output),
                           "--validate"], cwd=ROOT)
    if done.returncode != 0:
        return done.returncode
    even = without_timeline(output)
    print("without the measured timeline (gradients ready evenly over backward): "
          + ", ".join(f"{e:+.1f} %" for e in even))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
