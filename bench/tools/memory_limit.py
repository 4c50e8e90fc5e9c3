"""A real memory limit on the processes of one try: a cgroup (v1 memory controller) this
process makes as root, each child put in it before it runs anything, and the kernel's own
account of whether its OOM killer struck there. Removed when closed."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
_count = itertools.count()


def unavailable() -> str | None:
    """Why no limit can be made here, or None."""
    if not (CGROUP_MEMORY / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    return None


def clear_abandoned() -> None:
    """Remove the cages of processes that are gone (a `bench fit` or sweep killed with
    SIGKILL cannot remove its own); a cage still holding a process stays."""
    for path in CGROUP_MEMORY.glob("bench-fit-*-*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()


class MemoryCage:
    """``limit`` bytes for every process started with ``preexec_fn=cage.enter`` (and their
    children), swap included where the kernel accounts it."""

    def __init__(self, limit: int):
        why = unavailable()
        if why:
            raise OSError(why)
        clear_abandoned()
        self.path = CGROUP_MEMORY / f"bench-fit-{os.getpid()}-{next(_count)}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        swap = self.path / "memory.memsw.limit_in_bytes"
        if swap.exists():
            with contextlib.suppress(OSError):  # swap accounting off: the memory limit alone
                swap.write_text(str(limit))
        self.limit = limit

    def enter(self) -> None:
        """In the child, before exec: join the cgroup."""
        with open(self.path / "cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a process here (memory.oom_control's
        oom_kill counter; older kernels: the limit was hit at all)."""
        try:
            control = (self.path / "memory.oom_control").read_text()
        except OSError:
            return False
        for line in control.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value) > 0
        return int((self.path / "memory.failcnt").read_text() or 0) > 0

    def peak(self) -> int:
        """The most the cgroup's processes held together (bytes)."""
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def close(self, wait_s: float = 10.0) -> None:
        """Remove the cgroup once its processes are gone."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                self.path.rmdir()
                return
            except OSError:  # processes still in it: they are exiting
                time.sleep(0.1)

    def __enter__(self) -> MemoryCage:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
