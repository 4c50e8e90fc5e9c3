"""More than one machine, simulated on loopback: torchrun c10d rendezvous, Slurm tasks,
sbatch scripts, horovodrun --hosts."""

from __future__ import annotations

import os
import random
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, assert_ok, only_record, records, run_bench

from bench.launch.slurm import first_host, slurm_task
from bench.tools.ports import ephemeral_ports, free_port, port_in_use
from strategies.horovod import HorovodStrategy

SMALL = ["--cpu", "--epochs", "2", "--data", "synthetic", "--train-limit", "256",
         "--test-limit", "10", "--width", "0.125", "--batch-size", "32", "--no-progress",
         "--comm-probe-steps", "0", "--timeout", "90"]


def _start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    """Wait for every process (what each printed); on failure (or a hang) show it all."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=150)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(killed by the test after 150 s)")
    shown = "\n".join(f"--- process {i}:\n{out}" for i, out in enumerate(outs))
    assert all(p.returncode == 0 for p in procs), shown
    return outs


def test_two_nodes_on_loopback_write_one_record(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [
        _start(["run", "--strategy", "ddp", "--nodes", "2", "--gpus", "1", "--node-rank",
                str(rank), "--rdzv-endpoint", endpoint, "--rdzv-id", "looptest", *SMALL,
                "--workers", "1", "--output", str(tmp_path)])
        for rank in (0, 1)
    ]
    outs = _finish(procs)
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["nodes"] == 2
    # which node writes the record is the rendezvous's choice, not --node-rank's: a node
    # said 'bench: record PATH' and then 'the record was written on the node that hosted
    # global rank 0'
    for out in outs:
        assert ("bench: record (if this node hosts global rank 0: the rendezvous decides) "
                f"{tmp_path}/runs/20") in out, out
    assert rec["processes"] == 2  # all ranks, over both nodes
    assert rec["rendezvous"] == {"endpoint": endpoint, "id": "looptest"}
    assert len(rec["per_epoch"]) == 2 and rec["replicas_identical"] is True
    assert rec["per_epoch"][-1]["test_images"] == 10
    # one loader worker per replica, as asked: each node's rank has one (it had one per node)
    assert (rec["workers_per_replica"], rec["workers_per_process"]) == (1, 1)
    # the same command again the same day has the same run id: refused, the record kept
    again = run_bench("run", "--strategy", "ddp", "--nodes", "2", "--gpus", "1", "--node-rank",
                      "0", "--rdzv-endpoint", endpoint, "--rdzv-id", "looptest", *SMALL,
                      "--workers", "1", "--output", str(tmp_path))
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "already ended today (ok" in again.stderr and "--rdzv-id" in again.stderr
    assert only_record(tmp_path) == rec


def test_a_rank_stopped_on_one_node_is_ended_there_and_both_nodes_train_again(tmp_path):
    """--max-restarts over two nodes, rank 1 (node 1) stopped (SIGSTOP) at step 3: rank 0's
    collective times out on node 0, whose torchrun starts the ranks again, but node 1's
    launcher cannot see node 0's failure. Its watchdog ended node 1's whole run after 10 s
    ('rank 1 made no progress'), and node 0 then waited in the rendezvous for a node that
    had gone (past 200 s, until torchrun's join timeout). It ends the stuck rank instead,
    for its torchrun to restart: both nodes train the next attempt."""
    endpoint = f"127.0.0.1:{free_port()}"
    fast = [a if a != "90" else "5" for a in SMALL]  # --timeout 5
    procs = [
        _start(["run", "--strategy", "ddp", "--nodes", "2", "--gpus", "1", "--node-rank",
                str(rank), "--rdzv-endpoint", endpoint, "--rdzv-id", "stoptest", *fast,
                "--max-restarts", "1", "--workers", "1", "--output", str(tmp_path)],
               env={"BENCH_FAULT": "stop:1:3"})
        for rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], outs
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["restarts"] == 1, rec
    # (the node that hosts global rank 1 is the one whose agent joined second, either)
    [stuck] = [out for out in outs if "timeout: rank 1: made no progress for " in out]
    assert "bench ended it for torchrun to start the ranks again" in stuck, stuck
    assert "[in train epoch 1 step 3]" in stuck, stuck  # where it stopped (not its last beat's)


def test_nodes_that_differ_only_in_what_each_machine_sets_meet_without_an_id(tmp_path):
    """Two nodes of one command but their --output and --workers, no --rdzv-id: each
    derives the same id (a node's own folder and cores are its own) and they train as one
    run, whose one record is on the node that hosted global rank 0. With those options in the id,
    each waited 10 minutes under its own and failed with torchrun's traceback."""
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [
        _start(["run", "--strategy", "ddp", "--nodes", "2", "--gpus", "1", "--node-rank",
                str(rank), "--rdzv-endpoint", endpoint, *SMALL, "--workers", str(rank),
                "--output", str(tmp_path / f"node{rank}")])
        for rank in (0, 1)
    ]
    _finish(procs)
    # torchrun gives global rank 0 to either node (the rendezvous's order of arrival)
    (rec,) = records(tmp_path / "node0") + records(tmp_path / "node1")
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["nodes"] == 2
    assert rec["rendezvous"]["id"].startswith("rdzv"), rec["rendezvous"]


# What torchrun's agent printed when no rank started (torch 2.14, two nodes on loopback):
# the host's wait for a node that joined another id, the other node's loss of that host,
# and a node whose endpoint nobody served. Excerpts of the real output.
_HOST_WAITED = """  File "torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 1194, \
in next_rendezvous
    raise RendezvousTimeoutError
torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError
"""
_HOST_WENT = """torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was \
likely closed. Did the remote server shutdown or crash?
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d \
store has failed. See inner exception for details.
"""
_NOBODY = """[E1130 02:01:45.471549650 socket.cpp:1028] [c10d] The client socket has timed out \
after 60000ms while trying to connect to (127.0.0.1, 29613).
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d \
store has failed. See inner exception for details.
"""


@pytest.mark.parametrize("output, node_rank, said", [
    (_HOST_WAITED, 0, "the other nodes did not join rendezvous rdzvabc at 127.0.0.1:29613"),
    (_HOST_WENT, 1, "the rendezvous host 127.0.0.1:29613 (node rank 0) went before"),
    (_NOBODY, 1, "nothing answered at the rendezvous endpoint 127.0.0.1:29613"),
    (_HOST_WENT, 0, None),  # the host itself: its own cause is elsewhere
])
def test_a_rendezvous_that_never_gathered_the_nodes_is_named(tmp_path, output, node_rank, said):
    from bench.launch.job import Launch, find_root_cause
    from bench.train.scratch import Scratch

    scratch = Scratch(tmp_path)
    launch = Launch(tmp_path / "spec.json", 1, 29500, 1, scratch, 60.0, nnodes=2,
                    node_rank=node_rank, rdzv_endpoint="127.0.0.1:29613", rdzv_id="rdzvabc")
    find_root_cause(output, scratch, None, launch)
    if said is None:
        assert not scratch.root_cause.exists()
    else:
        cause = scratch.root_cause.read_text()
        assert cause.startswith(said) and cause.count("\n") == 1, cause
        assert "--rdzv-id" in cause or "port is open" in cause, cause


def test_slurm_tasks_train_together(tmp_path):
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
               "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "4242",
               "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NNODES": "1",
               "SLURM_NTASKS_PER_NODE": "2"}
        procs.append(_start(["run", "--strategy", "ddp", "--gpus", "2", *SMALL,
                             "--workers", "1", "--master-port", port, "--output",
                             str(tmp_path)], env))
    _finish(procs)
    rec = only_record(tmp_path)
    assert rec["launcher"] == "slurm" and rec["status"] == "ok"
    assert rec["world_size"] == 2 and rec["processes"] == 2
    assert rec["rendezvous"]["slurm_job"] == "4242"
    assert rec["replicas_identical"] is True
    # one loader worker per replica, as asked (each task had one per task of the job)
    assert (rec["workers_per_replica"], rec["workers_per_process"]) == (1, 1)


def test_rendezvous_ports_are_below_the_ephemeral_range():
    """A port of the kernel's ephemeral range (32768-60999) may be given to a client that
    connects before its store listens as its own source port: it connects to itself. Ports
    bench chooses stay below that range, the Slurm default too, and two runs seeded alike
    do not try the same ports."""
    low = ephemeral_ports()[0]
    picked = []
    for _ in range(2):
        random.seed(0)
        picked.append([free_port() for _ in range(10)])
    assert all(10000 <= port < low and not port_in_use(port) for port in [*picked[0], *picked[1]])
    assert picked[0] != picked[1]
    for job in ("1", "4242", "12767", "20999", "987654321", "x"):
        task = slurm_task({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                           "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "n1",
                           "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"})
        assert 20000 <= task.default_port() < 32768, job


_PICK = ("import sys; from bench.tools.ports import free_port; "
         "print(*[free_port() for _ in range(int(sys.argv[1]))], flush=True); sys.stdin.read()")


def test_two_runs_choosing_ports_at_once_never_choose_the_same():
    """A run's port is bound seconds after it is chosen (mp.spawn's ranks import torch
    first): another run must not choose it meanwhile. Two processes choose 400 ports each
    and hold them, binding none: drawn freely from the 22,768 below the ephemeral range, two
    of the 800 would coincide but for one chance in a million (10 did, before). A holder
    that is killed leaves its ports free to choose again."""
    from bench.tools.ports import promise_port, release_port

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holders = [subprocess.Popen([sys.executable, "-c", _PICK, "400"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        chosen = [[int(p) for p in h.stdout.readline().split()] for h in holders]
        assert [len(c) for c in chosen] == [400, 400]
        assert len(set(chosen[0]) | set(chosen[1])) == 800
        assert not promise_port(chosen[0][0])  # held by another process here
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(timeout=30)
    assert promise_port(chosen[0][0]) and promise_port(chosen[1][-1])
    release_port(chosen[0][0]), release_port(chosen[1][-1])


def test_slurm_variables_are_read():
    task = slurm_task({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                       "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_TASKS": "8",
                       "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2",
                       "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "99"})
    assert (task.rank, task.world_size, task.local_rank) == (5, 8, 1)
    assert task.local_world_size == 4 and task.nodes == 2 and task.master_addr == "gpu07"
    assert slurm_task({"SLURM_PROCID": "0"}) is None


@pytest.mark.parametrize("nodelist, host", [
    ("node01", "node01"), ("gpu[03-05,07],cpu1", "gpu03"), ("a[1,2]", "a1"),
    ("x-y[010-012]", "x-y010"),
])
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


def test_an_sbatch_script_holds_paths_with_spaces_as_the_shell_and_sbatch_read_them():
    """An interpreter, a working folder or an output under a folder with a space in its
    name: the srun line split the interpreter's path in two, and sbatch refused the
    #SBATCH line ('Invalid directive'; a real Slurm takes the quoted one, test_slurm.py)."""
    from bench.commands.sweep import Combo, array_scripts
    from bench.launch.slurm import sbatch_script

    text = sbatch_script(strategy="ddp", nodes=1, gpus=2, time="00:10:00", job_name="j",
                         run_args=["--output", "/data/my runs"], python="/opt/my env/bin/python",
                         workdir="/home/me/my jobs", cpu=True)
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[1] == "/opt/my env/bin/python", srun
    assert shlex.split(srun)[-1] == "/data/my runs", srun
    assert '#SBATCH --chdir="/home/me/my jobs"' in text.splitlines(), text
    arrays = array_scripts([Combo("ddp", 1, 0, "k")], ["--strategies", "ddp"], job_name="s",
                           time="00:10:00", partition=None, max_parallel=1, cpus_per_rank=1,
                           cpu=True, workdir="/home/me/my jobs", output="/data/my runs")
    lines = arrays[1].splitlines()
    assert '#SBATCH --output="/data/my runs/slurm/%x-%A_%a.out"' in lines, lines
    assert shlex.split(lines[-1])[0] == sys.executable, lines[-1]
    # a double quote cannot be written in an #SBATCH line: refused, naming the folder
    from bench.tools.errors import ConfigError

    with pytest.raises(ConfigError, match="use a folder without one"):
        sbatch_script(strategy="ddp", nodes=1, gpus=2, time="00:10:00", job_name="j",
                      run_args=[], workdir='/home/me/"quoted"', cpu=True)


def test_sbatch_script(tmp_path):
    out = tmp_path / "job.sbatch"
    proc = run_bench("slurm", "--nodes", "2", "--gpus", "4", "--strategy", "ddp", "--time",
                     "00:30:00", "--out", str(out), "--epochs", "90")
    assert_ok(proc)
    lines = out.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
                     "#SBATCH --gpus-per-node=4", "#SBATCH --time=00:30:00"):
        assert expected in lines
    srun = [x for x in lines if x.startswith("srun ")]
    # the interpreter that runs bench, not whatever `python` is on the compute nodes; the
    # records and the CIFAR cache at absolute paths every node shares (left out, each node
    # downloaded CIFAR into its own cache and records landed wherever the job started)
    from bench.config.run_config import default_data_dir

    assert srun == [f"srun {shlex.quote(sys.executable)} -m bench run --strategy ddp --gpus 4 "
                    f"--nodes 2 --epochs 90 --output {ROOT / 'results'} "
                    f"--data-dir {shlex.quote(str(default_data_dir().resolve()))}"]
    assert f"#SBATCH --chdir={ROOT}" in lines
    assert "#SBATCH --exclusive" not in lines  # the site's sharing, unless asked
    # --exclusive: the nodes whole
    proc = run_bench("slurm", "--nodes", "2", "--gpus", "4", "--strategy", "ddp", "--out",
                     str(tmp_path / "whole.sbatch"), "--exclusive")
    assert_ok(proc)
    assert "#SBATCH --exclusive" in (tmp_path / "whole.sbatch").read_text().splitlines()
    # given, they are kept as given (relative ones mean the submit folder: --chdir)
    proc = run_bench("slurm", "--nodes", "1", "--gpus", "1", "--strategy", "ddp", "--out",
                     str(out), "--output", "runs-here", "--data", "synthetic")
    assert_ok(proc)
    (srun,) = [x for x in out.read_text().splitlines() if x.startswith("srun ")]
    assert srun.endswith("--output runs-here --data synthetic"), srun


def test_sbatch_refuses_what_cannot_run_as_tasks(tmp_path):
    proc = run_bench("slurm", "--nodes", "2", "--gpus", "4", "--strategy", "ddp-spawn",
                     "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and not (tmp_path / "x").exists()
    # torchrun's restarts: each srun task would refuse them once the job had queued
    proc = run_bench("slurm", "--nodes", "2", "--gpus", "4", "--strategy", "ddp",
                     "--max-restarts", "1", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and not (tmp_path / "x").exists(), proc.stderr
    assert proc.stderr.strip() == ("bench: error: --max-restarts is a torchrun option; ddp "
                                   "runs as srun tasks here: drop it"), proc.stderr


@pytest.mark.parametrize("strategy", ["dp", "ddp-spawn", "ddp-launch"])
def test_single_machine_strategies_refuse_nodes(strategy, tmp_path):
    proc = run_bench("run", "--strategy", strategy, "--nodes", "2", "--rdzv-endpoint",
                     "127.0.0.1:1234", *SMALL, "--output", str(tmp_path))
    assert proc.returncode == 2 and "--strategy ddp" in proc.stderr, proc.stderr
    assert not records(tmp_path)


@pytest.mark.skipif(HorovodStrategy("horovod").requires("cpu") is not None,
                    reason=f"horovod unavailable: {HorovodStrategy('horovod').requires('cpu')}")
def test_horovod_hosts(tmp_path):
    assert_ok(run_bench("run", "--strategy", "horovod", "--hosts", "localhost:2", *SMALL,
                        "--output", str(tmp_path)))
    rec = only_record(tmp_path)
    assert rec["world_size"] == 2 and rec["config"]["hosts"] == "localhost:2"
    assert rec["replicas_identical"] is True
