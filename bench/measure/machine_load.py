"""Whether a run had its cores to itself: how busy the cores it may run on were over each
timed epoch, and how much of that was the run's own processes. The rest is other programs
(another job, a test suite, a compiler) taking the cores the run's times assume it had:
a benchmark on a shared machine measures the sharing, and its record should say so rather
than leave the report to guess it from the times.

Read from Linux's own counters, on the machine of the record's rank, outside the timed
region: ``/proc/stat`` (each core's busy ticks: user, nice, system; steal
apart, the time a hypervisor gave the core to another guest) and ``/proc/PID/stat`` of the
run's processes (the tree under its launcher on this machine: ranks, loader workers,
compile workers; the children they reaped are in their ``cutime``). Elsewhere (no /proc)
nothing is measured."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSample:
    """Cumulative counters at one moment (``at``: perf_counter seconds), in clock ticks."""

    at: float
    busy: int  # the run's cores busy: user, nice, system (interrupts: nobody's)
    steal: int  # the run's cores given to another guest by the hypervisor
    ours: int  # the run's processes: utime + stime + their reaped children's


def core_ticks(cores: frozenset[int], stat: str) -> tuple[int, int]:
    """(busy, steal) ticks of ``cores`` summed from ``/proc/stat``'s ``cpuN`` lines. Time
    in interrupts (irq, softirq) is counted to no one: it is the kernel's, not a process's,
    and a run's own network traffic raises it, which would read as other work."""
    busy = steal = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        # user nice system idle iowait irq softirq steal (guest is counted in user)
        fields = [int(x) for x in rest.split()[:8]]
        busy += fields[0] + fields[1] + fields[2]
        steal += fields[7]
    return busy, steal


def _fields(text: bytes) -> list[bytes]:
    """The fields of a ``/proc/PID/stat`` after its name (which may hold spaces and ')')."""
    return text[text.rindex(b")") + 2:].split()


def tree_ticks(root: int, stats: dict[int, bytes]) -> int:
    """CPU ticks of ``root`` and every process below it (``stats``: pid -> its
    ``/proc/PID/stat``), their reaped children included (``cutime``, ``cstime``)."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for pid, text in stats.items():
        fields = _fields(text)
        children.setdefault(int(fields[1]), []).append(pid)  # ppid
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total


def _read_stat(pid: int) -> bytes | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:  # ended since it was listed
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


class LoadMeter:
    """Samples of the cores this process may use and of the run's processes under
    ``root`` (its launcher on this machine)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.cores = frozenset(os.sched_getaffinity(0))
        self.tick = os.sysconf("SC_CLK_TCK")
        self.parents: dict[int, int] = {}  # pid -> ppid of every process seen

    @classmethod
    def here(cls, root: int) -> LoadMeter | None:
        """A meter where Linux's counters can be read, else None."""
        try:
            meter = cls(root)
            meter.sample()
        except (OSError, AttributeError, ValueError):
            return None
        return meter

    def sample(self) -> CpuSample:
        stats = self.run_stats()
        at = time.perf_counter()
        busy, steal = core_ticks(self.cores, (PROC / "stat").read_text())
        return CpuSample(at, busy, steal, tree_ticks(self.root, stats))

    def run_stats(self) -> dict[int, bytes]:
        """``/proc/PID/stat`` of the processes under the root. Each process's parent is read
        once, when it first appears; only the run's are read at every sample. Reading every
        process's (the kernel writes each on demand) took 12-25 ms a sample among 1,000
        processes, as a GPU machine's kernel threads alone can number, and a sample is
        taken twice an epoch: inside a time to target. A pid reused between two samples
        by a process of the run is missed until its parent is read again (never, here)."""
        live = {int(name) for name in os.listdir(PROC) if name.isdigit()}
        for gone in self.parents.keys() - live:
            del self.parents[gone]
        fresh = {}
        for pid in live - self.parents.keys():
            text = _read_stat(pid)
            if text is not None:
                fresh[pid], self.parents[pid] = text, int(_fields(text)[1])
        children: dict[int, list[int]] = {}
        for pid, parent in self.parents.items():
            children.setdefault(parent, []).append(pid)
        stats, todo = {}, [self.root]
        while todo:
            pid = todo.pop()
            if pid in stats:
                continue
            text = fresh.get(pid) or _read_stat(pid)
            if text is None:
                continue
            stats[pid] = text
            todo += children.get(pid, [])
        return stats

    def between(self, start: CpuSample, end: CpuSample) -> dict[str, float] | None:
        """The mean cores busy from ``start`` to ``end``: the run's own (``run``), other
        processes' (``others``: busy less the run's, never below 0) and the hypervisor's
        (``steal``); None for an interval too short to hold a tick."""
        seconds = end.at - start.at
        if seconds <= 1 / self.tick:
            return None
        per_core_s = self.tick * seconds

        def cores(ticks: int) -> float:
            return round(ticks / per_core_s, 3)

        ours = end.ours - start.ours
        return {"run": cores(ours), "others": cores(max(0, end.busy - start.busy - ours)),
                "steal": cores(end.steal - start.steal)}

    def described(self) -> dict[str, int]:
        """What the record keeps of the meter: how many cores it read."""
        return {"cores": len(self.cores)}

