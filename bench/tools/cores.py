"""The cores a process may run on, the CPU time its cgroups allow it, and the CPUs its
Slurm job holds on the node."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as torch's DataLoader counts them),
    or the machine's where the system cannot say (not on Linux); fewer where its cgroups'
    CPU quota allows less time than that (a container's --cpus, a Kubernetes CPU limit),
    rounded down: threads beyond the quota are throttled, not run (2 threads of a rank under
    a 1-core quota trained 1.3x slower than 1, here); and no more than a Slurm job was given
    on this node (``slurm_cores``)."""
    try:
        cores = len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
    quota = cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return min(cores, slurm_cores() or cores)


def slurm_cores(env: Mapping[str, str] | None = None) -> int | None:
    """The CPUs a Slurm job holds on this node (SLURM_CPUS_ON_NODE, inside a job), or None.
    Where Slurm binds tasks (task/affinity, task/cgroup) the affinity says as much; where it
    does not (task/none), the affinity is the whole node, which the job shares with others:
    two one-core array tasks on the local Slurm's 2-core node each trained on 2 threads."""
    env = os.environ if env is None else env
    value = env.get("SLURM_CPUS_ON_NODE", "")
    return int(value) if env.get("SLURM_JOB_ID") and value.isdigit() and int(value) > 0 else None


def _unescaped(path: str) -> str:
    """A mountinfo path with its octal escapes (a space is \\040) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), path)


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, filesystem type, super options) of each cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if sep and len(fields) >= 5 and len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            found.append((_unescaped(fields[3]), _unescaped(fields[4]), fs[0],
                          set(fs[2].split(","))))
    return found


def _limit(folder: Path, version: int) -> float | None:
    """The cores' worth of time one cgroup folder allows (None: no limit, or unreadable)."""
    try:
        if version == 2:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_quota(proc: Path = Path("/proc/self"), root: Path = Path("/")) -> float | None:
    """The cores' worth of CPU time this process's cgroups allow it (cgroup v2's cpu.max,
    v1's cpu.cfs_quota_us over cpu.cfs_period_us), the lowest on the way from its own cgroup
    up to the hierarchy's root, or None where none limits it or the files cannot be read.
    ``root`` prefixes the mount points (a test's tree)."""
    try:
        cgroups = (proc / "cgroup").read_text()
        mounts = _mounts((proc / "mountinfo").read_text())
    except OSError:
        return None
    limits = []
    for line in cgroups.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        version = 2 if hierarchy == "0" and not controllers else 1
        if version == 1 and "cpu" not in controllers.split(","):
            continue
        for mount_root, point, fs, options in mounts:
            if (fs == "cgroup2") != (version == 2) or (version == 1 and "cpu" not in options):
                continue
            relative = os.path.relpath(path, mount_root)
            top = root / point.lstrip("/")
            # a path outside the mount (a container shown its own cgroup as the root): the
            # mount itself is the process's cgroup
            folder = top if relative.startswith("..") else top / relative
            while True:
                limits.append(_limit(folder, version))
                if folder == top or top not in folder.parents:
                    break
                folder = folder.parent
    found = [x for x in limits if x is not None]
    return min(found) if found else None
