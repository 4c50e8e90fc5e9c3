"""Folders a command creates, and takes back when it turns out it should leave nothing."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from bench.tools.errors import ConfigError


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first: what a
    ``mkdir(parents=True)`` of it would create."""
    folder = Path(folder).absolute()
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_created(folders: list[Path]) -> None:
    """Remove the folders (deepest first) that are still empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def file_to_write(flag: str, path: str, example: str, typed: str | None = None,
                  made_before: tuple[Path, ...] = ()) -> Path:
    """PATH as a file a command may create or replace, checked before any work is done: it
    is no folder and its folder exists and is writable; otherwise a ConfigError naming FLAG
    and the path as the user TYPED it (PATH with a pattern filled in, by default PATH itself;
    EXAMPLE: a file name to suggest inside a folder given by mistake). MADE_BEFORE: folders
    the command makes (and checks) before it writes the file, which need not exist yet."""
    resolved = Path(path).expanduser().absolute()
    path = path if typed is None else typed
    looked_up(resolved, flag, path)
    return _checked_file(flag, resolved, path, example, made_before)


def looked_up(resolved: Path, flag: str, path: object) -> None:
    """One line naming FLAG, PATH and the fix where a name in ``resolved`` is past the file
    system's 255 bytes: it was a traceback, or a run that failed "writing files" over its
    data folder's name. Anything else (absent, a loop of links) is the caller's to say.
    (Python 3.13's ``Path.exists`` and ``is_dir`` say False for such a path, earlier ones
    raised: os.stat says it alike everywhere.)"""
    try:
        os.stat(resolved)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            fix = "a name in it is longer than the file system allows (255 bytes); choose " \
                  "a shorter one"
            raise ConfigError(f"{flag} {path}: {fix}" if flag else f"{path}: {fix}") from None


def _checked_file(flag: str, resolved: Path, path: str, example: str,
                  made_before: tuple[Path, ...]) -> Path:
    if resolved.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; name a file, e.g. "
                          f"{Path(path) / example}")
    if resolved.exists() and not resolved.is_file() and os.access(resolved, os.W_OK):
        return resolved  # a terminal, a pipe, a device (/dev/stdout): written into, in place
    if not resolved.parent.exists() and resolved.parent in {
            Path(f).expanduser().absolute() for f in made_before}:
        return resolved
    if not resolved.parent.is_dir():
        what = "is not a folder" if resolved.parent.exists() else "does not exist"
        raise ConfigError(f"{flag} {path}: {resolved.parent} {what}; create that folder or "
                          "choose another path")
    if not os.access(resolved.parent, os.W_OK):
        raise ConfigError(f"{flag} {path}: cannot write in {resolved.parent}; choose another "
                          "path")
    return resolved
