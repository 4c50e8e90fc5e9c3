"""Ranks started by ``torch.multiprocessing`` from bench's own process (``ddp-spawn``, the
verify and probe drivers): their stderr read here, their deaths told apart from their
peers' consequences."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
from collections.abc import Callable

from bench.launch.job import GRACE_S, POLL_S, Launch, find_root_cause, mark_terminal
from bench.launch.output import InheritedStderr, own_death
from bench.tools.lifetime import die_with_parent
from bench.tools.ports import MASTER_ADDR
from bench.tools.quick_exit import exit_now
from bench.train.rank import run_rank


def _spawn_rank(index: int, spec_path: str, nprocs: int, parent: int) -> None:
    # mp.spawn imports torch before this runs: if bench died meanwhile, this rank was
    # reparented already, and the check after arming ends it at once.
    die_with_parent(parent)
    os.environ.update(
        RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
        LOCAL_WORLD_SIZE=str(nprocs),
    )
    run_rank(spec_path)
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

    mark_terminal(os.environ)
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
    grace = ({"grace_period": GRACE_S}
             if "grace_period" in inspect.signature(context.join).parameters else {})
    killed: list[tuple[int, int]] = []
    # torch logs "Terminating process N via signal SIGTERM" for a peer still alive after the
    # grace period (a loaded machine): what follows a failure, which bench's line says.
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    stopped_by_torch = _StoppedByTorch()
    spawn_log.addFilter(stopped_by_torch)
    try:
        rc = _join_spawned(context, launch, grace, stderr.echo, killed, stopped_by_torch.pids)
    finally:
        spawn_log.removeFilter(stopped_by_torch)
        output = stderr.close()
        for name in getattr(context, "error_files", ()):  # torch keeps a failed rank's
            with contextlib.suppress(OSError):  # traceback file in the temporary directory
                os.unlink(name)
    if rc:
        find_root_cause(output, launch.scratch, killed[0] if killed else None)
    return rc


class _StoppedByTorch(logging.Filter):
    """Holds back torch's warnings about the peers it stops once a rank has failed, and
    keeps the pids it had to SIGKILL: their signal is torch's, not the cause."""

    def __init__(self) -> None:
        super().__init__()
        self.pids: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Unable to shutdown process") and record.args:
            self.pids.add(int(record.args[0]))  # type: ignore[index, arg-type]
        return record.levelno >= logging.ERROR


def _join_spawned(context, launch: Launch, grace: dict, echo: threading.Event,
                  killed: list[tuple[int, int]], stopped_by_torch: set[int]) -> int:
    """Wait for the spawned ranks while the watchdog looks at their heartbeats; a rank that
    a signal ended goes into ``killed`` (rank, signal).

    torch names the first rank it finds ended in one wait, the lowest: a peer that failed
    on its broken collective (exit 1, or SIGABRT) at once can come first. A rank killed by
    another signal, by the time torch has stopped the rest (not torch's own SIGTERM or the
    SIGKILL it sent after its grace), is the cause."""
    import torch.multiprocessing as mp

    try:
        while not context.join(timeout=POLL_S, **grace):
            launch.check_progress()
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        # the rank's error file (or the signal, kept here) says what; bench prints it
        signalled = [(index, -process.exitcode) for index, process in enumerate(context.processes)
                     if process.exitcode is not None and own_death(-process.exitcode)
                     and process.pid not in stopped_by_torch]
        if signalled:
            killed.append(signalled[0])
        elif isinstance(exc, mp.ProcessExitedException) and exc.exit_code < 0:
            killed.append((exc.error_index, -exc.exit_code))
        return 1
    except BaseException:
        echo.clear()  # bench says in one line why it stops them
        for process in context.processes:  # stop every rank before leaving
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(GRACE_S)
            if process.is_alive():
                process.kill()
                process.join()
        raise
    return 0
