"""``bench probe``: the all-reduce ceiling. All-reduce of float32 tensors from 1 KiB to 256 MiB
and of exactly the model's gradient, over the backend and world size a run would use, started
by torchrun like a run's ranks. Reports nccl-tests' figures (algbw = bytes / time, busbw =
algbw · 2(n-1)/n) and the ideal time to all-reduce one gradient, and writes a record to
``OUTPUT/probes/`` that ``bench report`` uses as the comm ceiling per device and N. At each
size it also times the all-gather and the reduce-scatter of a tensor that size (FSDP's and
ZeRO's collectives): what they cost against an all-reduce is the backend's, not the bytes'
(gloo's reduce-scatter took 2.6 all-reduces' time on loopback), and ``bench project`` takes
FSDP's from them. Last, it times the model's forward and backward alone and beside
all-reduces of its gradient (``contention``): what communication running under backward
costs the compute, and the compute the communication (gloo's copies take the cores backward
needs; NCCL's kernels a few SMs), which ``bench project`` counts where buckets overlap
backward.

``python -m bench.commands.probe WORKER OUT.json SIZES...`` is one rank (torchrun's env)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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
CONTENTION_BATCH = 32  # default images per rank in the contention measurement's steps
CONTENTION_TARGET_S = 0.5  # compute timed per window (at least CONTENTION_MIN_STEPS steps)
CONTENTION_MIN_STEPS, CONTENTION_MAX_STEPS = 2, 200
CONTENTION_PAIRS = 3  # windows alone and beside, alternated (a host's speed drifts)
CONTENTION_MAX_QUEUED = 4096  # all-reduces queued at once (NVLink: a 45 MB one in 0.2 ms)


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


def _slowest(dist, torch, value: float, device) -> float:
    """``value`` on the rank where it is largest (every rank calls it)."""
    return _slowest_each(dist, torch, [value], device)[0]


def _slowest_each(dist, torch, values: list[float], device) -> list[float]:
    """Each of ``values`` on the rank where it is largest, in one all-reduce (every rank
    calls it with as many values)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _time_collective(dist, torch, call, device) -> tuple[float, float, int]:
    """Median and mean seconds of one ``call()`` (after warm-up), each on the rank where it
    is largest, and the iterations. The median is the table's and bench project's; the
    mean is kept beside it, since on a busy host the two part: gloo's small messages take
    about 0.3 ms or a scheduler tick (4 ms), in shares that move around a half from one
    set of calls to the next, so their median jumps between the two and their mean does
    not (docs/projection.md, benchmarks/small_messages.py)."""

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
    median, mean = _slowest_each(
        dist, torch, [statistics.median(times), statistics.fmean(times)], device)
    return median, mean, int(count.item())


def measure_contention(dist, torch, device, spec, batch: int) -> dict[str, Any]:
    """The model's forward and backward (``batch`` random images a rank) timed
    alone and beside all-reduces of its gradient queued to outlast them, in alternated
    windows of the same steps: ``compute_slowdown`` is how much longer the compute took
    with communication running the whole window (what overlapping a bucket with backward
    costs backward), ``comm_slowdown`` how much longer each all-reduce took beside the
    compute than alone. Medians over the windows, each the slowest rank's. Every rank
    runs it: the all-reduces pair across ranks."""
    torch.manual_seed(0)
    model = spec.build().to(device)
    images = torch.randn(batch, 3, spec.image_size, spec.image_size, device=device)

    def sync() -> None:  # the compute's own stream: the queued all-reduces run on NCCL's
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        out = model(images)
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()

    def window(steps: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        return time.perf_counter() - start

    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)  # its gradient
    # zeros: summed again and again they stay finite; two, as DDP's next bucket can be
    # all-reduced while the one before still is
    buffers = [torch.zeros(numel, dtype=torch.float32, device=device) for _ in range(2)]

    def all_reduces(count: int) -> float:
        """Seconds a rank waits for ``count`` all-reduces queued at once, with no compute."""
        sync()
        start = time.perf_counter()
        for work in [dist.all_reduce(buffers[i % 2], async_op=True) for i in range(count)]:
            work.wait()
        sync()
        return time.perf_counter() - start

    for _ in range(2):
        step()
        dist.all_reduce(buffers[0])
    allreduce_s = _slowest(dist, torch, all_reduces(2) / 2, device)
    first = _slowest(dist, torch, window(1), device)
    # the counts below come from figures every rank already holds alike (the slowest
    # rank's), so every rank works out the same ones
    steps = max(CONTENTION_MIN_STEPS, min(CONTENTION_MAX_STEPS,
                                          int(CONTENTION_TARGET_S / max(first, 1e-6))))
    alone, beside, comm, comm_alone = [], [], [], []
    for _ in range(CONTENTION_PAIRS):
        dist.barrier()
        alone.append(_slowest(dist, torch, window(steps), device))
        # the all-reduces alone for about as long
        count = int(min(CONTENTION_MAX_QUEUED, max(2, alone[-1] / max(allreduce_s, 1e-6))))
        dist.barrier()
        each_alone = _slowest(dist, torch, all_reduces(count), device) / count
        comm_alone.append(each_alone)
        # then enough of them queued to outlast the compute's window by a quarter (what is
        # left runs out after it, untimed); where they ran out first on any rank the window
        # was not all beside communication: again with twice as many
        outlast = 1.25
        while True:
            queued = int(min(CONTENTION_MAX_QUEUED,
                             outlast * alone[-1] / max(each_alone, 1e-6) + 2))
            dist.barrier()
            works = [dist.all_reduce(buffers[i % 2], async_op=True) for i in range(queued)]
            elapsed = window(steps)
            done = sum(w.is_completed() for w in works)
            for w in works:
                w.wait()
            sync()
            del works
            fewest = -_slowest(dist, torch, -float(done), device)  # finished in the window
            if fewest < queued or queued >= CONTENTION_MAX_QUEUED or outlast >= 8:
                break
            outlast *= 2
        beside.append(_slowest(dist, torch, elapsed, device))
        # each all-reduce's time beside the compute: the window over those finished in it,
        # the one still running at its end counted as half done
        comm.append(beside[-1] / (fewest + 0.5) / each_alone if 2 <= fewest < queued
                    else math.nan)
    slowdown = statistics.median(b / a for a, b in zip(alone, beside)) - 1
    rates = [c for c in comm if not math.isnan(c)]
    return {"batch": batch, "image_size": spec.image_size, "steps": steps,
            "allreduce_bytes": 4 * numel, "allreduce_alone_s": comm_alone,
            "compute_alone_s": [a / steps for a in alone],
            "compute_beside_s": [b / steps for b in beside],
            "compute_slowdown": slowdown,
            "comm_slowdown": statistics.median(rates) - 1 if rates else None}


