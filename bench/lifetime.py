"""Nothing of a run outlives the process that started it: every process bench starts (the
launcher agent, each rank, each run of a sweep) gets SIGKILL when its parent dies, even by
``kill -9``, so a chain of parents takes its whole tree down with it."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9

try:  # resolved here, not in a freshly forked child (see dies_with_me)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no death signal
    _prctl = None


def die_with_parent(parent: int | None = None) -> None:
    """Get SIGKILL when the parent process dies. With ``parent`` (its pid), exit at once if
    it is already gone: it died before the death signal was armed."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, _SIGKILL)
    # Reparented to init (pid 1) means the parent is gone, whatever pid was passed.
    if parent is not None and (os.getppid() != parent or parent == 1):
        os._exit(1)


def dies_with_me() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies with this process."""
    parent = os.getpid()
    return lambda: die_with_parent(parent)
