"""bench under a real Slurm: munged, slurmctld and slurmd started on this machine for this
module (scripts/slurm_local.py), jobs submitted with sbatch and srun, and exactly the
daemons it started stopped at the end. Skipped with the reason where Slurm is not installed
or the tests do not run as root (.ci/run installs slurm-wlm and munge)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, HELD_MODEL, NO_PROBE, ROOT, held_env, records

sys.path.insert(0, str(ROOT / "scripts"))
import slurm_local

from benchmarks.testbed import unavailable

TESTBED_MISSING = unavailable()

pytestmark = [
    pytest.mark.skipif(slurm_local.missing() is not None,
                       reason=f"a local Slurm cannot start: {slurm_local.missing()}"),
    pytest.mark.xdist_group("slurm"),  # one cluster, one worker
]

TINY = ["--cpu", "--data", "synthetic", "--train-limit", "128", "--test-limit", "16",
        "--epochs", "1", *FAST]
# A run to cancel or kill while it trains: held in its epochs while the test's hold file
# exists (tests/data/user_models.py), each of its 60 at least 0.4 s; released, it ends in a
# second or two.
HELD = ["--cpu", "--data", "synthetic", "--train-limit", "128", "--test-limit", "16",
        "--batch-size", "32", "--no-progress", *NO_PROBE, "--epochs", "60", *HELD_MODEL]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    pids = slurm_local.up(folder)
    try:
        yield slurm_local.env_for(folder), pids
    finally:
        slurm_local.down(folder)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = pids.get(name)
            assert not pid or not slurm_local._alive(pid), f"{name} (pid {pid}) still runs"


def _wait_for(job: str, env: dict, timeout: float = 180) -> None:
    """Until squeue no longer lists the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                             text=True)
        if not out.stdout.strip():
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} still in squeue after {timeout:.0f} s")


def _sbatch(script: Path, env: dict) -> str:
    out = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True,
                         text=True, cwd=script.parent)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def test_down_ends_the_steps_and_tasks_of_a_job_still_running(tmp_path):
    """A cluster of its own (first in the module, before the shared one starts): a job
    still running when the cluster goes down leaves no slurmstepd and no task behind."""
    folder = tmp_path / "cluster"
    slurm_local.up(folder)
    try:
        env = slurm_local.env_for(folder)
        out = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 600"], env=env,
                             capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 60
        names: list[str] = []
        while time.monotonic() < deadline and "sleep" not in names:
            names = [Path(f"/proc/{pid}/comm").read_text().strip()
                     for pid in slurm_local.left_by_jobs(folder)
                     if Path(f"/proc/{pid}/comm").exists()]
            time.sleep(0.2)
        assert "sleep" in names and "slurmstepd" in names, names
        left = slurm_local.left_by_jobs(folder)
    finally:
        slurm_local.down(folder)
    assert slurm_local.left_by_jobs(folder) == []
    assert not any(slurm_local._alive(pid) for pid in left), left


def test_bench_slurm_submits_a_job_whose_two_tasks_train_as_two_ranks(slurm, tmp_path):
    """`bench slurm --cpu ... --submit` on a real cluster: sbatch runs its script, srun its
    two tasks, which form one gloo group; the record says slurm, 2 ranks, the job's id.
    From a folder with a space in its name, which the script's --chdir names: sbatch refused
    the script ('Invalid directive found in batch script') until the value was quoted."""
    env, pids = slurm
    assert pids["seconds"] < 30  # the cluster came up (sinfo: idle) within seconds
    tmp_path = tmp_path / "my jobs"
    tmp_path.mkdir()
    out = tmp_path / "results"
    script = tmp_path / "job.sbatch"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "slurm", "--cpu", "--nodes", "1", "--gpus", "2",
         "--strategy", "ddp", "--time", "00:05:00", "--out", str(script), *TINY,
         "--output", str(out), "--submit"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = script.read_text()
    assert "--gpus-per-node" not in text and "#SBATCH --cpus-per-task=1" in text
    assert 'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK}"' in text
    job = proc.stdout.strip().split()[-1]  # "Submitted batch job N"
    _wait_for(job, env)
    (rec,) = records(out)
    log = (tmp_path / f"parallel-bench-{job}.out").read_text()
    assert rec["status"] == "ok", log
    assert rec["launcher"] == "slurm" and rec["world_size"] == 2, rec
    assert f"slurm{job}." in rec["run_id"] and rec["threads_per_process"] == 1
    # each task says where the record goes; task 1, that it is task 0's to write
    assert log.count(f"bench: record {out}/runs/{rec['run_id']}.json\n") == 1, log
    assert log.count("bench: record (Slurm task 0 writes it) ") == 1, log


