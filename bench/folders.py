"""Folders a command creates, and takes back when it turns out it should leave nothing."""

from __future__ import annotations

import contextlib
from pathlib import Path


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
