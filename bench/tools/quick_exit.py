"""Ending a process without the interpreter's teardown.

A Python process that imported torch spends ~0.8 s of CPU at exit taking its modules apart,
and every run pays it in each of its processes (bench, then each rank: 3 for a 2-rank run):
seconds per run of a sweep, and a fifth of a small run. Nothing of that teardown matters
once a command has finished: what an exit must do still happens here (atexit handlers:
logging's flush, multiprocessing reaping its children; the standard streams flushed)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` at once, after the atexit handlers and a flush; a normal exit
    when a non-daemon thread still runs (the interpreter would wait for it)."""
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others:
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to say
            stream.flush()
    os._exit(code)
