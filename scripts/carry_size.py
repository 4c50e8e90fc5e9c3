"""What travels to a lent GPU machine, against its 64 MiB limit, before the lease.

A call to the GPU machine sends the working tree (tracked files and untracked ones git does not
ignore) together with the ignored paths it carries; over 64 MiB in all, the call is refused.
Run here, in the checkout, with the paths the lease will carry:

    python scripts/carry_size.py .cache/gpu-deps

Prints the three sizes and exits 0 within the limit, else names the largest carried files
and exits 1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20


def tree_bytes(root: Path) -> int:
    """Tracked files and untracked files that git does not ignore, as they are on disk."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], check=True, capture_output=True).stdout
    total = 0
    for name in filter(None, names.decode().split("\0")):
        path = root / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def carried_files(root: Path, carry: list[str]) -> list[tuple[int, Path]]:
    found = []
    for name in carry:
        path = root / name
        if not path.exists():
            sys.exit(f"carry_size: {name} does not exist here: build it first (make gpu-deps)")
        for file in ([path] if path.is_file() else path.rglob("*")):
            if file.is_file() and not file.is_symlink():
                found.append((file.stat().st_size, file))
    return found


def main() -> int:
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                               capture_output=True, text=True).stdout.strip())
    carry = sys.argv[1:]
    tree = tree_bytes(root)
    files = carried_files(root, carry)
    carried = sum(size for size, _ in files)
    total = tree + carried
    mib = 2**20
    print(f"what travels to the GPU machine: working tree {tree / mib:.1f} MiB + "
          f"{', '.join(carry) or 'nothing carried'} {carried / mib:.1f} MiB = "
          f"{total / mib:.1f} MiB of {LIMIT / mib:.0f} MiB")
    if total <= LIMIT:
        return 0
    print(f"over by {(total - LIMIT) / mib:.1f} MiB: the call would be refused; the largest "
          "carried files:")
    for size, file in sorted(files, reverse=True)[:5]:
        print(f"  {size / mib:6.1f} MiB  {file.relative_to(root)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