def test_a_batch_step_and_a_one_task_step_launch_the_ranks_themselves(slurm, tmp_path):
    """sbatch's batch step (no srun) and a one-task srun step set SLURM_PROCID and
    SLURM_NTASKS too. bench followed them: 'rank 0 of 2' in the batch step waited for a peer
    that never came, and a one-task step ran one rank instead of --gpus 2. It now says why
    it does not follow them and launches --gpus ranks itself."""
    env, _ = slurm
    out = tmp_path / "results"
    bench = f"{sys.executable} -m bench run --strategy ddp --gpus 2 {' '.join(TINY)}"
    script = tmp_path / "batch.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --ntasks=2", f"#SBATCH --output={tmp_path}/batch-%j.out",
        f"#SBATCH --chdir={ROOT}", "set -e",
        f"{bench} --output {out}/batch",  # the batch step itself
        f"srun --ntasks=1 {bench} --output {out}/one-task",  # a step of one task
        "", ]))
    job = _sbatch(script, env)
    _wait_for(job, env)
    log = (tmp_path / f"batch-{job}.out").read_text()
    assert f"in Slurm job {job}'s batch step: launching the ranks here" in log, log
    assert f"in a one-task step of Slurm job {job}: launching the ranks here" in log, log
    for where in ("batch", "one-task"):
        (rec,) = records(out / where)
        assert rec["status"] == "ok" and rec["world_size"] == 2, (where, log)
        assert rec["launcher"] == "torchrun", rec["launcher"]


def test_a_step_whose_tasks_do_not_match_the_ranks_asked_for_is_refused(slurm, tmp_path):
    """Two srun tasks asked for --gpus 1 each would have made one 2-rank group of a run
    that asked for 1 rank. Refused, naming the fix, before anything is written; and two runs
    of one step (a sweep's repeats: other seeds) write two records, not one over the other."""
    env, _ = slurm
    out = tmp_path / "results"
    bench = f"{sys.executable} -m bench run --strategy ddp {' '.join(TINY)} --output {out}"
    script = tmp_path / "steps.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --ntasks=2", f"#SBATCH --output={tmp_path}/steps-%j.out",
        f"#SBATCH --chdir={ROOT}",
        f"srun --ntasks=2 {bench} --gpus 1 || echo 'mismatch exited' $?",
        f"srun --ntasks=2 {bench} --gpus 2 --seed 0 && srun --ntasks=2 {bench} --gpus 2 "
        "--seed 1", ""]))
    job = _sbatch(script, env)
    _wait_for(job, env)
    log = (tmp_path / f"steps-{job}.out").read_text()
    assert "this srun step has 2 tasks on 1 node(s) (SLURM_STEP_NUM_TASKS), but --gpus 1 " \
        "asks for 1 ranks" in log, log
    assert "mismatch exited 2" in log, log
    found = records(out)
    assert sorted(r["seed"] for r in found) == [0, 1], log
    assert {r["status"] for r in found} == {"ok"} and len({r["run_id"] for r in found}) == 2


def test_cores_come_from_the_tasks_own_cpus(slurm, tmp_path):
    """A task given 2 CPUs (--cpus-per-task, inherited by srun through SRUN_CPUS_PER_TASK)
    trains with 2 threads; bench once divided the machine's cores by the tasks again. A
    batch step given 1 trains with 1; it once took the node's every core."""
    env, _ = slurm
    # srun's task of 2 CPUs; a batch step that launches its one rank itself (a sweep's
    # array task does), given 1 CPU of the node's 2 by a Slurm that does not bind tasks
    # (task/none): 1 thread, not the node's every core, which other jobs share
    for name, cpus, launch in (("cpus", 2, "srun "), ("batch", 1, "")):
        out = tmp_path / name
        script = tmp_path / f"{name}.sbatch"
        script.write_text("\n".join([
            "#!/bin/bash", "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={cpus}",
            f"#SBATCH --output={tmp_path}/{name}-%j.out", f"#SBATCH --chdir={ROOT}",
            'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK}"',
            f"{launch}{sys.executable} -m bench run --strategy ddp --gpus 1 {' '.join(TINY)} "
            f"--output {out}", ""]))
        job = _sbatch(script, env)
        _wait_for(job, env)
        (rec,) = records(out)
        assert rec["status"] == "ok", (tmp_path / f"{name}-{job}.out").read_text()
        assert rec["threads_per_process"] == cpus, name


