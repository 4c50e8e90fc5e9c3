"""Launchers: how ranks are started. Each takes the spec file and a process count, starts
the ranks, waits, and returns an exit code (0 = every rank finished). A launcher that is
interrupted stops all its ranks before re-raising."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench import worker

MASTER_ADDR = "127.0.0.1"
_GRACE_S = 10.0


def free_port() -> int:
    """A TCP port that is free now on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((MASTER_ADDR, 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((MASTER_ADDR, port))
        except OSError:
            return True
    return False


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's process group (it forwards to its ranks), SIGKILL what lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _run_child(cmd: list[str], env: dict[str, str]) -> int:
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait()
    except BaseException:
        _stop_group(proc)
        raise
    finally:
        if proc.poll() is not None:  # nothing of this run may outlive it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def launch_inline(spec_path: Path, nprocs: int, port: int, threads: int) -> int:
    """One process: the current one (nn.DataParallel)."""
    try:
        worker.run_rank(worker.load_spec(spec_path))
    except Exception:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def launch_torchrun(spec_path: Path, nprocs: int, port: int, threads: int) -> int:
    """``python -m torch.distributed.run`` (torchrun): env:// rendezvous, LOCAL_RANK set."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", f"--nproc-per-node={nprocs}",
        f"--master-addr={MASTER_ADDR}", f"--master-port={port}",
        "-m", "bench.worker", str(spec_path),
    ]
    return _run_child(cmd, _child_env(threads))


def launch_legacy(spec_path: Path, nprocs: int, port: int, threads: int) -> int:
    """``python -m torch.distributed.launch`` (deprecated): passes --local-rank to each rank."""
    cmd = [
        sys.executable, "-m", "torch.distributed.launch",
        f"--nproc-per-node={nprocs}",
        f"--master-addr={MASTER_ADDR}", f"--master-port={port}",
        "-m", "bench.worker", str(spec_path),
    ]
    return _run_child(cmd, _child_env(threads))


def _spawn_rank(index: int, spec_path: str, nprocs: int) -> None:
    worker.die_with_parent()
    os.environ.update(
        RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
    )
    worker.run_rank(worker.load_spec(spec_path))


def launch_spawn(spec_path: Path, nprocs: int, port: int, threads: int) -> int:
    """``torch.multiprocessing.spawn`` from this process; rank = process index."""
    import torch.multiprocessing as mp

    os.environ.update(MASTER_ADDR=MASTER_ADDR, MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads))
    context = mp.start_processes(
        _spawn_rank, args=(str(spec_path), nprocs), nprocs=nprocs, join=False,
        start_method="spawn",
    )
    try:
        while not context.join(timeout=1.0):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        print(f"ddp-spawn: a rank failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    except BaseException:
        for process in context.processes:  # interrupted: stop every rank before leaving
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()
        raise
    return 0


def launch_horovodrun(spec_path: Path, nprocs: int, port: int, threads: int) -> int:
    """``horovodrun --gloo -np N -H localhost:N`` (Gloo controller, no MPI)."""
    from strategies.horovod import horovodrun_path

    cmd = [
        horovodrun_path() or "horovodrun", "--gloo", "-np", str(nprocs),
        "-H", f"localhost:{nprocs}", "--gloo-timeout-seconds", "120",
        sys.executable, "-m", "bench.worker", str(spec_path),
    ]
    return _run_child(cmd, _child_env(threads))


LAUNCHERS: dict[str, Callable[[Path, int, int, int], int]] = {
    "inline": launch_inline,
    "torchrun": launch_torchrun,
    "torch.distributed.launch": launch_legacy,
    "spawn": launch_spawn,
    "horovodrun": launch_horovodrun,
}
