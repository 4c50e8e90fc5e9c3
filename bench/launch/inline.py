"""A run in the launching process itself (nn.DataParallel, a Slurm task), watched by a
thread as a launcher watches its ranks."""

from __future__ import annotations

import threading

from bench.launch.job import POLL_S, Launch, RunTimeout
from bench.train.rank import run_rank


def launch_inline(launch: Launch) -> int:
    """One process: the current one (nn.DataParallel, a Slurm task). A thread watches its
    heartbeat as a launcher watches its ranks'; the rank may be stuck where no exception can
    reach it (a C call that never returns), so ``launch.on_stuck`` ends the run from there."""
    done = threading.Event()
    if launch.on_stuck is not None:
        threading.Thread(target=_watch_inline, args=(launch, done), daemon=True,
                         name="bench-watchdog").start()
    try:
        run_rank(launch.spec_path)
    except Exception:  # its error file says what and where; bench prints it at the end
        return 1
    finally:
        done.set()
    return 0


def _watch_inline(launch: Launch, done: threading.Event) -> None:
    """A rank that wrote its error is failing on its own (its loader's clean-up may take
    seconds more): it gets the watchdog's limit again, from its error, to end."""
    assert launch.on_stuck is not None
    while not done.wait(POLL_S):
        if launch.scratch.has_errors():
            if launch.failed_long_ago(launch.timeout):
                launch.on_stuck(None)
            continue
        try:
            launch.check_progress()
        except RunTimeout as exc:
            launch.on_stuck(str(exc))
