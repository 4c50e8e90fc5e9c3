"""Launchers: how ranks are started. Each takes a ``Launch`` (spec file, process count, port,
threads, watchdog), starts the ranks, waits, and returns an exit code (0 = every rank
finished). While waiting, a watchdog reads the ranks' heartbeat files and ends a run whose
ranks stopped making progress. An interrupted launcher stops all its ranks before re-raising.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from bench import worker
from bench.agent import run_agent
from bench.cluster import SlurmTask
from bench.launcher_output import (
    HorovodLines,
    InheritedStderr,
    TorchrunLines,
    horovod_root_cause,
    nccl_watchdog_timeout,
    tee,
    torchrun_root_cause,
)
from bench.lifetime import ForkedChild, die_with_parent, fork_dying_with_me, start_dying_with_me
from bench.ports import MASTER_ADDR
from bench.quick_exit import exit_now
from bench.scratch import Scratch

# SIGTERM, then this long, then SIGKILL: ranks act on SIGTERM at once (no handler), and
# a stopped or hung one never will; torch's own 30 s would only be waited out.
_GRACE_S = 3.0
_POLL_S = 0.5
_AFTER_FAILURE_S = 5.0  # a rank failed: this long for its launcher to stop the others


class RunTimeout(Exception):
    """No progress from a rank for longer than the run's timeout."""


@dataclass
class Launch:
    """One run's launch: what every launcher needs."""

    spec_path: Path
    nprocs: int
    port: int
    threads: int
    scratch: Scratch
    timeout: float  # seconds without a heartbeat before the run is ended
    nnodes: int = 1
    rdzv_endpoint: str | None = None  # c10d rendezvous (several machines)
    rdzv_id: str | None = None
    max_restarts: int = 0
    hosts: str | None = None  # horovodrun -H
    slurm: SlurmTask | None = None  # when this process is one srun task
    # An inline rank (this process's own thread) that stopped beating: ends the run from the
    # watchdog's thread (nothing can unblock the rank), given the watchdog's line, or None
    # where the rank wrote its own error and then did not end.
    on_stuck: Callable[[str | None], None] | None = None

    def check_progress(self) -> None:
        """Raise RunTimeout when a rank's heartbeat is older than the timeout. Ranks beat at
        least once a second while they work; a collective that waits does not beat."""
        now = time.time()
        for rank, beat in self.scratch.beats():
            try:
                age = now - beat.stat().st_mtime
                phase = beat.read_text().strip()
            except OSError:
                continue
            if age > self.timeout:
                raise RunTimeout(
                    f"timeout: rank {rank} made no progress for {age:.0f} s "
                    f"(watchdog limit {self.timeout:g} s); last reported: {phase or 'start-up'}"
                )

    def failed_long_ago(self, after_s: float = _AFTER_FAILURE_S) -> bool:
        """A rank failed more than ``after_s`` ago and no restart can follow: a launcher
        still running then waits on a rank that cannot stop (torchrun gives a SIGTERMed rank
        30 s; a stopped one never acts on it)."""
        if self.max_restarts:
            return False
        try:
            errors = self.scratch.errors()
            return bool(errors) and time.time() - errors[0][1].stat().st_mtime > after_s
        except OSError:  # a file went away while it was read
            return False


