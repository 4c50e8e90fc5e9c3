"""Is there room for the virtual environment, before `make install` starts filling the disk?

The install is torch with its CUDA libraries: 5.9 GiB once installed, and 6.0 GiB at its
peak (measured 2026-11-29 with `df` every second through a fresh `make install`). Without
room, pip fails minutes in with "[Errno 28] No space left on device" and leaves a half-built
environment behind; this says so first, in one line, and names the fix. Run by the Makefile
with the system Python (nothing installed yet):

    python3 scripts/check_space.py .venv 7

Exits 0 when the file system that will hold DIR has NEED GiB free, or when DIR already holds
an environment (a reinstall after pyproject.toml changed reuses most of it: refusing it
would stop an update that fits), else 2.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def existing_parent(path: Path) -> Path:
    """The nearest folder of PATH that exists: the one whose file system will hold it."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: check_space.py DIR NEED_GIB", file=sys.stderr)
        return 2
    target, need = Path(argv[0]), float(argv[1])
    if (target / "bin" / "python").exists():
        return 0
    where = existing_parent(target)
    free = shutil.disk_usage(where).free / 2**30
    if free >= need:
        return 0
    print(f"make install: {free:.1f} GiB free on the disk of {where}, and {target} needs "
          f"{need:g} GiB (torch and its CUDA libraries): free some space there, or put the "
          "environment on a larger disk with VENV=DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