def _submitted(stdout: str) -> list[str]:
    found = re.search(r"submitted job arrays? ([\d, ]+):", stdout)
    assert found, stdout
    return [j.strip() for j in found.group(1).split(",")]


def test_a_sweep_runs_as_job_arrays_one_record_per_combination(slurm, tmp_path):
    """`bench sweep --slurm --submit`: one array per world size, task i runs combination i
    through the local sweep's path; every combination leaves one ok record in the shared
    folder, `bench report` reads them, and submitting again runs nothing twice."""
    env, _ = slurm
    out = tmp_path / "results"
    sweep = [sys.executable, "-m", "bench", "sweep", "--slurm", "--strategies", "dp,ddp",
             "--gpus", "1,2", *TINY, "--output", str(out), "--submit", "--time", "00:05:00"]
    started = time.monotonic()
    proc = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = _submitted(proc.stdout)
    assert len(jobs) == 2  # world sizes 1 and 2: an array each
    for job in jobs:
        _wait_for(job, env)
    wall = time.monotonic() - started
    found = records(out)
    logs = "".join(p.read_text() for p in (out / "slurm").glob("*.out"))
    # dp N=2 on CPU is dp N=1's run (one replica), left out
    assert len(found) == 3 and {r["status"] for r in found} == {"ok"}, logs
    assert sorted((r["strategy"], r["gpus_requested"]) for r in found) == [
        ("ddp", 1), ("ddp", 2), ("dp", 1)]
    assert len({r["tag"] for r in found}) == 3
    print(f"arrays of 3 combinations: {wall:.0f} s")
    report = subprocess.run([sys.executable, "-m", "bench", "report", "--results", str(out),
                             "--no-write"], cwd=ROOT, capture_output=True, text=True)
    assert report.returncode == 0 and "ddp" in report.stdout, report.stderr
    again = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    for job in _submitted(again.stdout):
        _wait_for(job, env)
    assert len(records(out)) == 3  # nothing ran twice
    logs = "".join(p.read_text() for p in (out / "slurm").glob("*.out"))
    assert logs.count("ok record exists, skipped") == 3, logs