def _stop_group(proc: subprocess.Popen | ForkedChild, scratch: Scratch,
                echo: threading.Event) -> None:
    """SIGTERM the launcher's process group (it forwards to its ranks), SIGCONT the ranks (a
    stopped one acts on its SIGTERM only once it runs again), SIGKILL what lingers. What the
    launcher and its ranks print while they die (torchrun's traceback of the SIGTERM) is not
    passed on: bench says in one line why the run ended."""
    echo.clear()
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    _resume_ranks(scratch)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _resume_ranks(scratch: Scratch) -> None:
    for pid in scratch.rank_pids():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def _run_child(cmd: list[str] | AgentCall, launch: Launch, horovodrun: bool = False) -> int:
    """Start the launcher ``cmd`` (a command, or a torch agent to run in a copy of this
    process) in a session of its own that dies with this process, pass its stderr on
    (horovodrun's stdout too, as its ranks wrote it), and wait for it while the watchdog
    looks at the ranks' heartbeats."""
    env = _child_env(launch.threads)
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
    # With restarts allowed, a rank's death is not the run's end: its output flows on
    held = None if launch.max_restarts else TorchrunLines()
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
                rc = proc.wait(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                launch.check_progress()
                if launch.failed_long_ago():
                    print(f"bench: a rank failed {_AFTER_FAILURE_S:g} s ago and the launcher "
                          "still waits on the others; stopping them", file=sys.stderr)
                    _stop_group(proc, launch.scratch, echo)
                    return 1
    except BaseException:
        _stop_group(proc, launch.scratch, echo)
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
        _find_root_cause(output, launch.scratch, killed)
        if not (launch.scratch.has_errors() or launch.scratch.root_cause.exists()):
            for _, out, rewrite in streams:  # no cause found: what was held back may say it
                withheld = rewrite.withheld() if rewrite is not None else ""
                if withheld:
                    out.write(withheld)
                    out.flush()
    return rc


def _find_root_cause(output: str, scratch: Scratch, killed: tuple[int, int] | None) -> None:
    """What the ranks could not say themselves: a collective NCCL's watchdog ended, from
    their output (it aborts the rank; a rank's own error, if any, comes first), else the
    rank ``killed`` by a signal (rank, signal number), as their launcher saw it."""
    timed_out = nccl_watchdog_timeout(output)
    if timed_out is not None and not scratch.has_errors():
        scratch.collective_timeout(*timed_out)
    elif killed is not None:
        scratch.signal_death(*killed)


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    _mark_terminal(env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _mark_terminal(env: MutableMapping[str, str]) -> None:
    """BENCH_TTY=1 where this process's stderr is a terminal: the ranks' stderr reaches it
    through this process (tee), and their progress bars are drawn there all the same."""
    if sys.stderr.isatty():
        env["BENCH_TTY"] = "1"


def launch_inline(launch: Launch) -> int:
    """One process: the current one (nn.DataParallel, a Slurm task). A thread watches its
    heartbeat as a launcher watches its ranks'; the rank may be stuck where no exception can
    reach it (a C call that never returns), so ``launch.on_stuck`` ends the run from there."""
    done = threading.Event()
    if launch.on_stuck is not None:
        threading.Thread(target=_watch_inline, args=(launch, done), daemon=True,
                         name="bench-watchdog").start()
    try:
        worker.run_rank(launch.spec_path)
    except Exception:  # its error file says what and where; bench prints it at the end
        return 1
    finally:
        done.set()
    return 0


def _watch_inline(launch: Launch, done: threading.Event) -> None:
    """A rank that wrote its error is failing on its own (its loader's clean-up may take
    seconds more): it gets the watchdog's limit again, from its error, to end."""
    assert launch.on_stuck is not None
    while not done.wait(_POLL_S):
        if launch.scratch.has_errors():
            if launch.failed_long_ago(launch.timeout):
                launch.on_stuck(None)
            continue
        try:
            launch.check_progress()
        except RunTimeout as exc:
            launch.on_stuck(str(exc))


def agent(module: str) -> list[str]:
    """The command that runs torch's launcher ``module`` as ``python -m module`` would, then
    exits at once (bench.agent)."""
    return [sys.executable, "-m", "bench.agent", module]


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


def launch_torchrun(launch: Launch) -> int:
    """``python -m torch.distributed.run`` (torchrun): env:// rendezvous, LOCAL_RANK set."""
    args = [agent_log_dir(launch.scratch.root), f"--nproc-per-node={launch.nprocs}",
            f"--max-restarts={launch.max_restarts}"]
    if launch.rdzv_endpoint:  # several machines: each runs this, c10d rendezvous joins them
        args += [f"--nnodes={launch.nnodes}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={launch.rdzv_id}"]
    else:
        args += ["--nnodes=1", f"--master-addr={MASTER_ADDR}", f"--master-port={launch.port}"]
    args += ["-m", "bench.worker", str(launch.spec_path)]
    return _run_child(AgentCall("torch.distributed.run", tuple(args)), launch)


def launch_legacy(launch: Launch) -> int:
    """``python -m torch.distributed.launch`` (deprecated): passes --local-rank to each rank."""
    args = (agent_log_dir(launch.scratch.root), f"--nproc-per-node={launch.nprocs}",
            f"--master-addr={MASTER_ADDR}", f"--master-port={launch.port}",
            "-m", "bench.worker", str(launch.spec_path))
    return _run_child(AgentCall("torch.distributed.launch", args), launch)


def _spawn_rank(index: int, spec_path: str, nprocs: int, parent: int) -> None:
    # mp.spawn imports torch before this runs: if bench died meanwhile, this rank was
    # reparented already, and the check after arming ends it at once.
    die_with_parent(parent)
    os.environ.update(
        RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
    )
    worker.run_rank(spec_path)
    exit_now(0)  # done: skip the interpreter's teardown (torch.multiprocessing sees exit 0)


def launch_spawn(launch: Launch) -> int:
    """``torch.multiprocessing.spawn`` from this process; rank = process index."""
    os.environ.update(MASTER_ADDR=MASTER_ADDR, MASTER_PORT=str(launch.port),
                      OMP_NUM_THREADS=str(launch.threads))
    return spawn_ranks(_spawn_rank, (str(launch.spec_path), launch.nprocs, os.getpid()), launch)


def spawn_ranks(target: Callable[..., None], args: tuple, launch: Launch) -> int:
    """``launch.nprocs`` processes running ``target(index, *args)``, started by
    torch.multiprocessing (spawn) with their stderr read here, as torchrun's is: passed on,
    quiet after a failure, and searched for what NCCL's watchdog ended."""
    from multiprocessing import resource_tracker

    import torch.multiprocessing as mp

    _mark_terminal(os.environ)
    resource_tracker.ensure_running()  # it outlives the ranks: not with their stderr
    stderr = InheritedStderr(launch.scratch)
    try:
        with stderr.starting():
            context = mp.start_processes(target, args=args, nprocs=launch.nprocs, join=False,
                                         start_method="spawn")
    except BaseException:  # a Ctrl-C while they start: the ranks die with this process
        stderr.close()
        raise
    # A rank that fails makes torch stop the others; by default it waits 30 s before
    # SIGKILL, which a stopped (SIGSTOP) rank always uses up.
    grace = ({"grace_period": _GRACE_S}
             if "grace_period" in inspect.signature(context.join).parameters else {})
    killed: list[tuple[int, int]] = []
    # torch logs "Terminating process N via signal SIGTERM" for a peer still alive after the
    # grace period (a loaded machine): what follows a failure, which bench's line says.
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)
    try:
        rc = _join_spawned(context, launch, grace, stderr.echo, killed)
    finally:
        spawn_log.setLevel(level)
        output = stderr.close()
        for name in getattr(context, "error_files", ()):  # torch keeps a failed rank's
            with contextlib.suppress(OSError):  # traceback file in the temporary directory
                os.unlink(name)
    if rc:
        _find_root_cause(output, launch.scratch, killed[0] if killed else None)
    return rc


def _join_spawned(context, launch: Launch, grace: dict, echo: threading.Event,
                  killed: list[tuple[int, int]]) -> int:
    """Wait for the spawned ranks while the watchdog looks at their heartbeats; a rank that
    a signal ended goes into ``killed`` (rank, signal)."""
    import torch.multiprocessing as mp

    try:
        while not context.join(timeout=_POLL_S, **grace):
            launch.check_progress()
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        # the rank's error file (or the signal, kept here) says what; bench prints it
        if isinstance(exc, mp.ProcessExitedException) and exc.exit_code < 0:
            killed.append((exc.error_index, -exc.exit_code))
        return 1
    except BaseException:
        echo.clear()  # bench says in one line why it stops them
        for process in context.processes:  # stop every rank before leaving
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()
        raise
    return 0


def launch_horovodrun(launch: Launch) -> int:
    """``horovodrun --gloo -np N -H localhost:N`` (Gloo controller, no MPI)."""
    from strategies.horovod import horovodrun_command

    cmd = [
        *horovodrun_command(), "--gloo", "-np", str(launch.nprocs),
        "-H", launch.hosts or f"localhost:{launch.nprocs}",
        "--gloo-timeout-seconds", str(max(30, int(launch.timeout))),
        sys.executable, "-m", "bench.worker", str(launch.spec_path),
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
