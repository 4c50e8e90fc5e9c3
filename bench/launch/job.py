"""What every launcher shares: the run's ``Launch`` (its ranks, scratch folder and
watchdog), stopping a process group, the ranks' environment, and the cause of a death the
ranks could not say themselves."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from bench.launch.output import end_open_line, nccl_watchdog_timeout
from bench.launch.slurm import SlurmTask
from bench.tools import terminal
from bench.tools.lifetime import ForkedChild
from bench.train.scratch import ENDED_FOR_RESTART, RankError, Scratch, read_beat

# SIGTERM, then this long, then SIGKILL: ranks act on SIGTERM at once (no handler), and
# a stopped or hung one never will; torch's own 30 s would only be waited out.
GRACE_S = 3.0
POLL_S = 0.5  # how often a launcher looks at its ranks (and their heartbeats)
AFTER_FAILURE_S = 5.0  # a rank failed: this long for its launcher to stop the others


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
    node_rank: int = 0  # this machine's index; node 0 hosts the rendezvous
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
        every step and batch while they work; a collective that waits does not beat. Where
        torchrun may still start the ranks again (--max-restarts), the stuck rank is ended
        instead (``end_stuck_rank``): a rank that hangs is a failure a restart is for."""
        now = time.time()
        ended = self.ended_attempt()
        for rank, beat in self.scratch.beats():
            try:
                age = now - beat.stat().st_mtime
                phase, attempt = read_beat(beat)
            except OSError:
                continue
            if age <= self.timeout or attempt <= ended:
                continue
            phase = phase or "start-up"
            if attempt < self.max_restarts:
                self.end_stuck_rank(rank, attempt, age, phase)
                continue
            raise RunTimeout(
                f"timeout: rank {rank} made no progress for {age:.0f} s "
                f"(watchdog limit {self.timeout:g} s) [in {phase}]"
            )

    def end_stuck_rank(self, rank: str, attempt: int, age: float, phase: str) -> None:
        """End a rank of this machine that stopped beating while restarts are left, saying
        why: its torchrun agent sees it die and starts the ranks again. On one machine the
        line is the rank's error (the attempt's cause, for the terminal's account and the
        next attempt's record). Across machines it is printed: a machine whose rank is
        stopped (SIGSTOP) or hangs outside a collective while another machine's rank failed
        cannot see that failure; its watchdog ended its whole run, and the other machines'
        restart waited for it until torchrun's join timeout. There its agent restarts the
        ranks for the other machine without counting an attempt (their number stays), and
        an error of that number would keep the watchdog from timing the next one."""
        line = (f"made no progress for {age:.0f} s (watchdog limit {self.timeout:g} s); "
                f"{ENDED_FOR_RESTART} [in {phase}]")
        if self.nnodes == 1:
            ended = RankError(f"timeout: {line}", True, "", attempt, ended_for_restart=True)
            self.scratch.write_error(rank, ended)
        else:
            end_open_line()
            print(f"bench: timeout: rank {rank}: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.scratch.pid(rank).read_text())
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        if self.nnodes > 1:  # the next attempt's rank beats anew
            self.scratch.beat(rank).unlink(missing_ok=True)

    def ended_attempt(self) -> int:
        """The last attempt whose heartbeats no longer count (-1: none). Where torchrun may
        restart the ranks: every attempt before the one that started last, and that one too
        once a rank of it has failed with a restart left. torchrun ends such an attempt (its
        SIGTERM, SIGKILL 30 s on; ``let_a_failed_attempt_end`` resumes a stopped rank) and
        starts the next, whose ranks' start-up is torchrun's to bound, as the first
        attempt's is: a rank's beat from the attempt before aged meanwhile, and on a slow
        machine (CI, 1 core) it ended the whole run before the new rank had started,
        restarts left."""
        if not self.max_restarts:
            return -1
        attempt = self.scratch.attempt()
        if attempt < self.max_restarts and self.scratch.has_errors():
            return attempt
        return attempt - 1

    def let_a_failed_attempt_end(self) -> None:
        """Where torchrun may restart the ranks: once a rank of the attempt has failed, its
        stopped ranks (SIGSTOP, a debugger) run again, so that torchrun's SIGTERM ends them
        and the next attempt starts; the attempt waited on them until the watchdog ended the
        whole run, restarts left or not."""
        if self.max_restarts and self.scratch.has_errors():
            resume_ranks(self.scratch)

    def failed_long_ago(self, after_s: float = AFTER_FAILURE_S) -> bool:
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


def stop_group(proc: subprocess.Popen | ForkedChild, scratch: Scratch,
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
    resume_ranks(scratch)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def resume_ranks(scratch: Scratch) -> None:
    for pid in scratch.rank_pids():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    mark_terminal(env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def mark_terminal(env: MutableMapping[str, str]) -> None:
    """BENCH_TTY=1 where this process's stderr is a terminal: the ranks' stderr reaches it
    through this process (tee), and their progress bars are drawn there all the same; and
    COLUMNS, the width of bench's own lines (``terminal.columns``), so that a rank's lines
    fit that terminal too (its stderr is a pipe: 120 columns otherwise)."""
    if sys.stderr.isatty():
        env["BENCH_TTY"] = "1"
    env["COLUMNS"] = str(terminal.columns())


def find_root_cause(output: str, scratch: Scratch, killed: tuple[int, int] | None,
                    launch: Launch | None = None) -> None:
    """What the ranks could not say themselves: a collective NCCL's watchdog ended, from
    their output (it aborts the rank; a rank's own error, if any, comes first), else the
    rank ``killed`` by a signal (rank, signal number), as their launcher saw it, else a
    rendezvous of several machines that never gathered them (no rank started)."""
    timed_out = nccl_watchdog_timeout(output)
    no_rendezvous = (rendezvous_failure(output, launch)
                     if launch is not None and launch.rdzv_endpoint else None)
    if no_rendezvous and not scratch.has_errors() and killed is None:
        scratch.root_cause.write_text(no_rendezvous + "\n")
    elif timed_out is not None and not scratch.has_errors():
        scratch.collective_timeout(*timed_out)
    elif killed is not None and str(killed[0]) not in {rank for rank, _ in scratch.errors()}:
        # A rank that said its error and then died of a signal died in its teardown (gloo
        # aborts now and then as a group goes while a peer waits in a collective): its
        # error is the cause, and the signal hid it (a full disk read as SIGABRT).
        scratch.signal_death(*killed)


def rendezvous_failure(output: str, launch: Launch) -> str | None:
    """Why torchrun's agent gave up before any rank started: the host of the rendezvous
    waited out its join timeout (the other nodes never joined this id: their options, from
    which the id is derived, differ, or they were never started), or another node lost the
    host as it gave up, or nothing answered at the endpoint. None where none of these is in
    ``output``."""
    fix = ("start `bench run` on every node with the same options but --node-rank (and "
           "those each machine sets for itself: --output, --data-dir, --workers), or pass "
           "one --rdzv-id NAME to all")
    if "RendezvousTimeoutError" in output:
        return (f"the other nodes did not join rendezvous {launch.rdzv_id} at "
                f"{launch.rdzv_endpoint} before torchrun's join timeout: {fix}")
    if "RendezvousConnectionError" not in output or launch.node_rank == 0:
        return None
    if "while trying to connect" in output:  # c10d's TCPStore client gave up connecting
        return (f"nothing answered at the rendezvous endpoint {launch.rdzv_endpoint}: start "
                "node rank 0 on that machine (it hosts the rendezvous) and check the address "
                "and that its port is open to this node")
    return (f"the rendezvous host {launch.rdzv_endpoint} (node rank 0) went before this "
            f"node's ranks started: see its error (if the nodes never met: {fix})")
