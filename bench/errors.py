"""Exceptions and the exit codes they map to."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1  # the run started and failed
EXIT_BAD_INPUT = 2  # bad option, missing data, ...: nothing was written
EXIT_UNAVAILABLE = 3  # the strategy cannot run here; an `unavailable` record was written
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM; finished epochs kept, status `interrupted`


class Interrupted(BaseException):  # like KeyboardInterrupt: not caught as an Exception
    """SIGTERM turned into an exception so a run can close its record; its text is the
    signal's name. Not KeyboardInterrupt: CPython marks a KeyboardInterrupt that passed
    through interpreter-run code (importing torch does) as unhandled, and then ends the
    process by SIGINT even after bench caught it and returned 130."""


def raise_interrupted(signum: int, frame) -> None:
    """A signal handler (SIGTERM) that ends what runs like Ctrl-C, with the signal's name."""
    raise Interrupted(signal.Signals(signum).name)


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
