"""``bench probe``: the all-reduce ceiling. All-reduce of float32 tensors from 1 KiB to 256 MiB
and of exactly the model's gradient, over the backend and world size a run would use, started
by torchrun like a run's ranks. Reports nccl-tests' figures (algbw = bytes / time, busbw =
algbw · 2(n-1)/n) and the ideal time to all-reduce one gradient, and writes a record to
``OUTPUT/probes/`` that ``bench report`` uses as the comm ceiling per device and N. At each
size it also times the all-gather and the reduce-scatter of a tensor that size (FSDP's and
ZeRO's collectives): what they cost against an all-reduce is the backend's, not the bytes'
(gloo's reduce-scatter took 2.6 all-reduces' time on loopback), and ``bench project`` takes
FSDP's from them.

``python -m bench.commands.probe WORKER OUT.json SIZES...`` is one rank (torchrun's env)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.config.run_config import BACKENDS, check_rendezvous, check_timeout
from bench.models.registry import (
    DEFAULT_MODEL,
    ModelSpec,
    check_model,
    check_model_builds,
    short_name,
)
from bench.records.probes import KIB, MIB, bus_factor, probe_table
from bench.tools import terminal
from bench.tools.collectives import all_gather_flat, reduce_scatter_flat
from bench.tools.cores import usable_cores
from bench.tools.errors import EXIT_FAILED, EXIT_OK, ConfigError

PROBE_SIZES = [KIB * 4**k for k in range(10)]  # 1 KiB, 4 KiB, ..., 256 MiB
TARGET_S = 0.25  # time spent per size (at least MIN_ITERS iterations)
MIN_ITERS, MAX_ITERS = 3, 50


def _collectives(dist, torch, numel: int, world: int, device) -> dict[str, Any]:
    """One call of each collective a strategy may use, on ``numel`` floats (the all-reduced
    size): all-reduce (DDP, Horovod), and the all-gather and reduce-scatter that FSDP and
    ZeRO split it into (the gathered and scattered tensor of the same size, ``world``
    shards). Their cost per byte differs by backend (gloo's reduce-scatter is no ring)."""
    whole = torch.ones(numel - numel % world, dtype=torch.float32, device=device)
    shard = torch.ones(whole.numel() // world, dtype=torch.float32, device=device)
    return {"time_s": lambda: dist.all_reduce(whole),
            "all_gather_s": lambda: all_gather_flat(dist)(whole, shard),
            "reduce_scatter_s": lambda: reduce_scatter_flat(dist)(shard, whole)}


def _time_collective(dist, torch, call, device) -> tuple[float, int]:
    """Median seconds of one ``call()`` (after warm-up) on the slowest rank, and iterations."""

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for _ in range(2):
        once()
    first = once()
    iters = max(MIN_ITERS, min(MAX_ITERS, int(TARGET_S / max(first, 1e-6))))
    # every rank must run the same count: take rank 0's
    count = torch.tensor([iters], device=device)
    dist.broadcast(count, 0)
    times = [once() for _ in range(int(count.item()))]
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item(), int(count.item())


def rank_main(backend: str, out: str, sizes: list[int], timeout: float) -> None:
    """One rank of the probe (rank, world and rendezvous from torchrun's environment)."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cpu")
    if backend == "nccl" or os.environ.get("BENCH_PROBE_CUDA") == "1":
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", local % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    world = dist.get_world_size()
    rows = []
    for size in sizes:
        row: dict[str, Any] = {"bytes": size}
        for key, call in _collectives(dist, torch, size // 4, world, device).items():
            row[key], iters = _time_collective(dist, torch, call, device)
            if key == "time_s":
                algbw = size / row[key]
                row.update(iterations=iters, algbw_GBps=algbw / 1e9,
                           busbw_GBps=algbw * bus_factor(world) / 1e9)
        rows.append(row)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"world_size": world, "results": rows}))
    dist.destroy_process_group()


def topology_text() -> str | None:
    """``nvidia-smi topo -m`` (how the GPUs are linked), where there is one."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _wait(agent_proc: subprocess.Popen) -> int:
    """The agent's exit code; Ctrl-C or SIGTERM meanwhile end its session, ranks and all."""
    try:
        return agent_proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent_proc.pid, signal.SIGKILL)
        agent_proc.wait()
        raise


def run_probe(*, gpus: int, cpu: bool, backend: str | None, width: float, output: str,
              model: str = DEFAULT_MODEL,
              nodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
              timeout: float = 300.0, max_mib: float = 256.0, tag: str | None = None) -> int:
    import torch

    from bench.launch.launchers import agent, agent_log_dir, host_the_rendezvous
    from bench.launch.preflight import check_processes_fit, writable_folder
    from bench.records.environment import capture_env
    from bench.records.files import new_run_id, write_atomic
    from bench.tools.lifetime import start_dying_with_me
    from bench.tools.ports import MASTER_ADDR, free_port
    from bench.train.scratch import Scratch

    if not 0 < width <= 4:
        raise ConfigError(f"--width must lie in (0, 4] (got {width})")
    check_model(model, width)
    built = check_model_builds(ModelSpec(model, width))
    if gpus < 1 or nodes < 1:
        raise ConfigError("--gpus and --nodes must be at least 1")
    if gpus * nodes < 2:
        raise ConfigError("an all-reduce needs at least 2 ranks: --gpus 2 (or --nodes 2)")
    if nodes > 1 and not rdzv_endpoint:
        raise ConfigError("--nodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
    check_rendezvous(nodes, node_rank, rdzv_endpoint)
    check_timeout(timeout)
    device = "cpu" if cpu else "cuda"
    if not cpu and not torch.cuda.is_available():
        raise ConfigError("no CUDA GPU is visible here; add --cpu to probe gloo between CPU "
                          "processes")
    if cpu and backend == "nccl":
        raise ConfigError("--backend nccl needs CUDA GPUs; drop it with --cpu (gloo)")
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    if device == "cuda" and backend == "nccl" and gpus > torch.cuda.device_count():
        visible = torch.cuda.device_count()
        raise ConfigError(f"--gpus {gpus} but only {terminal.count(visible, 'GPU')} "
                          f"{'is' if visible == 1 else 'are'} visible (NCCL refuses two ranks "
                          "on one GPU)")
    if not max_mib > 0:
        raise ConfigError(f"--max-size must be positive (got {max_mib})")
    check_processes_fit(gpus)
    folder, _ = writable_folder(Path(output) / "probes")
    from bench.models.parameters import count_parameters

    grad = 4 * count_parameters(built)  # float32 gradients
    sizes = sorted({s for s in PROBE_SIZES if s <= max_mib * MIB} | {grad})
    probe_id = new_run_id("allreduce", gpus * nodes, device)
    partial = folder / f"{probe_id}.ranks.json"
    # torchrun's files go in a scratch folder: removed below, or by the next run or probe
    # when this one is killed outright
    scratch = Scratch.create(probe_id)
    try:  # the folder goes whatever happens from here on
        cmd = [*agent("torch.distributed.run"), agent_log_dir(scratch.root),
               f"--nproc-per-node={gpus}"]
        if nodes > 1:
            cmd += [f"--nnodes={nodes}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id=probe-{rdzv_endpoint}",
                    *host_the_rendezvous(node_rank)]
        else:
            cmd += ["--nnodes=1", f"--master-addr={MASTER_ADDR}",
                    f"--master-port={free_port()}"]
        cmd += ["-m", "bench.commands.probe", "WORKER", backend, str(partial), str(timeout),
                *map(str, sizes)]
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, usable_cores() // gpus)),
                   BENCH_PROBE_CUDA="1" if device == "cuda" else "0")
        print(f"bench probe: all-reduce, all-gather and reduce-scatter, {gpus * nodes} ranks "
              f"({device}, {backend}), {len(sizes)} sizes", flush=True)
        # The agent dies with bench (kill -9 included: a 2-node probe's agent waits minutes
        # for its peer), its ranks with it (they arm their death signal: see the end of this
        # file). In its own session, a Ctrl-C reaches bench alone, which ends it.
        agent_proc = start_dying_with_me(cmd, env=env, start_new_session=True)
        returncode = _wait(agent_proc)
    finally:
        scratch.remove()
    if returncode == 0 and nodes > 1 and not partial.exists():
        print("bench probe: done; rank 0 ran on another node, which writes the record")
        return EXIT_OK
    if returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        print(f"bench probe: failed (torchrun exit {returncode})", file=sys.stderr)
        return EXIT_FAILED
    measured = json.loads(partial.read_text())
    partial.unlink()
    at_grad = next(r for r in measured["results"] if r["bytes"] == grad)
    record: dict[str, Any] = {
        "kind": "allreduce-probe", "probe_id": probe_id, "device": device, "backend": backend,
        "world_size": measured["world_size"], "nodes": nodes, "dtype": "float32",
        "model": model, "width": width, "gradient_bytes": grad,
        "gradient_allreduce_s": at_grad["time_s"],
        "results": measured["results"], "env": capture_env(device),
        "topology": topology_text() if device == "cuda" else None,
    }
    if tag:
        record["tag"] = tag
    path = folder / f"{probe_id}.json"
    write_atomic(path, record)
    print(probe_table(record), end="")
    scaled = f" x{width:g}" if width != 1.0 else ""  # as the report names a workload's model
    print(f"bench probe: one {short_name(model)}{scaled} gradient ({grad / MIB:.1f} MiB) "
          "all-reduces in "
          f"{1000 * at_grad['time_s']:.2f} ms at best\nbench probe: record {path}")
    return EXIT_OK


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "WORKER":
        from bench.tools.lifetime import die_with_parent

        die_with_parent(os.getppid())  # torchrun's agent killed outright: this rank too
        _, _, backend_arg, out_arg, timeout_arg, *size_args = sys.argv
        rank_main(backend_arg, out_arg, [int(s) for s in size_args], float(timeout_arg))
        from bench.tools.quick_exit import exit_now

        exit_now(0)


USES_TORCH = True


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench probe``'s options (``help``: its line in ``bench --help``)."""
    probe = sub.add_parser("probe", help=help)
    probe.add_argument("--gpus", type=int, default=2,
                       help="ranks per machine (GPUs, or CPU processes with --cpu; default 2)")
    probe.add_argument("--cpu", action="store_true", help="CPU processes (gloo)")
    probe.add_argument("--backend", choices=BACKENDS, default=None,
                       help="default nccl on CUDA, gloo on CPU")
    probe.add_argument("--model", default="resnet18-cifar",
                       help="the model whose gradient size is also probed (as bench run's "
                            "--model; default resnet18-cifar, 100 classes)")
    probe.add_argument("--width", type=float, default=1.0,
                       help="resnet18-cifar's channel multiplier (default 1.0)")
    probe.add_argument("--nodes", type=int, default=1, help="machines (run it on each; default 1)")
    probe.add_argument("--node-rank", type=int, default=0, help="this machine's index (default 0)")
    probe.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT (--nodes > 1)")
    probe.add_argument("--timeout", type=float, default=300.0,
                       help="seconds a collective may wait (default 300)")
    probe.add_argument("--max-size", type=float, default=256.0,
                       help="largest message in MiB (default 256; the gradient is always "
                            "probed)")
    probe.add_argument("--output", default="results",
                       help="results folder; the record goes to OUTPUT/probes/ (default results)")
    probe.add_argument("--tag", default=None,
                       help="names the network probed: bench project matches it to the runs "
                            "of the same --tag (untagged probes: to any run)")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    return run_probe(gpus=args.gpus, cpu=args.cpu, backend=args.backend, width=args.width,
                     model=args.model, output=args.output, nodes=args.nodes,
                     node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                     timeout=args.timeout, max_mib=args.max_size, tag=args.tag)