def rank_main(backend: str, out: str, sizes: list[int], timeout: float, model: str,
              width: float, batch: int) -> None:
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
            row[key], mean, iters = _time_collective(dist, torch, call, device)
            if key == "time_s":
                algbw = size / row[key]
                row.update(time_mean_s=mean, iterations=iters, algbw_GBps=algbw / 1e9,
                           busbw_GBps=algbw * bus_factor(world) / 1e9)
        rows.append(row)
    measured: dict[str, Any] = {"world_size": world, "results": rows}
    if batch > 0:  # --contention-batch 0: not measured
        from bench.models.registry import ModelSpec, default_image_size

        spec = ModelSpec(model, width, image_size=default_image_size(model))
        measured["contention"] = measure_contention(dist, torch, device, spec, batch)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(measured))
    dist.destroy_process_group()


def contention_line(found: dict[str, Any]) -> str:
    """What the contention measurement found, in a sentence."""
    alone = 1000 * statistics.median(found["compute_alone_s"])
    beside = 1000 * statistics.median(found["compute_beside_s"])
    comm = found.get("comm_slowdown")
    comm_said = ("" if comm is None else
                 f", and each all-reduce {100 * comm:+.0f} % beside the compute")
    return (f"bench probe: beside all-reduces of the gradient, a step of "
            f"{found['batch']} images a rank took {100 * found['compute_slowdown']:+.0f} % "
            f"({alone:.1f} ms alone, {beside:.1f} ms beside){comm_said}: what overlap costs "
            "where buckets are all-reduced under backward (bench project counts it)")


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
              timeout: float = 300.0, max_mib: float = 256.0, tag: str | None = None,
              contention_batch: int = CONTENTION_BATCH) -> int:
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
    if contention_batch < 0 or contention_batch == 1:
        # a model's BatchNorm in training needs two values a channel (a BatchNorm1d after
        # the pooling sees one per image): bench run checks its model with two images
        raise ConfigError(f"--contention-batch must be 0 (not measured) or 2 or more images a "
                          f"rank (got {contention_batch})")
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
                model, str(width), str(contention_batch), *map(str, sizes)]
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, usable_cores() // gpus)),
                   BENCH_PROBE_CUDA="1" if device == "cuda" else "0")
        beside = (f"; then {short_name(model)}'s compute alone and beside all-reduces "
                  f"({contention_batch} images a rank)" if contention_batch else "")
        print(terminal.fill(f"bench probe: all-reduce, all-gather and reduce-scatter, "
                            f"{gpus * nodes} ranks ({device}, {backend}), {len(sizes)} "
                            f"sizes{beside}", subsequent_indent="  "), flush=True)
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
    if measured.get("contention"):
        record["contention"] = measured["contention"]
    if tag:
        record["tag"] = tag
    path = folder / f"{probe_id}.json"
    write_atomic(path, record)
    print(probe_table(record), end="")
    scaled = f" x{width:g}" if width != 1.0 else ""  # as the report names a workload's model
    print(f"bench probe: one {short_name(model)}{scaled} gradient ({grad / MIB:.1f} MiB) "
          "all-reduces in "
          f"{1000 * at_grad['time_s']:.2f} ms at best")
    if record.get("contention"):
        print(terminal.fill(contention_line(record["contention"]), subsequent_indent="  "))
    print(f"bench probe: record {path}")
    return EXIT_OK


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "WORKER":
        from bench.tools.lifetime import die_with_parent

        die_with_parent(os.getppid())  # torchrun's agent killed outright: this rank too
        (_, _, backend_arg, out_arg, timeout_arg, model_arg, width_arg, batch_arg,
         *size_args) = sys.argv
        rank_main(backend_arg, out_arg, [int(s) for s in size_args], float(timeout_arg),
                  model_arg, float(width_arg), int(batch_arg))
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
                       help="the model whose gradient size is also probed, and whose steps "
                            "time what overlap costs (as bench run's --model; default "
                            "resnet18-cifar, 100 classes)")
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
    probe.add_argument("--contention-batch", type=int, default=CONTENTION_BATCH, metavar="IMAGES",
                       help="images a rank (2 or more) in the steps timed alone and beside "
                            "all-reduces (what overlap costs compute; bench project counts it; "
                            f"default {CONTENTION_BATCH}; 0 leaves it out)")
    probe.add_argument("--tag", default=None,
                       help="names the network probed: bench project matches it to the runs "
                            "of the same --tag (untagged probes: to any run)")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    return run_probe(gpus=args.gpus, cpu=args.cpu, backend=args.backend, width=args.width,
                     model=args.model, output=args.output, nodes=args.nodes,
                     node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                     timeout=args.timeout, max_mib=args.max_size, tag=args.tag,
                     contention_batch=args.contention_batch)
