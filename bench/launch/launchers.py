"""Launchers: how ranks are started. Each takes a ``Launch`` (spec file, process count, port,
threads, watchdog), starts the ranks, waits, and returns an exit code (0 = every rank
finished). While waiting, a watchdog reads the ranks' heartbeat files and ends a run whose
ranks stopped making progress. An interrupted launcher stops all its ranks before re-raising.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.launch.agent import run_agent
from bench.launch.inline import launch_inline
from bench.launch.job import AFTER_FAILURE_S, POLL_S, Launch, child_env, find_root_cause, stop_group
from bench.launch.output import (
    HorovodLines,
    RestartLines,
    TorchrunLines,
    end_open_line,
    horovod_root_cause,
    tee,
    torchrun_root_cause,
)
from bench.launch.spawn import launch_spawn
from bench.tools.lifetime import (
    ForkedChild,
    fork_dying_with_me,
    start_dying_with_me,
)
from bench.tools.ports import MASTER_ADDR


def _run_child(cmd: list[str] | AgentCall, launch: Launch, horovodrun: bool = False) -> int:
    """Start the launcher ``cmd`` (a command, or a torch agent to run in a copy of this
    process) in a session of its own that dies with this process, pass its stderr on
    (horovodrun's stdout too, as its ranks wrote it), and wait for it while the watchdog
    looks at the ranks' heartbeats."""
    env = child_env(launch.threads)
    if isinstance(cmd, AgentCall) and cmd.forkable():
        proc: subprocess.Popen | ForkedChild = fork_dying_with_me(cmd.run, env)
    else:
        if isinstance(cmd, AgentCall):
            cmd = [*agent(cmd.module), *cmd.args]
        proc = start_dying_with_me(cmd, env=env, start_new_session=True, stderr=subprocess.PIPE,
                                   stdout=subprocess.PIPE if horovodrun else None)
    tail: collections.deque[str] = collections.deque(maxlen=4000)
    echo = threading.Event()
    echo.set()
    quiet_after_failure = launch.scratch if not launch.max_restarts else None
    # With restarts allowed, a rank's death is not the run's end: bench says it and goes on
    held = (RestartLines(launch.scratch, launch.max_restarts, launch.nnodes)
            if launch.max_restarts else TorchrunLines())
    streams = [(proc.stderr, sys.stderr, HorovodLines(False) if horovodrun else held)]
    if horovodrun:
        streams.append((proc.stdout, sys.stdout, HorovodLines(True)))
    pumps = [threading.Thread(target=tee, args=(stream, tail, echo, quiet_after_failure, out,
                                                rewrite), daemon=True)
             for stream, out, rewrite in streams]
    for pump in pumps:
        pump.start()
    try:
        while True:
            try:
                rc = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                launch.let_a_failed_attempt_end()
                launch.check_progress()
                if launch.failed_long_ago():
                    end_open_line()
                    print(f"bench: a rank failed {AFTER_FAILURE_S:g} s ago and the launcher "
                          "still waits on the others; stopping them", file=sys.stderr)
                    stop_group(proc, launch.scratch, echo)
                    return 1
    except BaseException:
        stop_group(proc, launch.scratch, echo)
        raise
    finally:
        if proc.poll() is not None:  # nothing of this run may outlive it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for pump, (stream, _, _) in zip(pumps, streams, strict=True):
        pump.join(timeout=5)
        if not pump.is_alive():
            stream.close()
    if rc:
        output = "".join(tail)
        killed = (horovod_root_cause if horovodrun else torchrun_root_cause)(output)
        find_root_cause(output, launch.scratch, killed, launch)
        if not (launch.scratch.has_errors() or launch.scratch.root_cause.exists()):
            for _, out, rewrite in streams:  # no cause found: what was held back may say it
                withheld = rewrite.withheld() if rewrite is not None else ""
                if withheld:
                    out.write(withheld)
                    out.flush()
    return rc


def agent(module: str) -> list[str]:
    """The command that runs torch's launcher ``module`` as ``python -m module`` would, then
    exits at once (bench.launch.agent)."""
    return [sys.executable, "-m", "bench.launch.agent", module]


@dataclass(frozen=True)
class AgentCall:
    """torch's launcher ``module`` with ``args``, to run in a copy of this process (bench has
    imported torch: a fresh interpreter would import it again before the ranks start)."""

    module: str
    args: tuple[str, ...]

    def run(self) -> int:
        return run_agent(self.module, list(self.args))

    @staticmethod
    def forkable() -> bool:
        """Whether a copy of this process may run it: not once CUDA is initialized here (a
        GPU run's checks name the GPUs), which a forked child must never touch again and
        torchrun's agent asks about (how many GPUs); a fresh interpreter then runs it."""
        import torch

        return not torch.cuda.is_initialized()


def agent_log_dir(folder: Path) -> str:
    """torchrun's option for where it keeps its per-rank files (error.json). Without it
    torch makes a ``torchelastic_*`` folder in the temporary directory on every start and
    never removes it; in the run's scratch folder they go with the run."""
    return f"--log-dir={folder / 'torchrun'}"


def host_the_rendezvous(node_rank: int) -> list[str]:
    """Node 0 runs where --rdzv-endpoint points and hosts the rendezvous store; the others
    only connect to it. Said, not guessed: torch matches the endpoint against the machine's
    host name, which an address of another interface (or a network namespace's) never
    matches, and every node then waited for a store nobody started; and two nodes on one
    host both matched 127.0.0.1, raced to start it, and the loser failed."""
    return [f"--rdzv-conf=is_host={int(node_rank == 0)}"]


def launch_torchrun(launch: Launch) -> int:
    """``python -m torch.distributed.run`` (torchrun): env:// rendezvous, LOCAL_RANK set."""
    args = [agent_log_dir(launch.scratch.root), f"--nproc-per-node={launch.nprocs}",
            f"--max-restarts={launch.max_restarts}"]
    if launch.rdzv_endpoint:  # several machines: each runs this, c10d rendezvous joins them
        args += [f"--nnodes={launch.nnodes}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}",
                 *host_the_rendezvous(launch.node_rank)]
    else:
        args += ["--nnodes=1", f"--master-addr={MASTER_ADDR}", f"--master-port={launch.port}"]
    args += ["-m", "bench.train.rank", str(launch.spec_path)]
    return _run_child(AgentCall("torch.distributed.run", tuple(args)), launch)


def launch_legacy(launch: Launch) -> int:
    """``python -m torch.distributed.launch`` (deprecated): passes --local-rank to each rank."""
    args = (agent_log_dir(launch.scratch.root), f"--nproc-per-node={launch.nprocs}",
            f"--master-addr={MASTER_ADDR}", f"--master-port={launch.port}",
            "-m", "bench.train.rank", str(launch.spec_path))
    return _run_child(AgentCall("torch.distributed.launch", args), launch)


def launch_horovodrun(launch: Launch) -> int:
    """``horovodrun --gloo -np N -H localhost:N`` (Gloo controller, no MPI)."""
    from strategies.horovod import horovodrun_command

    cmd = [
        *horovodrun_command(), "--gloo", "-np", str(launch.nprocs),
        "-H", launch.hosts or f"localhost:{launch.nprocs}",
        "--gloo-timeout-seconds", str(max(30, int(launch.timeout))),
        sys.executable, "-m", "bench.train.rank", str(launch.spec_path),
    ]
    return _run_child(cmd, launch, horovodrun=True)


def launch_slurm_task(launch: Launch) -> int:
    """This process is one ``srun`` task: map Slurm's variables and run the rank here."""
    task = launch.slurm
    os.environ.update(
        RANK=str(task.rank), WORLD_SIZE=str(task.world_size), LOCAL_RANK=str(task.local_rank),
        LOCAL_WORLD_SIZE=str(task.local_world_size), MASTER_ADDR=task.master_addr,
        MASTER_PORT=str(launch.port), OMP_NUM_THREADS=str(launch.threads),
    )
    return launch_inline(launch)


LAUNCHERS: dict[str, Callable[[Launch], int]] = {
    "inline": launch_inline,
    "torchrun": launch_torchrun,
    "torch.distributed.launch": launch_legacy,
    "spawn": launch_spawn,
    "horovodrun": launch_horovodrun,
    "slurm": launch_slurm_task,
}
