"""Nothing of a run outlives the process that started it: every process bench starts (the
launcher agent, each rank, each run of a sweep) gets SIGKILL when its parent dies, even by
``kill -9``, so a chain of parents takes its whole tree down with it."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, NoReturn

from bench.tools.errors import STOP_SIGNALS

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9

try:  # resolved here, not in a freshly forked child (see start_dying_with_me)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no death signal
    _prctl = None


def still_running(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie does not: it has died and waits to be reaped,
    which the init of a container does late or never (a killed report's drawers stayed
    zombies for a second here, and the next report kept their temporary files as a live
    writer's); a live process of another user does."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc to ask (not Linux): the signal's answer
    return state not in ("Z", "X")


def die_with_parent(parent: int | None = None) -> None:
    """Get SIGKILL when the parent process dies. With ``parent`` (its pid), exit at once if
    it is already gone: it died before the death signal was armed."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, _SIGKILL)
    # Reparented to init (pid 1) means the parent is gone, whatever pid was passed.
    if parent is not None and (os.getppid() != parent or parent == 1):
        os._exit(1)


def kill_children() -> None:
    """SIGKILL this process's children (its loader workers) before it exits on its own
    terms: one stuck in a fork never armed its death signal."""
    for listed in glob.glob("/proc/self/task/*/children"):  # none where /proc is not
        with contextlib.suppress(OSError, ValueError):
            for pid in Path(listed).read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)


_STOP_SIGNALS = {signal.SIGINT, *STOP_SIGNALS}


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
    _deliver_held(held, proc, group=bool(popen_kwargs.get("start_new_session")))
    return proc


def _deliver_held(held: set, child: subprocess.Popen | ForkedChild, group: bool) -> None:
    """Deliver a Ctrl-C or SIGTERM held back while the child started; when it raises, the
    caller never gets the child, so it is ended here (its whole session when it has one)."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal held meanwhile lands here
    except BaseException:
        with contextlib.suppress(OSError):
            if group:
                os.killpg(child.pid, signal.SIGKILL)
            else:
                os.kill(child.pid, signal.SIGKILL)
        child.wait()
        raise


class ForkedChild:
    """What ``fork_dying_with_me`` returns: the few ``subprocess.Popen`` members a launcher
    uses (``pid``, ``stderr``, ``poll``, ``wait``)."""

    def __init__(self, pid: int, stderr: BinaryIO) -> None:
        self.pid = pid
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)  # as Popen.wait: quick to see a quick exit
        return self.returncode


def fork_dying_with_me(body: Callable[[], int], env: dict[str, str]) -> ForkedChild:
    """Run ``body`` in a forked copy of this process, as ``start_dying_with_me(..., env=env,
    start_new_session=True, stderr=PIPE)`` runs a command: its own session, SIGKILL when this
    process dies, stderr into a pipe read here; it exits with ``body``'s code.

    Why a fork: a launcher agent (torchrun) needs torch, which this process has imported
    already; a fresh interpreter would import it again (about 1.1 s of CPU and 1.5 s before
    the ranks start, per run). The copy starts with a fresh interpreter's signal handling and
    leaves without this process's atexit handlers (they belong to this process)."""
    parent = os.getpid()
    read_end, write_end = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # else the copy would print it a second time
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns when other threads exist: here torch's idle intra-op pool.
            # The copy runs only the agent's Python code (no tensor work) and execs the ranks.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:  # the copy: never returns
        _forked_body(body, env, parent, write_end, read_end, held)
    os.close(write_end)
    child = ForkedChild(pid, os.fdopen(read_end, "rb"))
    # Popen returns once its child has its session; so does this (a signal that comes next
    # stops the child's whole group, which must exist by then).
    while child.poll() is None and _session(pid) != pid:
        time.sleep(0.0005)
    _deliver_held(held, child, group=True)
    return child


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone
        return None


def _forked_body(body: Callable[[], int], env: dict[str, str], parent: int, write_end: int,
                 read_end: int, held: set) -> NoReturn:
    code = 1
    try:
        os.setsid()
        os.dup2(write_end, 2)
        os.close(write_end)
        os.close(read_end)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, held - _STOP_SIGNALS)
        die_with_parent(parent)
        os.environ.clear()
        os.environ.update(env)
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
