"""A CPU quota (a container's --cpus, a Kubernetes CPU limit) is CPU time, not cores: the
ranks' threads are sized to it, and the record names the machine with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST, ROOT, assert_ok, only_record

from bench.records.describe import cpu_model
from bench.tools.cores import cpu_quota, slurm_cores

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")


def _tree(tmp_path: Path, cgroup: str, mountinfo: str, limits: dict[str, dict[str, str]]
          ) -> tuple[Path, Path]:
    """A /proc/self and a file system holding ``limits`` (folder -> file -> text)."""
    proc, root = tmp_path / "proc", tmp_path / "root"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    for folder, files in limits.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (root / folder / name).write_text(text)
    return proc, root


V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
             "33 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")


def test_a_slurm_jobs_cpus_on_the_node_inside_a_job_only():
    """SLURM_CPUS_ON_NODE counts inside a job (SLURM_JOB_ID); a leftover one outside a job,
    or one that is not a positive count, says nothing."""
    assert slurm_cores({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "3"}) == 3
    assert slurm_cores({"SLURM_CPUS_ON_NODE": "3"}) is None
    assert slurm_cores({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "0"}) is None
    assert slurm_cores({"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "2(x3)"}) is None
    assert slurm_cores({"SLURM_JOB_ID": "7"}) is None


def test_a_v1_quota_is_the_lowest_on_the_way_up(tmp_path):
    """A job allowed 1.5 cores (150 ms each 100 ms) whose task folder sets none: 1.5; the
    memory controller's folder, which holds a quota file of no meaning, is not read."""
    proc, root = _tree(tmp_path, "5:memory:/job\n4:cpu,cpuacct:/job/task\n0::/\n", V1_MOUNTS, {
        "sys/fs/cgroup/cpu,cpuacct": {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"},
        "sys/fs/cgroup/cpu,cpuacct/job": {"cpu.cfs_quota_us": "150000",
                                          "cpu.cfs_period_us": "100000"},
        "sys/fs/cgroup/cpu,cpuacct/job/task": {"cpu.cfs_quota_us": "-1",
                                               "cpu.cfs_period_us": "100000"},
        "sys/fs/cgroup/memory/job": {"cpu.cfs_quota_us": "10000",
                                     "cpu.cfs_period_us": "100000"}})
    assert cpu_quota(proc, root) == 1.5


def test_a_v2_quota_and_none(tmp_path):
    """cgroup v2's cpu.max: a pod of 2.5 cores ('250000 100000') above a container with
    'max'; then nothing limits ('max' everywhere): None."""
    mounts = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    limited = {"sys/fs/cgroup/kube/pod": {"cpu.max": "250000 100000\n"},
               "sys/fs/cgroup/kube/pod/ctr": {"cpu.max": "max 100000\n"}}
    proc, root = _tree(tmp_path / "a", "0::/kube/pod/ctr\n", mounts, limited)
    assert cpu_quota(proc, root) == 2.5
    proc, root = _tree(tmp_path / "b", "0::/kube/pod/ctr\n", mounts,
                       {"sys/fs/cgroup/kube/pod/ctr": {"cpu.max": "max 100000\n"}})
    assert cpu_quota(proc, root) is None


def test_a_container_sees_its_own_cgroup_at_the_mount(tmp_path):
    """Inside a container the mount's root is the container's cgroup ('/docker/abc'), and
    /proc/self/cgroup shows that path, or '/' under a cgroup namespace: either way the
    limit is the mount point's own (Docker's --cpus 1)."""
    mounts = "40 35 0:33 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"
    limit = {"sys/fs/cgroup": {"cpu.max": "100000 100000\n"}}
    for seen in ("/docker/abc", "/"):
        proc, root = _tree(tmp_path / (seen.strip("/").replace("/", "-") or "ns"), f"0::{seen}\n",
                           mounts, limit)
        assert cpu_quota(proc, root) == 1.0, seen


def _quota_unavailable() -> str | None:
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        return "no cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
    if os.geteuid() != 0:
        return "making a cpu cgroup needs root"
    if len(os.sched_getaffinity(0)) < 2 and os.cpu_count() < 2:
        return "a quota below the cores needs 2 cores"
    return None


def test_a_run_under_a_one_core_quota_gives_its_rank_one_thread(tmp_path):
    """On every core of this machine, under a real cgroup allowing 1 core's time: the rank
    takes 1 thread, not one per core (each beyond the quota is throttled), and its record
    names the quota and the machine with it."""
    why = _quota_unavailable()
    if why:
        pytest.skip(why)
    folder = CGROUP_CPU / f"bench-test-quota-{os.getpid()}"
    folder.mkdir()
    try:
        (folder / "cpu.cfs_period_us").write_text("100000")
        (folder / "cpu.cfs_quota_us").write_text("100000")
        every_core = set(range(os.cpu_count()))

        def enter() -> None:  # in the child, before exec: every core, then the quota
            os.sched_setaffinity(0, every_core)
            (folder / "cgroup.procs").write_text(str(os.getpid()))

        out = tmp_path / "out"
        proc = subprocess.run(
            [sys.executable, "-m", "bench", "run", "--strategy", "dp", "--gpus", "1", "--cpu",
             "--data", "synthetic", "--train-limit", "64", "--test-limit", "32", "--epochs",
             "1", *FAST, "--output", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=enter)
        assert_ok(proc)
    finally:
        folder.rmdir()
    rec = only_record(out)
    assert rec["threads_per_process"] == 1, json.dumps(rec["env"])
    assert rec["env"]["cpu_quota_cores"] == 1.0
    assert cpu_model(rec).endswith(f"({os.cpu_count()} cores, 1 allowed)"), cpu_model(rec)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores to pin a run to one")
def test_a_run_pinned_to_one_core_says_so(tmp_path):
    """Pinned to one of the machine's cores (taskset; a Slurm task's cpuset is the same):
    the rank takes 1 thread, and the record keeps the cores it could use. (The suite's
    workers are pinned to a core each already; the run is pinned here, so that it is, alone
    too.)"""
    def pin() -> None:
        os.sched_setaffinity(0, {0})

    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--strategy", "dp", "--gpus", "1", "--cpu",
         "--data", "synthetic", "--train-limit", "64", "--test-limit", "32", "--epochs", "1",
         *FAST, "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=pin)
    assert_ok(proc)
    rec = only_record(out)
    assert (rec["threads_per_process"], rec["env"]["usable_cores"]) == (1, 1), rec["env"]
