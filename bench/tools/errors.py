"""Exceptions and the exit codes they map to."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
from collections.abc import Iterator
from typing import Any

from bench.tools.streams import to_devnull

EXIT_OK = 0
EXIT_FAILED = 1  # the run started and failed
EXIT_BAD_INPUT = 2  # bad option, missing data, ...: nothing was written
EXIT_UNAVAILABLE = 3  # the strategy cannot run here; an `unavailable` record was written
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM / SIGHUP; finished epochs kept, status `interrupted`


# Where in torch's C++ (gloo's) an error was raised, before its message: '[/__w/pytorch/
# pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting
# 5000ms for send operation to complete' is a third of a line and says nothing to a user
# (the record's traceback keeps it for a bug report)
_SOURCE_LOCATION = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|cu|c|h|hpp):\d+\]\s*")


def without_source_location(text: str) -> str:
    """An error's text without the C++ file and line it names (``_SOURCE_LOCATION``): what
    a rank says of its failure, and what the report shows of a record's (one written before
    ranks left it out)."""
    return _SOURCE_LOCATION.sub("", text)


class Interrupted(BaseException):  # like KeyboardInterrupt: not caught as an Exception
    """SIGTERM turned into an exception so a run can close its record; its text is the
    signal's name. Not KeyboardInterrupt: CPython marks a KeyboardInterrupt that passed
    through interpreter-run code (importing torch does) as unhandled, and then ends the
    process by SIGINT even after bench caught it and returned 130."""


# The signals that mean "stop and close what you own", besides Ctrl-C (KeyboardInterrupt):
# SIGTERM (kill, timeout, scancel) and SIGHUP (the terminal closed, the ssh connection
# dropped). Every command treats them alike: the run stops its ranks, closes its record as
# `interrupted`, removes its scratch folder and its sweep's claim, and exits 130.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def raise_interrupted(signum: int, frame) -> None:
    """A signal handler (SIGTERM, SIGHUP) that ends what runs like Ctrl-C, with the signal's
    name. After a hang-up the terminal is gone: a write to it would fail (EIO) in the middle
    of closing the record, so the standard streams that were that terminal go to /dev/null
    (a file or a pipe keeps what bench says)."""
    if signum == signal.SIGHUP:
        _leave_the_terminal()
    raise Interrupted(signal.Signals(signum).name)


def _leave_the_terminal() -> None:
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                to_devnull(fd)


def catch_stop_signals() -> dict[int, Any]:
    """Make every stop signal raise ``Interrupted`` here; returns the handlers it replaced,
    for ``restore_signals``. A signal the process was told to ignore (``nohup`` ignores
    SIGHUP) stays ignored."""
    previous = {}
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, raise_interrupted)
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and the stop signals while the body runs, then deliver the first that came
    (its handler raises as it would have). For ``import torch``: its C++ initialisation runs
    Python code, a handler that raises there throws through C++ that cannot unwind, and the
    process aborts (SIGABRT, 'terminate called after throwing pybind11::error_already_set').
    Only Python handlers are held; a default or ignored signal keeps its disposition."""
    pending: list[int] = []
    previous = {}
    for signum in (signal.SIGINT, *STOP_SIGNALS):
        handler = signal.getsignal(signum)
        if callable(handler):
            previous[signum] = signal.signal(signum, lambda got, _frame: pending.append(got))
    try:
        yield
    finally:
        restore_signals(previous)
    if pending:
        previous[pending[0]](pending[0], None)


class BenchError(Exception):
    """Base class; ``exit_code`` is what ``bench`` exits with."""

    exit_code = EXIT_FAILED


class ConfigError(BenchError):
    """Bad input. The message is one line that names the fix."""

    exit_code = EXIT_BAD_INPUT


class UnavailableError(BenchError):
    """The strategy cannot run on this machine (missing dependency, no CUDA, ...)."""

    exit_code = EXIT_UNAVAILABLE


class Diverged(BenchError):
    """The training loss became NaN or infinite: the run stops with status ``diverged``."""


# The fix for each reason a write fails.
_WRITE_FIX = {
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.ENOSPC: "free space or write elsewhere",
    errno.EDQUOT: "free space or write elsewhere",
    errno.EFBIG: "raise the file size limit (ulimit -f) or write elsewhere",
    errno.EACCES: "write elsewhere or fix the folder's permissions",
    errno.EPERM: "write elsewhere or fix the folder's permissions",
}


class CannotWrite(BenchError, OSError):
    """A file bench writes could not be written (read-only, full, quota, permissions): one
    line naming the file, why and the fix. Still an OSError (errno, strerror) for callers
    that close a run on any failed write."""

    exit_code = EXIT_FAILED

    @classmethod
    def of(cls, exc: OSError, path: object) -> CannotWrite:
        if isinstance(exc, CannotWrite):
            return exc
        return cls(exc.errno, exc.strerror or str(exc), str(exc.filename or path))

    def __str__(self) -> str:
        fix = _WRITE_FIX.get(self.errno, "write elsewhere")
        return f"cannot write {self.filename} ({self.strerror}): {fix}"
