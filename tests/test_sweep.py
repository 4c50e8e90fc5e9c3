"""bench sweep: all combinations, resumable after SIGTERM, per-run timeout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HELD_MODEL, ROOT, held_env, records, run_bench

SWEEP = ["sweep", "--strategies", "dp,ddp", "--gpus", "1,2", "--cpu", "--epochs", "1",
         "--width", "0.125", "--batch-size", "32", "--no-progress", "--comm-probe-steps", "0"]


def _ok_records(out):
    recs = []
    for path in sorted((out / "runs").glob("*.json")):
        rec = json.loads(path.read_text())  # every file is complete JSON
        recs.append(rec)
    return recs


@pytest.mark.serial  # counts the runs finished before the signal: no neighbour's load
def test_sweep_resumes_after_sigterm_without_duplicates(cifar_dir, tmp_path):
    args = [*SWEEP, "--data", "cifar100", "--data-dir", str(cifar_dir), "--no-download",
            "--output", str(tmp_path)]
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        done = [r for r in _ok_records(tmp_path) if r["status"] == "ok"]
        if len(done) >= 2:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError("sweep made no progress")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    first = _ok_records(tmp_path)
    ok_before = {r["run_id"] for r in first if r["status"] == "ok"}
    assert len(ok_before) == 2  # of 3: dp N=2 on CPU is dp N=1's run, left out
    assert not list((tmp_path / "runs").glob("*.tmp"))

    again = run_bench(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("ok record exists, skipped") == len(ok_before)
    final = _ok_records(tmp_path)
    assert all(r["status"] == "ok" for r in final)
    # Exactly one ok record per combination, the earlier ones untouched.
    combos = [(r["strategy"], r["gpus_requested"]) for r in final]
    assert sorted(combos) == [("ddp", 1), ("ddp", 2), ("dp", 1)]
    assert ok_before <= {r["run_id"] for r in final}
    assert len({r["tag"] for r in final}) == 3


@pytest.mark.serial  # how far a run gets in 5 s: no neighbour's load
def test_sweep_run_timeout_records_failure_and_goes_on(tmp_path):
    args = ["sweep", "--strategies", "ddp,dp", "--gpus", "2", "--cpu", "--data", "synthetic",
            "--train-limit", "4096", "--epochs", "50", "--width", "0.5", "--no-progress",
            "--run-timeout", "5", "--output", str(tmp_path)]
    proc = run_bench(*args, timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"\[sweep 2/2, about \d+ s left\] dp N=2", proc.stdout), proc.stdout
    recs = _ok_records(tmp_path)
    assert len(recs) == 2
    for rec in recs:
        assert rec["status"] == "failed" and rec["error"].startswith("timeout"), rec["error"]
    # No rank of a stopped run is left behind.
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", leftover.stdout


def test_a_sweep_says_why_each_combination_failed(tmp_path):
    """The closing list gives each failed combination's reason from its record (it said only
    `failed`, and the reason had scrolled past with that run's output)."""
    proc = run_bench("sweep", "--strategies", "ddp", "--gpus", "1", "--cpu", "--epochs", "1",
                     "--data", "synthetic", "--train-limit", "64", "--test-limit", "8",
                     "--width", "0.125", "--batch-size", "32", "--no-progress",
                     "--comm-probe-steps", "0", "--output", str(tmp_path),
                     env={"BENCH_FAULT": "raise:0:1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = proc.stdout[proc.stdout.index("bench sweep: 0/1 ok"):]
    assert " ".join(summary.split()[4:]).startswith(
        "ddp N=1 repeat 1: failed: rank 0: RuntimeError: injected fault (BENCH_FAULT) at step "
        "1 [in train epoch 1 step 1]"), summary
    # and what to type next, the folder quoted as the shell needs it
    assert summary.rstrip().endswith(
        f"bench sweep: the table and its verdict: `bench report {tmp_path}`"), summary


def test_the_time_a_sweep_has_left_is_said_in_hours_past_one():
    """The sweep's '[sweep 3/36, about … left]' and a run's line share one wording; the
    sweep's own said '125 min 12 s'."""
    from bench.tools.terminal import duration

    assert [duration(s) for s in (0, 0.4, 45, 190, 7512)] == ["0 s", "1 s", "45 s",
                                                              "3 min 10 s", "2 h 05 min"]


def test_a_combination_named_twice_runs_once(tmp_path):
    """`--strategies ddp,ddp --gpus 1,1` planned 4 combinations: 1 run, then 3 'ok record
    exists, skipped'."""
    proc = run_bench("sweep", "--strategies", "ddp,ddp", "--gpus", "1,1", "--cpu",
                     "--epochs", "1", "--data", "synthetic", "--train-limit", "64",
                     "--test-limit", "8", "--width", "0.125", "--batch-size", "32",
                     "--no-progress", "--comm-probe-steps", "0", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[sweep 1/1] ddp N=1 repeat 1" in proc.stdout and "skipped" not in proc.stdout
    assert proc.stdout.strip().endswith(
        f"bench sweep: 1/1 ok\nbench sweep: the table and its verdict: `bench report {tmp_path}`")
    assert len(records(tmp_path)) == 1


def test_dp_beyond_one_cpu_replica_is_left_out_not_run_as_a_second_row(tmp_path):
    """nn.DataParallel without CUDA is one replica in one process: `--strategies dp --gpus
    1,2 --cpu` ran dp twice, and the second, labelled N=2, was a repeat of N=1's row. It is
    left out, with a line saying why; on GPUs dp N=2 is two replicas and stays."""
    cpu = run_bench("sweep", "--strategies", "dp,ddp", "--gpus", "1,2", "--cpu", "--slurm",
                    "--dry-run", "--output", str(tmp_path))
    assert cpu.returncode == 0, cpu.stderr
    said = " ".join(cpu.stderr.split())
    assert ("dp N=2 left out: on cpu it is 1 replica in 1 process, the same run as dp N=1"
            in said), said
    arrays = re.findall(r"#SBATCH --array=(\S+)", cpu.stdout)
    assert arrays == ["0,1%4", "2%4"], arrays  # dp 1, ddp 1 | ddp 2
    gpu = run_bench("sweep", "--strategies", "dp", "--gpus", "1,2", "--slurm", "--dry-run",
                    "--output", str(tmp_path))
    assert gpu.returncode == 0 and "left out" not in gpu.stderr, gpu.stderr
    assert re.findall(r"#SBATCH --array=(\S+)", gpu.stdout) == ["0%4", "1%4"], gpu.stdout


def test_a_sweep_run_again_under_another_torch_says_what_it_skipped(tmp_path):
    """The sweep's key is the recipe: run again after a torch upgrade, it skipped every
    combination as done, and said 'ok record exists' as if today's torch had run it. It
    names the torch the record ran under, and how to run it again."""
    import torch

    sweep = ["sweep", "--strategies", "ddp", "--gpus", "1", "--cpu", "--epochs", "1", "--data",
             "synthetic", "--train-limit", "64", "--test-limit", "8", "--width", "0.125",
             "--batch-size", "32", "--no-progress", "--comm-probe-steps", "0",
             "--output", str(tmp_path)]
    assert run_bench(*sweep).returncode == 0
    again = run_bench(*sweep)
    assert "ok record exists, skipped\n" in again.stdout, again.stdout  # same torch: no more
    (path,) = (tmp_path / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "env": {**rec["env"], "torch": "2.0.0+cu118"}}))
    again = run_bench(*sweep)
    assert again.returncode == 0, again.stdout + again.stderr
    said = " ".join(again.stdout.split())
    assert (f"ok record exists, skipped (it ran under torch 2.0.0+cu118, this is "
            f"{torch.__version__}: --force runs it again") in said, said
    assert len(records(tmp_path)) == 1


@pytest.mark.parametrize("args, says", [
    (["--strategies", "ddp,nope"], "choose one of"),
    # the data, read once before any run (each run failed in turn on it, exit 1, after the
    # sweep had made its folders)
    (["--strategies", "ddp,ddp-amp", "--data", "cifar100", "--data-dir", "{tmp}/none",
      "--no-download"], "CIFAR-100 is not in"),
    (["--strategies", "ddp", "--data", "synthetic", "--train-limit", "3"],
     "3 training images are fewer than one global batch"),
])
def test_sweep_bad_input_writes_nothing(args, says, tmp_path):
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    proc = run_bench("sweep", *args, "--gpus", "1", "--cpu", "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr and "[sweep" not in proc.stdout, proc.stdout + proc.stderr
    assert os.listdir(tmp_path) == []


def test_two_sweeps_at_once_share_the_work(tmp_path):
    args = [sys.executable, "-m", "bench", "sweep", "--strategies", "dp", "--gpus", "1",
            "--repeats", "3", "--cpu", "--epochs", "1", "--data", "synthetic",
            "--train-limit", "64", "--test-limit", "8", "--width", "0.125", "--batch-size",
            "32", "--no-progress", "--output", str(tmp_path)]
    sweeps = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in sweeps]
    assert [p.returncode for p in sweeps] == [0, 0], outs
    found = records(tmp_path)
    assert len(found) == 3 and {r["status"] for r in found} == {"ok"}, outs
    assert len({r["tag"] for r in found}) == 3  # one per combination, none twice
    assert sorted(r["seed"] for r in found) == [0, 1, 2]  # repeat r: seed + r
    assert not list((tmp_path / "runs" / ".claims").iterdir())  # claims released


def test_a_timeout_before_the_run_wrote_its_record_still_leaves_a_failed_one(tmp_path):
    """--run-timeout 0.5 stops `bench run` while it imports torch: the sweep writes the failed
    record itself, and its output says timeout."""
    proc = run_bench("sweep", "--strategies", "ddp", "--gpus", "1", "--cpu", "--data",
                     "synthetic", "--train-limit", "128", "--test-limit", "16", "--epochs",
                     "1", "--no-progress", "--run-timeout", "0.5", "--output", str(tmp_path),
                     timeout=120)
    assert proc.returncode == 1 and "failed: timeout after" in proc.stdout, proc.stdout
    (rec,) = _ok_records(tmp_path)
    assert rec["status"] == "failed" and rec["error"].startswith("timeout after")
    assert rec["tag"].startswith("sweep:") and rec["strategy"] == "ddp"


def test_an_empty_claim_left_by_a_crash_does_not_skip_the_combination(tmp_path):
    """A claim file with no owner in it (a crash between create and write, in older
    versions) is debris: the next sweep clears it and runs the combination."""
    from bench.commands.sweep import plan_combos
    from bench.config.run_config import RunConfig

    args = ["--cpu", "--data", "synthetic", "--train-limit", "64", "--test-limit", "8",
            "--epochs", "1", "--width", "0.125", "--batch-size", "32", "--no-progress",
            "--comm-probe-steps", "0", "--output", str(tmp_path)]
    base = RunConfig("ddp", cpu=True, data="synthetic", train_limit=64, test_limit=8,
                     epochs=1, width=0.125, batch_size=32, progress=False, comm_probe_steps=0,
                     output=str(tmp_path))
    (combo,) = plan_combos(base, ["ddp"], [1], 1)
    claims = tmp_path / "runs" / ".claims"
    claims.mkdir(parents=True)
    (claims / f"{combo.tag.replace('/', '_')}.claim").write_text("")
    proc = run_bench("sweep", "--strategies", "ddp", "--gpus", "1", *args, timeout=240)
    assert proc.returncode == 0 and "being run by another sweep" not in proc.stdout, (
        proc.stdout + proc.stderr)
    assert [r["status"] for r in _ok_records(tmp_path)] == ["ok"]
    assert not list(claims.iterdir())


def test_a_claim_from_another_host_is_taken_only_once_its_heartbeat_is_stale(tmp_path, capsys):
    """Sweeps on two hosts share a results folder. A claim whose owner is on another host
    cannot be checked by its pid; it was never cleared, so a crashed host's combination was
    skipped for ever. Now its holder refreshes the file's time while its run lives, and a
    claim silent for longer than the limit is taken, saying so; a fresh one is respected."""
    from bench.records.claims import CLAIM_STALE_S, Claim

    folder = tmp_path / ".claims"
    folder.mkdir()
    claim = folder / "sweep_abc_r0.claim"
    elsewhere = {"host": "node-that-crashed", "pid": 4242, "started": 123.0}
    claim.write_text(json.dumps(elsewhere))
    taken, holder = Claim.take(folder, "sweep/abc/r0")
    assert taken is None and holder == elsewhere  # a fresh heartbeat: respected
    old = time.time() - CLAIM_STALE_S - 5
    os.utime(claim, (old, old))
    taken, holder = Claim.take(folder, "sweep/abc/r0")
    assert taken is not None and holder is None
    said = capsys.readouterr().err
    assert "taking the claim on sweep/abc/r0 from node-that-crashed (pid 4242): no heartbeat" \
        in said and f"past the {CLAIM_STALE_S:.0f} s limit" in said
    assert json.loads(claim.read_text())["pid"] == os.getpid()
    # its own heartbeat: the file's time moves while the holder's block runs
    os.utime(claim, (old, old))
    with taken.beating(every=0.05):
        time.sleep(0.3)
    assert time.time() - claim.stat().st_mtime < 1.0
    taken.release()
    assert not list(folder.iterdir())  # the staged file (host and pid in its name) is gone


def _uts_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a second host name needs root's `unshare --uts`")
def test_a_lost_hosts_claim_is_respected_while_it_beats_and_taken_once_it_stops(tmp_path):
    """Two hosts share a results folder: host B (a UTS namespace with a host name of its own,
    the same filesystem) runs a sweep; every process of B is killed at once, as a machine
    that loses power (nothing closes its record or claim). A sweep here skips the
    combination while B's claim still beats, and once it has been silent past the limit
    (BENCH_CLAIM_STALE_S, 10 s here) takes it, saying so, moves B's `running` record aside
    and leaves one ok record."""
    out = tmp_path / "results"
    hold = tmp_path / "hold"
    hold.touch()  # B's run is held in its epochs (at least 0.8 s each) until B is lost
    env = held_env({**os.environ, "BENCH_CLAIM_STALE_S": "10"}, hold)
    # one combination for both hosts (the same options)
    args = ["sweep", "--strategies", "ddp", "--gpus", "1", "--cpu", "--data", "synthetic",
            "--train-limit", "256", "--test-limit", "8", "--batch-size", "32", "--epochs",
            "40", *HELD_MODEL, "--no-progress", "--comm-probe-steps", "0",
            "--loader-probe-steps", "0", "--output", str(out)]
    # B's temporary folder is its own, as another machine's /tmp is: the scratch folder its
    # killed launcher leaves (a host this one cannot clean after) goes with tmp_path
    b_tmp = tmp_path / "host-b-tmp"
    b_tmp.mkdir()
    host_b = subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", 'hostname host-b && exec "$@"', "sh",
         sys.executable, "-m", "bench", *args],
        cwd=ROOT, env={**env, "TMPDIR": str(b_tmp)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    claims = out / "runs" / ".claims"
    deadline = time.monotonic() + 120
    while not any(r.get("status") == "running" and r.get("per_epoch")
                  for r in records(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    (claim,) = claims.glob("*.claim")
    assert json.loads(claim.read_text())["host"] == "host-b"
    while_it_beats = run_bench(*args, env=env, timeout=120)
    assert while_it_beats.returncode == 0, while_it_beats.stdout + while_it_beats.stderr
    assert "being run by another sweep" in while_it_beats.stdout, while_it_beats.stdout
    # host B is lost: every process in its namespace killed at once
    namespace = _uts_namespace(host_b.pid)
    for _ in range(3):
        for pid in [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]:
            if pid != os.getpid() and _uts_namespace(pid) == namespace:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    host_b.wait(timeout=10)
    hold.unlink()
    assert list(b_tmp.glob("bench-*")), "host B's run kept its scratch folder elsewhere"
    (lost,) = records(out)
    assert lost["status"] == "running" and lost["owner"]["host"] == "host-b", lost
    silent = time.time() - claim.stat().st_mtime
    time.sleep(max(0.0, 11 - silent))
    after = run_bench(*args, env=env, timeout=300)
    assert after.returncode == 0, after.stdout + after.stderr
    assert re.search(r"taking the claim on \S+ from host-b \(pid \d+\): no heartbeat for "
                     r"1\d s, past the 10 s limit", after.stderr), after.stderr
    (done,) = records(out)
    assert done["status"] == "ok" and done["owner"]["host"] != "host-b", done
    assert (out / "runs" / "superseded" / f"{lost['run_id']}.json").exists()
    assert not list(claims.iterdir())


def test_a_gpu_sweep_for_slurm_is_written_on_a_login_node_without_a_gpu(tmp_path):
    """A Slurm cluster's login node has no GPU: `bench sweep --slurm` refused a GPU sweep
    there ('no CUDA GPU is visible here; add --cpu'), as if it ran here, and gave each GPU
    rank one core (bench slurm gives 8). Its scripts are checked as they will run, on the
    job's nodes. (This machine, and CI's, has no GPU.)"""
    proc = run_bench("sweep", "--strategies", "ddp,fsdp", "--gpus", "1,4", "--slurm",
                     "--dry-run", "--epochs", "3", "--data", "synthetic", "--output",
                     str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    four = proc.stdout[proc.stdout.index("# --- world size 4 ---"):]
    assert "#SBATCH --gpus-per-node=4" in four and "#SBATCH --cpus-per-task=32" in four, four
    assert "#SBATCH --cpus-per-task=8" in proc.stdout.split("# --- world size 4 ---")[0]
    # what a GPU run refuses anywhere is still refused before any script is written
    bad = run_bench("sweep", "--strategies", "ddp", "--gpus", "2", "--slurm", "--dry-run",
                    "--precision", "fp16", "--batch-size", "3", "--output", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    # over several nodes each run is an srun step whose tasks are its ranks: torchrun's
    # restarts would be refused by each, once the job had queued
    bad = run_bench("sweep", "--strategies", "ddp", "--gpus", "2", "--nodes", "2", "--slurm",
                    "--dry-run", "--max-restarts", "1", "--output", str(tmp_path))
    assert bad.returncode == 2 and "--max-restarts is a torchrun option" in bad.stderr, (
        bad.stderr)
    # --cpu: a core a process, as before
    cpu = run_bench("sweep", "--strategies", "ddp", "--gpus", "2", "--cpu", "--slurm",
                    "--dry-run", "--output", str(tmp_path))
    assert cpu.returncode == 0 and "#SBATCH --cpus-per-task=2" in cpu.stdout, cpu.stderr
    assert "#SBATCH --exclusive" not in cpu.stdout
    # --exclusive: every array's tasks take their node whole; without --slurm, refused
    whole = run_bench("sweep", "--strategies", "ddp", "--gpus", "1,2", "--cpu", "--slurm",
                      "--dry-run", "--exclusive", "--output", str(tmp_path))
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.count("\n#SBATCH --exclusive\n") == 2, whole.stdout
    here = run_bench("sweep", "--strategies", "ddp", "--gpus", "1", "--cpu", "--exclusive",
                     "--output", str(tmp_path / "here"))
    assert here.returncode == 2 and "--exclusive go with --slurm" in here.stderr, here.stderr
    assert not (tmp_path / "here").exists()