def test_exclusive_on_a_partition_that_forces_sharing_is_said_to_do_nothing(slurm, tmp_path):
    """Slurm ignores --exclusive on a partition of OverSubscribe=FORCE (the local one's
    default): bench sweep and bench slurm say so, naming it; on the shared partition
    (OverSubscribe=NO), where it holds, they say nothing. Nothing is submitted."""
    env, _ = slurm
    note = "shares its nodes by force (OverSubscribe=FORCE:4): Slurm ignores --exclusive"
    for partition, forced in ((None, True), ("shared", False), ("local", True)):
        where = ["--partition", partition] if partition else []
        sweep = subprocess.run(
            [sys.executable, "-m", "bench", "sweep", "--slurm", "--dry-run", "--exclusive",
             *where, "--strategies", "ddp", "--gpus", "1", "--cpu", "--output",
             str(tmp_path / "sweep")], cwd=ROOT, env=env, capture_output=True, text=True)
        assert sweep.returncode == 0, sweep.stderr
        said = " ".join(sweep.stderr.split())
        assert (f"partition local {note}" in said) == forced, (partition, said)
    one = subprocess.run(
        [sys.executable, "-m", "bench", "slurm", "--nodes", "1", "--gpus", "1", "--cpu",
         "--strategy", "ddp", "--exclusive", "--out", str(tmp_path / "job.sbatch")],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert one.returncode == 0 and note in " ".join(one.stderr.split()), one.stderr


def _spans(out: Path) -> list[tuple[str, str]]:
    """Each record's (started_at, finished_at), earliest first (ISO times of one zone sort
    as text)."""
    return sorted((r["started_at"], r["finished_at"]) for r in records(out))


def _wait_idle(env: dict, timeout: float = 60) -> None:
    """Until sinfo shows the node idle: no job holds any of its cores."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                             text=True)
        if set(out.stdout.split()) == {"idle"}:
            return
        time.sleep(0.3)
    raise AssertionError(f"the node not idle after {timeout:.0f} s")


def test_exclusive_array_tasks_take_the_node_whole(slurm, tmp_path):
    """On a partition whose jobs share a node's free cores (OverSubscribe=NO, a site's
    usual one), a sweep's two one-core array tasks run at once on the 2-core node; with
    --exclusive each takes the node whole, so the second starts only after the first ended.
    Judged by the records' own start and end times."""
    env, _ = slurm
    spans = {}
    for mode, extra in (("packed", []), ("whole", ["--exclusive"])):
        _wait_idle(env)  # an ended job's cores come back a moment after squeue drops it
        out = tmp_path / mode
        proc = subprocess.run(
            [sys.executable, "-m", "bench", "sweep", "--slurm", "--submit", "--partition",
             "shared", *extra, "--strategies", "ddp,dp", "--gpus", "1", *TINY,
             "--train-limit", "512", "--epochs", "3", "--output", str(out),
             "--time", "00:05:00"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (job,) = _submitted(proc.stdout)
        _wait_for(job, env)
        logs = "".join(p.read_text() for p in (out / "slurm").glob("*.out"))
        assert [r["status"] for r in records(out)] == ["ok", "ok"], logs
        spans[mode] = _spans(out)
        # each rank's threads: the task's one core, or the whole node's 2 (this Slurm does
        # not bind tasks to cores: the job's CPUs on the node say it)
        threads = {r["threads_per_process"] for r in records(out)}
        assert threads == ({2} if extra else {1}), (mode, threads)
    (_, first_end), (second_start, _) = spans["packed"]
    assert second_start < first_end, spans  # they ran at once
    (_, first_end), (second_start, _) = spans["whole"]
    assert second_start >= first_end, spans  # one after the other


def _first_running(out: Path, timeout: float = 120) -> dict:
    """The first record in ``out`` of a run under way (it has finished an epoch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [r for r in records(out) if r.get("status") == "running"
                   and len(r.get("per_epoch") or []) >= 2]
        if running:
            return running[0]
        time.sleep(0.3)
    raise AssertionError(f"no running record within {timeout:.0f} s")


def test_a_cancelled_array_task_is_closed_and_a_resubmitted_sweep_reruns_only_it(slurm,
                                                                                 tmp_path):
    """scancel of a running array task: Slurm SIGTERMs its processes (and SIGKILLs them
    KillWait later); its record ends interrupted with the reason, no rank of it is left, and
    the same sweep submitted again runs that combination alone."""
    hold = tmp_path / "hold"
    hold.touch()  # the runs are held in their epochs until the task is cancelled
    env = held_env(slurm[0], hold)
    out = tmp_path / "results"
    sweep = [sys.executable, "-m", "bench", "sweep", "--slurm", "--strategies", "ddp",
             "--gpus", "1", "--repeats", "2", *HELD, "--max-parallel", "1",
             "--output", str(out), "--submit"]
    proc = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job,) = _submitted(proc.stdout)
    cancelled = _first_running(out)
    subprocess.run(["scancel", f"{job}_0"], env=env, check=True)
    hold.unlink()
    _wait_for(job, env)
    by_id = {r["run_id"]: r for r in records(out)}
    closed = by_id[cancelled["run_id"]]
    assert closed["status"] == "interrupted" and "SIGTERM" in (closed["error"] or ""), closed
    assert sorted(r["status"] for r in by_id.values()) == ["interrupted", "ok"]
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit()
            and cancelled["run_id"].encode() in _cmdline(p)]
    assert not left, left
    again = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    for job in _submitted(again.stdout):
        _wait_for(job, env)
    found = records(out)
    assert sorted(r["status"] for r in found) == ["ok", "ok"], found
    assert cancelled["run_id"] not in {r["run_id"] for r in found}  # moved to superseded/
    assert (out / "runs" / "superseded" / f"{cancelled['run_id']}.json").exists()


def test_an_array_task_killed_with_sigkill_is_closed_and_rerun_alone(slurm, tmp_path):
    """`scancel --signal=KILL --full` of a running array task. Seen here (Slurm 22.05,
    proctrack/linuxproc): the KILL reaches the batch step's shell, and Slurm's clean-up of
    the ended job SIGTERMs what is left, so the sweep and its run close the record as
    interrupted (SIGTERM) and give the claim back; no process of the run is left, and the
    sweep submitted again moves that record to superseded/ and reruns it alone."""
    hold = tmp_path / "hold"
    hold.touch()
    env = held_env(slurm[0], hold)
    out = tmp_path / "results"
    sweep = [sys.executable, "-m", "bench", "sweep", "--slurm", "--strategies", "ddp",
             "--gpus", "1", "--repeats", "1", *HELD, "--output", str(out), "--submit"]
    proc = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job,) = _submitted(proc.stdout)
    killed = _first_running(out)
    claims = list((out / "runs" / ".claims").glob("*"))
    assert claims, "the running combination holds no claim"
    subprocess.run(["scancel", "--signal=KILL", "--full", f"{job}_0"], env=env, check=True)
    hold.unlink()
    _wait_for(job, env)
    (closed,) = records(out)
    assert (closed["status"], closed["error"]) == ("interrupted", "SIGTERM"), closed
    # the claim given back: by the sweep, after its run closed the record, and Slurm may say
    # the job ended before the sweep has (seen: the claim went 0.2 s after the record closed)
    gone = time.monotonic() + 10
    while time.monotonic() < gone and any(p.exists() for p in claims):
        time.sleep(0.2)
    assert not any(p.exists() for p in claims), claims
    while time.monotonic() < gone and any(
            killed["run_id"].encode() in _cmdline(p) for p in Path("/proc").iterdir()
            if p.name.isdigit()):
        time.sleep(0.2)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit()
            and killed["run_id"].encode() in _cmdline(p)]
    assert not left, left
    again = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    for job in _submitted(again.stdout):
        _wait_for(job, env)
    found = records(out)
    assert [r["status"] for r in found] == ["ok"], found
    assert (out / "runs" / "superseded" / f"{killed['run_id']}.json").exists()


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.skipif(TESTBED_MISSING is not None, reason=f"no namespaces: {TESTBED_MISSING}")
def test_a_sweep_over_two_nodes_runs_each_combination_as_one_srun_step_across_them(tmp_path):
    """A real two-node Slurm (scripts/slurm_local.py's NamespaceCluster: a slurmd in each of
    two network namespaces, each node its own address): `bench sweep --slurm --nodes 2
    --submit` writes one array; its task runs the sweep's path on the first node, whose run
    is one srun step of a task a rank on each node. Each combination leaves one ok record of
    2 ranks on 2 nodes that names the step's nodes, and the second node's slurmd launched a
    task of each job."""
    with slurm_local.NamespaceCluster(tmp_path / "cluster", nodes=2) as cluster:
        sweep = [sys.executable, "-m", "bench", "sweep", "--slurm", "--strategies", "ddp,fsdp",
                 "--gpus", "1", "--nodes", "2", *TINY, "--output", str(tmp_path / "results"),
                 "--submit", "--time", "00:05:00"]
        proc = subprocess.run(cluster.command(0, sweep), env=cluster.env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert len(_submitted(proc.stdout)) == 1  # one shape: 1 rank a node, 2 nodes
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            queue = subprocess.run(cluster.command(0, ["squeue", "-h"]), env=cluster.env(),
                                   capture_output=True, text=True)
            if queue.returncode == 0 and not queue.stdout.strip():
                break
            time.sleep(0.5)
        second_node = (tmp_path / "cluster" / "slurmd-n1.log").read_text()
    found = records(tmp_path / "results")
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "slurm").glob("*.out"))
    assert sorted(r["strategy"] for r in found) == ["ddp", "fsdp"], logs
    for rec in found:
        assert rec["status"] == "ok" and rec["launcher"] == "slurm", (rec.get("error"), logs)
        assert rec["world_size"] == 2 and rec["nodes"] == 2, rec
        assert rec["rendezvous"]["step_nodes"] == "n[0-1]", rec["rendezvous"]
    array_jobs = {r["rendezvous"]["slurm_job"] for r in found}
    launched = set(re.findall(r"launch task StepId=(\d+)\.0 ", second_node))
    assert len(array_jobs) == 2 and array_jobs <= launched, (array_jobs, second_node)
