"""Unpack a source tarball (Horovod's sdist, apex's) safely on every Python the project
supports: tarfile's "data" filter where the interpreter has it (3.12, and the backports in
3.9.17, 3.10.12 and 3.11.4), else stricter refusals checked here: a member that is not a
file or a folder (any link, a device), or whose path is absolute or climbs out (the filter
instead keeps links that stay inside and strips a leading "/"). Debian 12's Python 3.11.2
has no filter: `extractall(filter=...)` was a TypeError there."""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath


def extract(archive: Path, dest: Path) -> None:
    """Unpack ``archive`` into ``dest``; refuse it whole (SystemExit naming the member)
    where a member could write outside ``dest``."""
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        members = tar.getmembers()
        for member in members:
            path = PurePosixPath(member.name)
            if not (member.isfile() or member.isdir()) or path.is_absolute() \
                    or ".." in path.parts:
                raise SystemExit(f"{archive}: refusing to unpack {member.name!r} (not a plain "
                                 "file or folder, or a path outside the destination)")
        tar.extractall(dest, members=members)
