"""Standard streams that cannot end a command: bench's own lines are worth less than the run
they describe. A closed terminal (a hang-up) fails every later write with EIO, a closed stdout
(``bench list >&-``) leaves Python without ``sys.stdout`` and lets the next file bench opens
take descriptor 1, and an ASCII-only encoding (``PYTHONIOENCODING=ascii``) cannot print ✓:
each used to end a command in a traceback, some with a record left ``running``."""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, TextIO

# A terminal that went away: EIO from a hung-up tty, ENXIO from one whose device is gone.
_TERMINAL_GONE = (errno.EIO, errno.ENXIO)


class _Survivor:
    """A text stream whose writes stop mattering, rather than failing, once the terminal
    behind it is gone: the descriptor then points at /dev/null (the ranks and launchers that
    share it write there too)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._left(exc)
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except OSError as exc:
                self._left(exc)

    def _left(self, exc: OSError) -> None:
        if exc.errno not in _TERMINAL_GONE:
            raise exc
        self._gone = True
        with_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def with_devnull(stream: TextIO) -> None:
    """Point the stream's descriptor at /dev/null (what it still buffers goes there)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    to_devnull(fd)


def to_devnull(fd: int) -> None:
    """Point descriptor FD at /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def guard_standard_streams() -> None:
    """Descriptors 0-2 open (on /dev/null where they were closed, as a daemon's are), so no
    file bench opens becomes a process's stdout; ``sys.stdout``/``sys.stderr`` present,
    printing what their encoding cannot say as '?', and surviving their terminal."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is None:  # Python starts without a stream whose descriptor was closed
            stream = open(fd, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
        elif hasattr(stream, "reconfigure"):
            try:
                "✓—×".encode(stream.encoding)
            except (UnicodeEncodeError, LookupError):
                stream.reconfigure(errors="replace")
        if not isinstance(stream, _Survivor):
            setattr(sys, name, _Survivor(stream))
