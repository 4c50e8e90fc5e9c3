"""Nothing of a run outlives the process that started it: every process bench starts (the
launcher agent, each rank, each run of a sweep) gets SIGKILL when its parent dies, even by
``kill -9``, so a chain of parents takes its whole tree down with it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9

try:  # resolved here, not in a freshly forked child (see start_dying_with_me)
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


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def start_dying_with_me(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` whose child dies with this process, without losing a Ctrl-C.

    A ``preexec_fn`` makes Popen run the interpreter's at-fork hooks in this process, and a
    signal landing in one (logging's ``_releaseLock``) raised KeyboardInterrupt where Python
    can only print "Exception ignored": the Ctrl-C vanished and the run went on. So SIGINT and
    SIGTERM are held back across the fork and delivered after it; the child unblocks them
    before it runs anything (a blocked mask would survive its exec)."""
    parent = os.getpid()

    def in_child() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        die_with_parent(parent)

    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        proc = subprocess.Popen(cmd, preexec_fn=in_child, **popen_kwargs)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal held meanwhile lands here
    except BaseException:  # ... and the caller never gets the child: end it here
        with contextlib.suppress(OSError):
            if popen_kwargs.get("start_new_session"):
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        proc.wait()
        raise
    return proc
