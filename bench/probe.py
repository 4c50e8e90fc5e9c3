"""``bench probe``: the all-reduce ceiling. All-reduce of float32 tensors from 1 KiB to 256 MiB
and of exactly the model's gradient, over the backend and world size a run would use, started
by torchrun like a run's ranks. Reports nccl-tests' figures (algbw = bytes / time, busbw =
algbw · 2(n-1)/n) and the ideal time to all-reduce one gradient, and writes a record to
``OUTPUT/probes/`` that ``bench report`` uses as the comm ceiling per device and N.

``python -m bench.probe WORKER OUT.json SIZES...`` is one rank (torchrun's env)."""

from __future__ import annotations

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

from bench import terminal
from bench.config import check_rendezvous, check_timeout
from bench.errors import EXIT_FAILED, EXIT_OK, ConfigError
from bench.models import DEFAULT_MODEL, ModelSpec, check_model, check_model_builds, short_name
from bench.results import NUMBER, read_record, wrong_type

KIB, MIB = 1024, 1024 * 1024
PROBE_SIZES = [KIB * 4**k for k in range(10)]  # 1 KiB, 4 KiB, ..., 256 MiB
TARGET_S = 0.25  # time spent per size (at least MIN_ITERS iterations)
MIN_ITERS, MAX_ITERS = 3, 50


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n."""
    return 2 * (world - 1) / world


def _time_allreduce(dist, torch, numel: int, device) -> tuple[float, int]:
    """Median seconds of one all-reduce of ``numel`` floats (after warm-up) and iterations."""
    tensor = torch.ones(numel, dtype=torch.float32, device=device)

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(tensor)
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
        seconds, iters = _time_allreduce(dist, torch, size // 4, device)
        algbw = size / seconds
        rows.append({"bytes": size, "time_s": seconds, "iterations": iters,
                     "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * bus_factor(world) / 1e9})
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
              timeout: float = 300.0, max_mib: float = 256.0) -> int:
    import torch

    from bench.launch import agent, agent_log_dir
    from bench.lifetime import start_dying_with_me
    from bench.ports import MASTER_ADDR, free_port
    from bench.preflight import check_processes_fit, writable_folder
    from bench.results import capture_env, new_run_id, write_atomic
    from bench.scratch import Scratch

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
    from bench.model import count_parameters

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
                    f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id=probe-{rdzv_endpoint}"]
        else:
            cmd += ["--nnodes=1", f"--master-addr={MASTER_ADDR}",
                    f"--master-port={free_port()}"]
        cmd += ["-m", "bench.probe", "WORKER", backend, str(partial), str(timeout),
                *map(str, sizes)]
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // gpus)),
                   BENCH_PROBE_CUDA="1" if device == "cuda" else "0")
        print(f"bench probe: all-reduce, {gpus * nodes} ranks ({device}, {backend}), "
              f"{len(sizes)} sizes", flush=True)
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
    path = folder / f"{probe_id}.json"
    write_atomic(path, record)
    print(probe_table(record), end="")
    print(f"bench probe: one {short_name(model)} gradient ({grad / MIB:.1f} MiB) "
          "all-reduces in "
          f"{1000 * at_grad['time_s']:.2f} ms at best\nbench probe: record {path}")
    return EXIT_OK


def probe_table(record: dict[str, Any]) -> str:
    lines = [f"{'size':>10} {'time (ms)':>10} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"]
    for r in record["results"]:
        size = r["bytes"]
        label = f"{size / MIB:.1f} MiB" if size >= MIB else f"{size // KIB} KiB"
        mark = "  <- one gradient" if size == record["gradient_bytes"] else ""
        lines.append(f"{label:>10} {1000 * r['time_s']:>10.3f} {r['algbw_GBps']:>13.3f} "
                     f"{r['busbw_GBps']:>13.3f}{mark}")
    return "\n".join(lines) + "\n"


def probe_kind(record: dict[str, Any]) -> tuple:
    """What a probe measured, and what a run is matched to its probes by: device, backend,
    ranks and nodes (of a probe record or a run record alike)."""
    return (record.get("device"), record.get("backend"), record.get("world_size"),
            record.get("nodes") or 1)


def load_probes(results: str | Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The all-reduce probes under ``results/probes``; a file that is no probe, or whose
    figures cannot be (a size or a time of zero, a bandwidth that is not a positive number),
    is left out, with a line in ``warnings`` when a list is given."""
    folder = Path(results) / "probes"
    probes = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = read_record(path)
        except (OSError, ValueError) as exc:
            problem = f"not readable JSON ({exc})"
        else:
            problem = probe_problem(data)
        if problem is None:
            probes.append(data)
        elif warnings is not None:
            warnings.append(f"skipped {path}: {problem}")
    return probes


def probe_problem(data: Any) -> str | None:
    """What makes this JSON unusable as an all-reduce probe, or None."""
    if not isinstance(data, dict) or data.get("kind") != "allreduce-probe":
        return "not an all-reduce probe (kind is not allreduce-probe)"
    world = data.get("world_size")
    if wrong_type(world, int) or world < 2:
        return f"world_size is {world!r}, not a count of 2 ranks or more"
    if not isinstance(data.get("device"), str):
        return "device missing or not a string"
    results = data.get("results")
    if not isinstance(results, list) or not results:
        return "results missing or empty"
    for i, point in enumerate(results):
        if not isinstance(point, dict):
            return f"results[{i}] is not an object"
        for key in ("bytes", "time_s", "busbw_GBps"):
            value = point.get(key)
            if wrong_type(value, NUMBER) or value <= 0:
                return f"results[{i}].{key} is {value!r}, not a positive number"
    return None


def ideal_allreduce_s(probe: dict[str, Any], size: int) -> float:
    """The probe's all-reduce time at ``size`` bytes, interpolated log-log between sizes."""
    points = sorted((r["bytes"], r["time_s"]) for r in probe["results"])
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if b0 <= size <= b1:
            if b0 == b1:
                return t0
            f = (math.log(size) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return points[-1][1] * size / points[-1][0] if size > points[-1][0] else points[0][1]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "WORKER":
        from bench.lifetime import die_with_parent

        die_with_parent(os.getppid())  # torchrun's agent killed outright: this rank too
        _, _, backend_arg, out_arg, timeout_arg, *size_args = sys.argv
        rank_main(backend_arg, out_arg, [int(s) for s in size_args], float(timeout_arg))
        from bench.quick_exit import exit_now

        exit_now(0)
