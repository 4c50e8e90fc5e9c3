"""Who wrote a record: the process that owns it (so a record whose owner died with kill -9
reads as interrupted, not running) and the commit of the code that ran."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import bench


def _process_started(pid: int) -> str | None:
    """When process ``pid`` started (boot id + start time in clock ticks): a pid that is
    reused later has another start. None when there is no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # fields 3.. after "pid (comm)"
    if fields[0] in ("Z", "X"):  # a zombie nobody reaped (a container's init may not)
        return None
    return f"{boot}:{fields[19]}"  # field 22: start time


def this_process() -> dict[str, Any]:
    """The record's ``owner``: who must close it."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": _process_started(os.getpid())}


def owner_alive(owner: dict[str, Any] | None) -> bool | None:
    """Whether the process that owns a record still runs; None when that cannot be known
    here (another host, or an old record without an owner)."""
    if not owner or owner.get("host") != socket.gethostname() or not owner.get("started"):
        return None
    return _process_started(int(owner["pid"])) == owner["started"]


def source_commit() -> str | None:
    """The git commit of the code that ran, ``+dirty`` with uncommitted changes; None
    outside a git checkout (an installed package)."""
    root = Path(bench.__file__).resolve().parents[1]  # the checkout holding bench/
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        # --no-optional-locks: status must never write the user's index (a failing disk
        # once left a stale .git/index.lock behind, which broke their next commit).
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(root), "status",
                                "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def current_status(rec: dict[str, Any]) -> tuple[str | None, str | None]:
    """(status, error) as they stand now: a ``running`` record whose owner is gone (killed
    with -9, a crashed machine) was interrupted, although nobody could write that in it."""
    status, error = rec.get("status"), rec.get("error")
    if status == "running" and owner_alive(rec.get("owner")) is False:
        owner = rec["owner"]
        return "interrupted", (f"owner gone: bench (pid {owner['pid']} on {owner['host']}) "
                               "ended without closing the record")
    return status, error
