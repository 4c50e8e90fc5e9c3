"""Whether a run had its cores to itself: each timed epoch's load on rank 0's cores, split
into the run's own processes and everyone else's, from Linux's counters; a run that other
work slowed says so in its record, at its end and in the report."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import FAST, ROOT, assert_ok, only_record, records, run_bench

from bench.measure.machine_load import (
    CpuSample,
    LoadMeter,
    core_ticks,
    thread_waits,
    tree_ticks,
)
from bench.records.describe import cpu_load_figures, shared_cores
from bench.tools import terminal

STAT = """cpu  900 10 300 5000 20 0 7 40 0 0
cpu0 100 0 50 2000 10 0 5 30 0 0
cpu1 200 10 100 1000 10 0 2 10 0 0
cpu2 600 0 150 2000 0 0 0 0 0 0
intr 12345 0 0
"""


def test_the_cores_counters_are_read_for_the_cores_asked():
    """user + nice + system is busy (idle, iowait and interrupts are not), steal apart,
    summed over the cores named only: cpu0 is 100+0+50, cpu1 200+10+100 (their softirq,
    5 and 2, nobody's)."""
    assert core_ticks(frozenset({0, 1}), STAT) == (150 + 310, 40)
    assert core_ticks(frozenset({2}), STAT) == (750, 0)


def _stat(pid: int, name: str, ppid: int, utime: int, stime: int, cutime: int = 0,
          cstime: int = 0) -> bytes:
    return (f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 4194304 100 0 0 0 "
            f"{utime} {stime} {cutime} {cstime} 20 0 4 0 500 1000 200").encode()


def test_the_runs_processes_are_the_tree_under_its_launcher():
    """The launcher (10), torchrun under it (11), two ranks (12, 13: one reaped a worker,
    its cutime), a live loader worker (14, its name holding ') ' as a process may name
    itself); the shell above (1) and a neighbour (20) are not the run's."""
    stats = {
        1: _stat(1, "bash", 0, 5000, 500),
        10: _stat(10, "bench", 1, 30, 10),
        11: _stat(11, "torchrun", 10, 20, 5),
        12: _stat(12, "python", 11, 700, 100, cutime=40, cstime=10),
        13: _stat(13, "python", 11, 650, 90),
        14: _stat(14, "pt_data_worker) (1", 12, 80, 20),
        20: _stat(20, "burner", 1, 9000, 0),
    }
    assert tree_ticks(10, stats) == 40 + 25 + 850 + 740 + 100
    assert tree_ticks(12, stats) == 850 + 100
    assert tree_ticks(99, stats) == 0  # gone: nothing of it left


def test_a_process_that_starts_between_samples_is_the_runs_and_others_are_not():
    """The meter reads each process's parent once, when it first sees it: a loader worker
    started after a sample is the run's at the next one; init, never. Real processes."""
    meter = LoadMeter(os.getpid())
    first = meter.run_stats()
    child = subprocess.Popen(["sleep", "30"])
    try:
        second = meter.run_stats()
    finally:
        child.kill()
        child.wait()
    assert os.getpid() in first and child.pid not in first
    assert child.pid in second and 1 not in second
    assert child.pid not in meter.run_stats()  # gone: forgotten


def test_a_windows_cores_are_its_ticks_over_its_seconds():
    """Two seconds at 100 ticks a second: 160 of the run's ticks are 0.8 cores; 300 busy
    ticks less the run's 160 leave 0.7 to others; 20 stolen are 0.1. A neighbour that
    counted less than the run (ticks are sampled) is 0, not below."""
    meter = LoadMeter(os.getpid())
    meter.tick = 100
    start = CpuSample(at=10.0, busy=1000, steal=5, ours=400)
    assert meter.between(start, CpuSample(at=12.0, busy=1300, steal=25, ours=560)) == {
        "run": 0.8, "others": 0.7, "steal": 0.1}
    assert meter.between(start, CpuSample(at=12.0, busy=1150, steal=5, ours=560))[
        "others"] == 0.0
    assert meter.between(start, CpuSample(at=10.005, busy=1000, steal=5, ours=400)) is None


def _threads(tmp_path, lines: dict[tuple[int, int], str | None]):
    """A /proc holding each (pid, tid)'s schedstat line (None: the thread, no file)."""
    for (pid, tid), line in lines.items():
        folder = tmp_path / str(pid) / "task" / str(tid)
        folder.mkdir(parents=True)
        if line is not None:
            (folder / "schedstat").write_text(line + "\n")
    return tmp_path


def test_each_threads_wait_is_read_where_the_kernel_keeps_it(tmp_path):
    """Every thread of the processes asked for, by thread id (the second field); a process
    gone is skipped. A kernel that keeps none says so: no file, or '0 0 0' for every thread,
    run time too (a kernel before 5.14 without schedstats), which would read as no wait."""
    kept = _threads(tmp_path / "kept", {(10, 10): "900 50 3", (10, 11): "400 70 2",
                                        (12, 12): "100 0 1"})
    assert thread_waits([10, 12, 99], kept) == {10: 50, 11: 70, 12: 0}
    zeros = _threads(tmp_path / "zeros", {(10, 10): "0 0 0", (10, 11): "0 0 0"})
    assert thread_waits([10], zeros) is None
    absent = _threads(tmp_path / "absent", {(10, 10): None})
    assert thread_waits([10], absent) is None
    assert thread_waits([99], kept) == {}  # nothing of it left: nothing waited
    assert thread_waits([os.getpid()])[threading.get_native_id()] >= 0  # this machine's


def test_the_runs_wait_for_a_core_is_each_threads_growth():
    """Over 2 s: thread 1 waited 0.4 s more, thread 2 0.3, thread 3 (new) 0.2 from 0;
    thread 4 ended (its wait is gone with it, not subtracted): 0.9 s / 2 s = 0.45 cores.
    Unread at either end (a kernel without schedstat): no figure at all."""
    meter = LoadMeter(os.getpid())
    meter.tick = 100
    ms = 1_000_000
    start = CpuSample(at=10.0, busy=1000, steal=5, ours=400,
                      waits={1: 100 * ms, 2: 0, 4: 900 * ms})
    end = CpuSample(at=12.0, busy=1300, steal=25, ours=560,
                    waits={1: 500 * ms, 2: 300 * ms, 3: 200 * ms})
    assert meter.between(start, end)["waited"] == 0.45
    assert "waited" not in meter.between(start, dataclasses.replace(end, waits=None))


def test_the_summary_weighs_each_epoch_by_its_length():
    """A 1-s epoch at 0.2 others' cores and a 3-s one at 1.0: (0.2 + 3.0) / 4 = 0.8."""
    epochs = [{"train_time_s": 1.0, "cpu_load": {"run": 1.0, "others": 0.2, "steal": 0.0}},
              {"train_time_s": 3.0, "cpu_load": {"run": 0.6, "others": 1.0, "steal": 0.2}}]
    assert cpu_load_figures(epochs) == {"run_cores": 0.7, "others_cores": 0.8,
                                        "steal_cores": 0.15}
    assert cpu_load_figures([{"train_time_s": 1.0}]) == {}  # not measured: nothing said
    # the wait for a core, where every epoch measured it
    waited = [{**e, "cpu_load": {**e["cpu_load"], "waited": w}} for e, w in zip(epochs, (0.4, 0.8))]
    assert cpu_load_figures(waited)["waited_cores"] == 0.7
    assert "waited_cores" not in cpu_load_figures([waited[0], epochs[1]])


def _measured(cores: int, run: float, others: float, steal: float = 0.0,
              waited: float | None = None) -> dict:
    """A record whose timed epoch measured these cores, after a warm-up beside 2 cores'
    other work (not counted: the warm-up's times are not the run's figures)."""
    warmup = {"train_time_s": 1.0, "cpu_load": {"run": 0.0, "others": 2.0, "steal": 0.0,
                                                 "waited": 2.0}}
    timed = {"train_time_s": 1.0, "cpu_load": {"run": run, "others": others, "steal": steal}}
    if waited is not None:
        timed["cpu_load"]["waited"] = waited
    else:
        del warmup["cpu_load"]["waited"]
    return {"cpu_load_sampled": {"cores": cores}, "per_epoch": [warmup, timed]}


def _found(rec: dict) -> tuple | None:
    shared = shared_cores(rec)
    return None if shared is None else (shared.taken, shared.cores)


def test_a_run_is_shared_where_others_took_cores_it_would_have_used():
    """2 cores: others' 0.9 beside the run's 1.0 filled them (flagged); the same 0.9 beside
    a run that used 0.5 left a core idle (not); 0.2 is a daemon's. 64 cores: 2 taken is
    under 5 % of them. A hypervisor's steal counts as taken. Where the record measured the
    run's threads' wait for a core, they must have waited as long as the least taken: the
    cores full but the run's threads never kept waiting (it used fewer than it could) is
    not shared."""
    assert _found(_measured(2, 1.0, 0.9)) == (0.9, 2)
    assert _found(_measured(2, 0.5, 0.9)) is None
    assert _found(_measured(2, 1.8, 0.2)) is None
    assert _found(_measured(64, 62.0, 2.0)) is None
    assert _found(_measured(2, 1.5, 0.1, steal=0.3)) == (0.4, 2)
    assert _found({"per_epoch": [{"train_time_s": 1.0}] * 2}) is None  # from before
    assert _found({**_measured(2, 1.0, 0.9), "cpu_load_sampled": {"cores": "2"}}) is None
    assert _found(_measured(2, 1.0, 0.9, waited=0.02)) is None
    assert _found(_measured(2, 1.0, 0.9, waited=0.6)) == (0.9, 2)
    assert shared_cores(_measured(2, 1.0, 0.9, waited=0.6)).waited == 0.6
    assert _found(_measured(64, 30.0, 32.0, waited=2.0)) is None  # under 5 % of 64: 3.2


BUSY = "while :; do :; done"


def _load_beside_a_loop(run_loops: int, cores: list[int]) -> dict[str, float]:
    """``cpu_load`` over 3 s of a run of ``run_loops`` busy shell loops (one process tree,
    its own session, as bench run is) beside one busy loop of another session, all on
    ``cores``."""
    def pin() -> None:
        os.sched_setaffinity(0, cores)

    run = subprocess.Popen(["sh", "-c", " & ".join([BUSY] * run_loops) + " & wait"],
                           start_new_session=True, preexec_fn=pin)
    other = subprocess.Popen(["sh", "-c", BUSY], start_new_session=True, preexec_fn=pin)
    try:
        time.sleep(0.5)
        meter = LoadMeter(run.pid)
        meter.cores = frozenset(cores)
        start = meter.sample()
        time.sleep(3)
        return meter.between(start, meter.sample())
    finally:
        for proc in (run, other):
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.serial  # the waits are the loops' alone: a neighbour's threads would add theirs
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_full_cores_are_shared_only_where_the_run_waited_for_them():
    """On 2 cores, beside one busy loop of another program: a run of one loop used one core
    and left the other to it, lost nothing and waited for none (not shared, though the
    cores were full); a run of two loops wanted both and waited for a core about all the
    time (shared). Measured: waited 0.001 and 1.0 cores."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    for loops, shared in ((1, False), (2, True)):
        load = _load_beside_a_loop(loops, cores)
        assert load["others"] > 0.6 and load["run"] + load["others"] > 1.8, (loops, load)
        rec = {"cpu_load_sampled": {"cores": 2},
               "per_epoch": [{"train_time_s": 3.0, "cpu_load": load}] * 2}
        found = shared_cores(rec)
        assert (found is not None) == shared, (loops, load)
        assert load["waited"] > 0.5 if shared else load["waited"] < 0.1, (loops, load)


def _busy_loops(count: int) -> list[subprocess.Popen]:
    """Processes that keep a core busy each, on this process's cores, not under the run's
    launcher. Each in a session of its own, as another program is: Linux's scheduler
    shares a core between sessions first (autogroup), so two loops in one session beside
    the run held 0.39 of a core between them, and in two, about 2/3."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             start_new_session=True) for _ in range(count)]


def test_a_run_beside_other_work_says_so_and_a_quiet_one_does_not(tmp_path):
    """The same one-rank run (a loader worker beside it, which is the run's too), alone on
    its cores, then beside two busy loops on them: alone, its own processes kept the cores
    busy and others next to nothing; beside the loops, others took what the loops took,
    and the run's end, its record and the report say so."""
    args = ["run", "--strategy", "ddp", "--gpus", "1", "--cpu", "--data", "synthetic",
            "--synthetic-difficulty", "0", "--train-limit", "768", "--test-limit", "64",
            "--epochs", "3", "--workers", "1", *FAST]
    quiet = run_bench(*args, "--output", str(tmp_path / "quiet"))
    assert_ok(quiet)
    alone = only_record(tmp_path / "quiet")
    cores = len(os.sched_getaffinity(0))
    assert alone["cpu_load_sampled"] == {"cores": cores}
    loads = [e["cpu_load"] for e in alone["per_epoch"]]
    assert all(load["others"] < 0.2 for load in loads), loads
    # the rank under torchrun under bench, and its worker: ours, not others'
    assert all(load["run"] > 0.6 for load in loads), loads
    assert all(load["waited"] >= 0 for load in loads), loads  # the threads' wait, measured
    assert "other processes" not in quiet.stderr, quiet.stderr

    # the loops start once rank 0 has started the record (its norm set; the epochs next): its
    # start-up (torch imported twice) beside them took most of the test's time (52 s)
    crowded = subprocess.Popen([sys.executable, "-m", "bench", *args, "--output",
                                str(tmp_path / "crowded")], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    loops = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and crowded.poll() is None:
            found = records(tmp_path / "crowded")
            if found and found[0].get("norm") is not None:
                break
            time.sleep(0.05)
        loops = _busy_loops(2)
        out, err = crowded.communicate(timeout=240)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        if crowded.poll() is None:
            crowded.kill()
    crowded = subprocess.CompletedProcess(crowded.args, crowded.returncode, out, err)
    assert_ok(crowded)
    shared = only_record(tmp_path / "crowded")
    summary = shared["summary"]
    taken = summary["others_cores"]
    # two loops and one rank share the cores: the loops hold about 2/3 of one core, and of
    # two cores about 1 (the rank's threads take the rest)
    assert taken > 0.4 * min(cores, 2), shared["per_epoch"]
    # and none left idle, the hypervisor's share (steal) counted as shared_cores counts it:
    # a CI runner's one core read run 0.261 + others 0.485, the rest not in the assertion
    assert summary["run_cores"] + taken + summary["steal_cores"] > 0.9 * cores, \
        shared["per_epoch"]
    assert summary["waited_cores"] > 0.25, shared["per_epoch"]  # the loops' cores
    assert "bench: note: other processes kept" in crowded.stderr, crowded.stderr
    report = run_bench("report", "--results", str(tmp_path / "crowded"), "--no-write")
    assert report.returncode == 0, report.stderr
    assert "ok ⚠ shared cores" in report.stdout, report.stdout
    said = " ".join(report.stderr.split())
    # the figure the run recorded (its rank's counters), as the report prints it
    taken = shared["summary"]["others_cores"] + shared["summary"]["steal_cores"]
    kept = f"other processes kept {taken:.1f} of the {terminal.count(cores, 'core')}"
    waited = f"its threads waited {shared['summary']['waited_cores']:.1f} thread-seconds"
    assert f"{kept} it could use" in said and waited in said, said
    assert "rerun it on a quiet machine" in said, said
    quiet_report = run_bench("report", "--results", str(tmp_path / "quiet"), "--no-write")
    assert "shared cores" not in quiet_report.stdout + quiet_report.stderr
