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
nothing is measured.

Others busy on the run's cores is not yet others taking them from the run: a run that uses
fewer cores than it may (a Slurm task's threads on a node Slurm did not bind it to, a GPU
run) leaves the rest to others and loses nothing. What it lost is the time its threads were
ready and waited for a core: each thread's run-queue delay, ``/proc/PID/task/TID/schedstat``
(its second field), summed over the run's threads (``waited``, in cores: thread-seconds a
second). A thread that ends between two samples takes its wait with it, so the figure is
the least the run waited."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
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
    # each of the run's threads' run-queue delay in ns, by thread id (None: not readable)
    waits: dict[int, int] | None = None


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


def thread_waits(pids: Iterable[int], proc: Path = PROC) -> dict[int, int] | None:
    """Each thread's run-queue delay (ns) of the processes ``pids``, by thread id; None
    where the kernel keeps no schedstat: built without CONFIG_SCHED_INFO (no file), or a
    kernel before 5.14 without schedstats or delay accounting on, which writes '0 0 0' for
    every thread (its run time too, which no thread that ran has). A thread costs about
    8 us: 0.3 of a 0.7-ms sample for a 2-rank CPU run's 39 threads (a node of 8 GPU ranks
    and their loader workers may hold 500: 4 ms). A process that ended since it was listed
    is skipped. ``proc``: where /proc is (a test's tree)."""
    waits: dict[int, int] = {}
    ran = 0
    for pid in pids:
        try:
            threads = os.listdir(proc / str(pid) / "task")
        except OSError:
            continue
        for tid in threads:
            text = _read(str(proc / str(pid) / "task" / tid / "schedstat"))
            if text is None:
                if not (proc / str(pid) / "task" / tid).exists():
                    continue  # ended
                return None
            fields = text.split()
            if len(fields) < 2:
                return None
            ran += int(fields[0])
            waits[int(tid)] = int(fields[1])
    return waits if ran or not waits else None


def waited_between(start: dict[int, int], end: dict[int, int]) -> int:
    """The ns the threads waited between two readings: each thread's growth, a thread
    started between them from 0 (a thread id reused inside one interval would count
    wrongly; Linux hands ids out in turn)."""
    return sum(max(0, ns - start.get(tid, 0)) for tid, ns in end.items())


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # ended since it was listed
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_stat(pid: int) -> bytes | None:
    return _read(f"/proc/{pid}/stat")


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
        waits = thread_waits(stats)
        at = time.perf_counter()
        busy, steal = core_ticks(self.cores, (PROC / "stat").read_text())
        return CpuSample(at, busy, steal, tree_ticks(self.root, stats), waits)

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
        (``steal``), and the run's threads' wait for a core (``waited``: thread-seconds a
        second; absent where the kernel does not keep it); None for an interval too short
        to hold a tick."""
        seconds = end.at - start.at
        if seconds <= 1 / self.tick:
            return None
        per_core_s = self.tick * seconds

        def cores(ticks: int) -> float:
            return round(ticks / per_core_s, 3)

        ours = end.ours - start.ours
        load = {"run": cores(ours), "others": cores(max(0, end.busy - start.busy - ours)),
                "steal": cores(end.steal - start.steal)}
        if start.waits is not None and end.waits is not None:
            load["waited"] = round(waited_between(start.waits, end.waits) / 1e9 / seconds, 3)
        return load

    def described(self) -> dict[str, int]:
        """What the record keeps of the meter: how many cores it read."""
        return {"cores": len(self.cores)}

