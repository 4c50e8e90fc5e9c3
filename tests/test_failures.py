"""Failures lose nothing and leave nothing behind: a crashing rank, a hanging rank, a stuck
run, SIGTERM, and two runs at once."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, ROOT, alive, assert_ok, only_record, run_bench

from bench.tools.cores import usable_cores
from strategies.horovod import HorovodStrategy

# The tests look for their own run's processes (`alive(run_id)`) and bound how long a
# failure takes with margins that hold beside another test's ranks; the one that looks for
# processes machine-wide is marked serial (alone).

SMALL = ["--cpu", "--data", "synthetic", "--train-limit", "256", "--test-limit", "32",
         "--width", "0.125", "--batch-size", "32", "--no-progress", "--comm-probe-steps", "0"]
HOROVOD = HorovodStrategy("horovod").requires("cpu")  # why horovod cannot run here, if so


def _failing_run(tmp_path, strategy: str, gpus: int, fault: str, *extra: str):
    """Run with an injected fault; it must fail (exit 1). Returns (record, seconds)."""
    start = time.monotonic()
    proc = run_bench("run", "--strategy", strategy, "--gpus", str(gpus), "--epochs", "2",
                     *SMALL, *extra, "--output", str(tmp_path), env={"BENCH_FAULT": fault})
    assert proc.returncode == 1, proc.stderr
    return only_record(tmp_path), time.monotonic() - start


@pytest.mark.serial  # no spawned rank of anybody's run may be left: alone
@pytest.mark.parametrize("strategy", ["ddp", "ddp-spawn"])
def test_crashing_rank_ends_the_whole_run(strategy, tmp_path):
    rec, elapsed = _failing_run(tmp_path, strategy, 2, "raise:1:3")
    assert rec["status"] == "failed"
    assert rec["error"].startswith("rank 1: RuntimeError: injected fault"), rec["error"]
    assert "train epoch 1 step 3" in rec["error"]
    assert elapsed < 60
    assert not alive(rec["run_id"]), "a rank outlived its run"
    assert not alive("multiprocessing.spawn"), "a spawned rank outlived its run"


def test_a_rank_dying_after_the_record_is_finished_leaves_the_run_ok(tmp_path):
    """Rank 0 finishes the record after the last collective; a rank that dies in its
    teardown (gloo aborts now and then as its group goes) turned the finished run `failed`,
    and a sweep stopped right then lost an ok run it had counted (the sweep-SIGTERM flake).
    The run stays ok, and its record says what happened after."""
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "2", "--epochs", "1", *SMALL,
                     "--output", str(tmp_path), env={"BENCH_FAULT": "exit:1:0"})
    assert proc.returncode == 0, proc.stderr
    rec = only_record(tmp_path)
    assert rec["status"] == "ok"
    assert any(n.startswith("after the record was finished: ") for n in rec["notes"]), (
        rec["notes"])


def test_ranks_torchrun_restarts_train_again_and_the_record_says_so(tmp_path):
    """`--max-restarts 1` with a rank that fails once (the fault fires in the first attempt
    only): torchrun starts both ranks again. They met in torchrun's store, which keeps the
    failed attempt's keys, gloo's peer addresses among them: the restarted group connected
    to a dead rank ('Gloo connectFullMesh failed ... Connection refused', or a wait until
    --timeout) and the run failed. Where it did come through, the record held each
    attempt's notes and nothing said it had restarted. Now it trains again to the end, ok,
    and the record counts the restart and says once what failed and what its figures are;
    the terminal says the failure once (it showed both ranks' tracebacks and torchrun's
    lines), and the report flags the row. Three ranks: on 2 cores the launcher marks the
    record oversubscribed, which the restarted attempt's record kept not. Its --mllog
    keeps every attempt: the next attempt's rank 0 opened it afresh, and the log read as a
    clean run that took only the last attempt's time."""
    mllog = tmp_path / "run.log"
    with_mllog = importlib.util.find_spec("mlperf_logging") is not None  # (the mllog extra)
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "3", "--epochs", "2", *SMALL,
                     "--batch-size", "30", "--max-restarts", "1", "--timeout", "20",
                     "--output", str(tmp_path), *(["--mllog", str(mllog)] if with_mllog else []),
                     env={"BENCH_FAULT": "raise:1:3"}, timeout=240)
    assert_ok(proc)
    if with_mllog:
        _assert_the_log_holds_both_attempts(mllog)
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["restarts"] == 1, rec
    if usable_cores() < 3:  # what the launcher wrote before the ranks started stays (it went)
        assert rec["oversubscribed"] == {"processes": 3, "cores": usable_cores()}, rec
    assert [e["epoch"] for e in rec["per_epoch"]] == [1, 2]
    said = [n for n in rec["notes"] if n.startswith("torchrun restarted the ranks once")]
    assert len(said) == 1 and "the last attempt's" in said[0], rec["notes"]
    assert ("after rank 1: RuntimeError: injected fault (BENCH_FAULT) at step 3 [in train "
            "epoch 1 step 3]") in said[0], said
    assert len(set(rec["notes"])) == len(rec["notes"]), rec["notes"]
    assert rec["restart_lost_s"] > 0, rec
    assert rec["restart_cause"] == ("rank 1: RuntimeError: injected fault (BENCH_FAULT) at step "
                                    "3 [in train epoch 1 step 3]"), rec
    # the terminal: one account of the failure, not both ranks' tracebacks and torchrun's
    err = proc.stderr
    assert err.count("bench: rank 1 failed: RuntimeError: injected fault") == 1, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "bench: torchrun starts the ranks again (restart 1 of --max-restarts 1)" in err, err
    for noise in ("Connection closed", "closing signal", "failed (exitcode"):
        assert noise not in err, err
    assert "bench: note: torchrun restarted the ranks 1x after a rank failed" in err
    # the report flags the row: its time to target leaves the failed attempt out
    report = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    assert report.returncode == 0, report.stderr
    assert "restarted" in report.stdout.splitlines()[1], report.stdout


def _assert_the_log_holds_both_attempts(path) -> None:
    """The failed attempt ends `aborted`, the next follows from init_start, read with
    MLPerf's own parser; the time from the first run_start covers the attempt lost."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    lines, errors = parse_file(str(path), ruleset="6.0.0")
    assert not errors, errors
    keys = [line.key for line in lines]
    assert keys.count("init_start") == 2 and keys.count("run_start") == 2, keys
    stops = [line for line in lines if line.key == "run_stop"]
    assert [s.value["metadata"]["status"] for s in stops] == ["aborted", "success"]
    again = keys.index("init_start", keys.index("run_stop"))
    assert keys[again - 1] == "cache_clear"
    assert keys[again:].count("eval_accuracy") == 2  # the last attempt's two epochs
    # the aborted stop takes the time of its attempt's last event, which may be run_start
    # itself or one logged in the same millisecond (a gate failed on the strict '>')
    starts = [line.timestamp for line in lines if line.key == "run_start"]
    assert starts[1] > stops[0].timestamp >= starts[0]


def _restarted_once(tmp_path, gpus: int, fault: str, timeout: int):
    """A run with --max-restarts 1 and an injected fault: it must end ok after one restart.
    Returns (the finished process, its record)."""
    proc = run_bench("run", "--strategy", "ddp", "--gpus", str(gpus), "--epochs", "2", *SMALL,
                     "--max-restarts", "1", "--timeout", str(timeout), "--output",
                     str(tmp_path), env={"BENCH_FAULT": fault}, timeout=240)
    assert_ok(proc)
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["restarts"] == 1, rec
    return proc, rec


def test_a_stopped_rank_does_not_keep_torchrun_from_restarting(tmp_path):
    """--max-restarts with rank 1 stopped (SIGSTOP: a debugger, a suspended job): rank 0's
    collective times out, and torchrun SIGTERMs rank 1, which a stopped process never acts
    on; torchrun waits 30 s for it, and the watchdog ended the whole run before
    (`timeout: rank 1 made no progress for 10 s`), restarts left. bench resumes a failed
    attempt's ranks, so torchrun's signal ends them and the next attempt trains."""
    proc, rec = _restarted_once(tmp_path, 2, "stop:1:3", timeout=5)
    assert "bench: timeout: rank 0: " in proc.stderr, proc.stderr
    assert not alive(rec["run_id"])


def test_a_rank_that_hangs_alone_is_ended_for_torchrun_to_start_again(tmp_path):
    """--max-restarts promises that a failure is not the run's end while restarts are
    left; a rank that hangs outside any collective (no peer's timeout names it) is one:
    the watchdog ended the whole run (`rank 0 made no progress for 8 s`). It ends the rank,
    which says why, and torchrun's next attempt trains."""
    proc, rec = _restarted_once(tmp_path, 1, "hang:0:3", timeout=3)
    said = (r"made no progress for \d+ s \(watchdog limit 8 s\); bench ended it for torchrun "
            r"to start the ranks again \[in train epoch 1 step 3\]")
    assert re.search(f"bench: timeout: rank 0: {said}", proc.stderr), proc.stderr
    # as the terminal and a run's error say a timeout ('rank 0: timeout: ...' before)
    assert re.fullmatch(f"timeout: rank 0: {said}", rec["restart_cause"]), rec
    assert not alive(rec["run_id"])


def test_the_watchdog_waits_for_the_next_attempt_not_on_the_beats_of_the_one_that_ended():
    """CI (1 core) ended a run with a restart left: `timeout: rank 1 made no progress for
    10 s; last reported: train epoch 1 step 1`, the beat of the attempt that had failed,
    aged while torchrun ended it and the new rank 1 still started. The scratch folder as a
    run's ranks leave it, at each point of a restart: a stuck rank with a restart left is
    ended (a real stopped process), only the attempt running is timed, and the last
    attempt (no restart left) is timed as a run without restarts is."""
    from bench.launch.job import Launch, RunTimeout
    from bench.train.scratch import Heartbeat, RankError, Scratch

    scratch = Scratch.create("restart-watchdog-test")
    try:
        watchdog = Launch(spec_path=scratch.spec, nprocs=2, port=0, threads=1,
                          scratch=scratch, timeout=10, max_restarts=1)
        long_ago = time.time() - 60

        def beat(rank: int, attempt: int, phase: str, when: float) -> None:
            os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
            try:
                heartbeat = Heartbeat(scratch)
            finally:
                del os.environ["TORCHELASTIC_RESTART_COUNT"]
            heartbeat.bind(rank)
            heartbeat(phase)
            os.utime(scratch.beat(rank), (when, when))

        beat(0, 0, "train epoch 1 step 3", time.time())
        beat(1, 0, "train epoch 1 step 1", long_ago)  # stopped 60 s ago, no rank failed yet
        stuck = subprocess.Popen(["sleep", "120"])
        os.kill(stuck.pid, signal.SIGSTOP)
        scratch.pid(1).write_text(str(stuck.pid))
        # a restart left: the stuck rank is ended and says why, for torchrun to restart
        watchdog.check_progress()
        assert stuck.wait(timeout=10) == -signal.SIGKILL
        [(rank, error)] = scratch.said_errors(0)
        assert rank == "1" and error.said_by(rank).startswith(
            "timeout: rank 1: made no progress for 60 s (watchdog limit 10 s); bench ended "
            "it for torchrun to start the ranks again [in train epoch 1 step 1]"), error
        scratch.write_error(0, RankError("RuntimeError: Application timeout", True, "", 0))
        watchdog.check_progress()  # attempt 0 failed, a restart left: torchrun's to end
        scratch.start_attempt(1)  # the next attempt's rank 0 has started, rank 1 not yet
        scratch.beat(0).unlink()
        beat(0, 1, "build: model and data", time.time())
        watchdog.check_progress()
        assert scratch.last_phase(1) == "train epoch 1 step 1"
        beat(1, 1, "train epoch 1 step 2", long_ago)  # the new rank 1 beat, then stopped
        with pytest.raises(RunTimeout, match="rank 1 made no progress for 60 s"):
            watchdog.check_progress()
        scratch.write_error(0, RankError("RuntimeError: Application timeout", True, "", 1))
        with pytest.raises(RunTimeout):  # the last attempt failed: no restart follows
            watchdog.check_progress()
        without_restarts = Launch(spec_path=scratch.spec, nprocs=2, port=0, threads=1,
                                  scratch=scratch, timeout=10)
        with pytest.raises(RunTimeout):
            without_restarts.check_progress()
    finally:
        scratch.remove()


def test_a_failure_is_named_by_the_last_attempt_of_a_restarted_run(tmp_path):
    """An attempt's error files stay in the scratch folder when torchrun restarts the
    ranks: one whose rank did not fail again (rank 0, a peer of the first failure) was
    the oldest, and named the run's end after the last attempt failed otherwise. The
    attempt is the one that started last (its ranks write it): a rank of it killed without
    a word leaves no file, and the attempt before's must not answer for it."""
    from bench.train.scratch import RankError, Scratch

    scratch = Scratch(tmp_path)
    scratch.write_error(0, RankError("RuntimeError: Connection reset by peer", False, "", 0))
    os.utime(scratch.error(0), (time.time() - 60, time.time() - 60))
    scratch.start_attempt(1)  # as the ranks of the attempt after do
    assert not scratch.has_errors() and scratch.errors() == []  # the attempt running: none
    scratch.write_error(1, RankError("timeout: its DataLoader workers ...", True, "", 1))
    assert [rank for rank, _ in scratch.errors()] == ["1"] and scratch.has_errors()
    assert [rank for rank, _ in scratch.errors(0)] == ["0"]  # the attempt before's
    rank, error = scratch.cause_of(0)  # a broken connection alone: it names no cause
    assert rank == "0" and error.peer_gone()
    # where no rank restarted, every error counts, oldest first
    scratch.attempt_file.unlink()
    scratch.write_error(1, RankError("RuntimeError: injected fault", False, "", 0))
    assert [rank for rank, _ in scratch.errors()] == ["0", "1"]
    # the cause: the first error that is not a peer's broken connection, older or not
    assert scratch.cause_of(0)[0] == "1" and not scratch.cause_of(0)[1].peer_gone()


def test_a_peers_broken_connection_written_first_is_not_the_runs_cause(tmp_path):
    """A rank that lost its peer can write its error before the peer that failed writes
    its own (both within one collective's end): the oldest error is then a consequence,
    and named the run's end over the cause beside it."""
    from bench.launch.run import _first_failure
    from bench.train.scratch import RankError, Scratch

    scratch = Scratch(tmp_path)
    scratch.write_error(0, RankError("RuntimeError: [gloo/pair.cc:561] Connection closed by "
                                     "peer [127.0.0.1]:30130 [in train epoch 1 step 3]",
                                     False, ""))
    os.utime(scratch.error(0), (time.time() - 1, time.time() - 1))
    scratch.write_error(1, RankError("RuntimeError: injected [in train epoch 1 step 3]", False,
                                     ""))
    assert _first_failure(scratch)[0] == "rank 1: RuntimeError: injected [in train epoch 1 step 3]"


@pytest.mark.parametrize("strategy", ["ddp", "ddp-spawn", "dp", "horovod"])
def test_a_raising_rank_prints_its_own_traceback_once_and_keeps_it(strategy, tmp_path):
    """What the terminal shows of a rank that raised: its traceback once, then one line.
    Not its peers' (each a broken connection, a consequence), nor torchrun's traceback and
    report, which came after it and buried it (before: 3 tracebacks, about 80 lines), nor
    horovodrun's lines about exit codes. The record keeps the traceback for a bug report."""
    if strategy == "horovod" and HOROVOD:
        pytest.skip(f"horovod unavailable: {HOROVOD}")
    rank = "0" if strategy == "dp" else "1"  # dp: one process
    proc = run_bench("run", "--strategy", strategy, "--gpus", "2", "--epochs", "2", *SMALL,
                     "--output", str(tmp_path), env={"BENCH_FAULT": f"raise:{rank}:2"})
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert err.count("Traceback (most recent call last)") == 1, err
    assert f"bench: the traceback of rank {rank}:\nTraceback" in err, err
    for noise in ("Connection closed", "ChildFailedError", "Root Cause", "closing signal",
                  "HorovodInternalError", "<stderr>"):
        assert noise not in err, err
    assert "exit with status code" not in proc.stdout and "<stdout>" not in proc.stdout, (
        proc.stdout)
    assert err.strip().splitlines()[-1].startswith(
        f"bench: run failed: rank {rank}: RuntimeError: injected fault (BENCH_FAULT) at step 2")
    rec = only_record(tmp_path)
    assert rec["error_traceback"].startswith("Traceback (most recent call last)")
    assert rec["error_traceback"].endswith("RuntimeError: injected fault (BENCH_FAULT) at step 2")


def test_a_rank_that_said_its_error_and_then_aborted_is_named_by_its_error(tmp_path):
    """A rank that raised, wrote its error, then died of SIGABRT in its teardown (gloo
    aborts one now and then as its group goes while a peer waits in a collective): its
    error is the cause. Before, torchrun's report of the signal won, and a full disk read
    as `rank 0 was killed by signal 6 (SIGABRT) [in eval batch 1]` (a CI failure)."""
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "2", "--epochs", "2", *SMALL,
                     "--output", str(tmp_path), env={"BENCH_FAULT": "abort:0:2"})
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bench: run failed: rank 0: RuntimeError: injected fault "
                           "(BENCH_FAULT) at step 2 [in train epoch 1 step 2]"), proc.stderr
    assert "signal" not in last, last
    assert only_record(tmp_path)["error"].startswith("rank 0: RuntimeError: injected fault")


@pytest.mark.parametrize("accum, fix", [("1", "16 images per replica at once: lower "
                                               "--batch-size, or keep it and add --grad-accum 2 "
                                               "(8 at once, the same global batch)"),
                                        ("2", "8 images per replica at once: lower "
                                              "--batch-size, or keep it and raise --grad-accum "
                                              "to 4 (4 at once, the same global batch)")])
def test_out_of_memory_is_one_line_naming_the_batch_and_the_fix(accum, fix, tmp_path):
    """A real allocator failure on the rank's device (BENCH_FAULT oom: it asks for 4 EiB) is
    one line: how many images the replica held at once, and --grad-accum that keeps the
    global batch (16 per replica splits into 2 or 4 micro-batches, not 3). No traceback on
    the terminal; the record keeps it."""
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "2", "--epochs", "2", *SMALL,
                     "--grad-accum", accum, "--output", str(tmp_path),
                     env={"BENCH_FAULT": "oom:1:2"})
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    rec = only_record(tmp_path)
    assert rec["error"] == (f"rank 1: out of memory on cpu: tried to allocate 4.00 EiB; {fix} "
                            "[in train epoch 1 step 2]")
    assert proc.stderr.strip().splitlines()[-1].startswith(f"bench: run failed: {rec['error']}")
    assert "can't allocate memory" in rec["error_traceback"]


def test_hanging_rank_is_ended_by_the_timeout(tmp_path):
    rec, elapsed = _failing_run(tmp_path, "ddp", 2, "hang:1:3", "--timeout", "5")
    # Rank 0 waited in the gradient all-reduce that rank 1 never joined.
    assert rec["error"].startswith("timeout: rank 0"), rec["error"]
    assert "train epoch 1 step 3" in rec["error"]
    # gloo's source file before its message ('[/__w/pytorch/.../unbound_buffer.cc:129]')
    # is the traceback's (kept), not the line's
    assert not re.search(r"\.cc:\d+\]", rec["error"]), rec["error"]
    assert elapsed < 60
    assert not alive(rec["run_id"])


def test_a_rank_error_line_leaves_the_cpp_source_location_to_the_traceback():
    """A gloo timeout as the rank above raised it, when rank 0's side of the collective was
    a send (whether it is a send or a receive depends on the moment: the test above sees
    either): the line read `timeout: rank 0: RuntimeError: [/__w/pytorch/pytorch/
    third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 5000ms
    ...`, a third of it a build machine's path."""
    from bench.train.rank import _error_line

    sent = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                        "unbound_buffer.cc:129] Timed out waiting 5000ms for send operation "
                        "to complete")
    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                          "closed by peer [127.0.0.1]:36397")
    assert _error_line(sent) == ("RuntimeError: Timed out waiting 5000ms for send operation "
                                 "to complete")
    assert _error_line(closed) == "RuntimeError: Connection closed by peer [127.0.0.1]:36397"
    assert _error_line(RuntimeError("[rank 1] not a path [x]")) == (
        "RuntimeError: [rank 1] not a path [x]")


def test_a_failed_rank_ends_the_run_while_another_is_stopped(tmp_path):
    """Rank 1 raises while rank 0 is stopped (SIGSTOP): torchrun SIGTERMs rank 0, which a
    stopped process never acts on, and waits 30 s; with --timeout 60 the watchdog would
    come after a minute. bench stops the launcher 5 s after the failure instead."""
    rec, elapsed = _failing_run(tmp_path, "ddp", 2, "stop:0:3,raise:1:3", "--timeout", "60")
    assert rec["error"].startswith("rank 1: RuntimeError: injected fault"), rec["error"]
    assert elapsed < 25, f"took {elapsed:.0f} s (12 s here; 38 s when torchrun is left to wait)"
    assert not alive(rec["run_id"])


@pytest.mark.parametrize("strategy", ["ddp", "dp"])
def test_watchdog_ends_a_rank_that_stops_without_a_collective(strategy, tmp_path):
    """dp's rank is bench's own process, stuck where no exception may reach it: a thread
    watches its heartbeat, closes the record and ends the process, loader worker included."""
    rec, _ = _failing_run(tmp_path, strategy, 1, "hang:0:3", "--timeout", "2", "--workers", "1")
    assert rec["error"].startswith("timeout: rank 0 made no progress"), rec["error"]
    # where it stopped, not where it last beat (at most once a second, it said step 1)
    assert rec["error"].endswith("[in train epoch 1 step 3]"), rec["error"]
    assert rec["status"] == "failed" and rec["finished_at"]
    assert not alive(rec["run_id"]) and not alive(str(tmp_path))


@pytest.mark.parametrize("strategy", ["ddp", "ddp-spawn", "dp"])
def test_sigterm_keeps_finished_epochs_and_says_so_in_one_line(strategy, tmp_path):
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", strategy, "--gpus", "2",
           "--epochs", "200", *SMALL, "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    _first_epoch(tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    # One line says why; torchrun's traceback of the SIGTERM it was sent is not passed on.
    assert "Traceback" not in out, out[-3000:]
    assert out.strip().splitlines()[-1].startswith("bench: run interrupted: SIGTERM (record ")
    rec = only_record(tmp_path)
    assert rec["status"] == "interrupted" and rec["error"] == "SIGTERM"
    assert 1 <= len(rec["per_epoch"]) < 200
    assert not alive(rec["run_id"])


def _first_epoch(output: Path) -> None:
    """Wait until the run writing into ``output`` has recorded an epoch."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = list((output / "runs").glob("*.json")) if (output / "runs").exists() else []
        if runs and len(json.loads(runs[0].read_text()).get("per_epoch", [])) >= 1:
            return
        time.sleep(0.2)


def test_sigterm_to_the_whole_group_is_one_line_with_loader_workers(tmp_path):
    """timeout(1) and scancel signal every process of a run: the loader worker leaves the
    SIGTERM to its rank (dp's is bench itself), not killed under it with torch's traceback
    ('DataLoader worker ... is killed by signal: Terminated')."""
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", "dp", "--gpus", "1",
           "--epochs", "200", "--workers", "1", *SMALL, "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    _first_epoch(tmp_path)
    proc.send_signal(signal.SIGTERM)  # as timeout(1) does: the command, then its group
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "killed by signal" not in out, out[-3000:]
    assert out.strip().splitlines()[-1].startswith("bench: run interrupted: SIGTERM (record ")
    assert only_record(tmp_path)["status"] == "interrupted"
    assert not alive(str(tmp_path))


def test_two_runs_at_once_do_not_collide(tmp_path):
    cmds = [
        [sys.executable, "-m", "bench", "run", "--strategy", s, "--gpus", "2", "--epochs", "1",
         *SMALL, "--output", str(tmp_path / s)]
        for s in ("ddp", "ddp-spawn")
    ]
    procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in cmds]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    ports = {only_record(tmp_path / s)["status"] for s in ("ddp", "ddp-spawn")}
    assert ports == {"ok"}


def test_result_files_are_never_half_written(tmp_path):
    assert_ok(run_bench("run", "--strategy", "dp", "--epochs", "1", *SMALL,
                        "--output", str(tmp_path)))
    files = list((tmp_path / "runs").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"
    json.loads(files[0].read_text())


def test_a_run_whose_loss_becomes_nan_is_diverged_not_ok(tmp_path):
    """--lr 1e30: step 1 is finite, its update makes step 2's loss non-finite. Both ranks
    stop after that epoch; the record says diverged (epoch, step, last finite loss), holds
    no NaN (strict JSON), and the report shows it as such."""
    proc = run_bench("run", "--strategy", "ddp", "--cpu", "--gpus", "2", "--epochs", "2",
                     "--data", "synthetic", "--train-limit", "128", "--test-limit", "16",
                     "--lr", "1e30", "--warmup-epochs", "0", "--output", str(tmp_path), *FAST)
    assert proc.returncode == 1, proc.stderr
    assert "bench: run diverged: training loss became non-finite in epoch 1, step 2" in (
        proc.stderr)
    text = next((tmp_path / "runs").glob("*.json")).read_text()
    rec = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the record"))
    assert rec["status"] == "diverged" and rec["per_epoch"] == []
    assert rec["diverged_at"]["epoch"] == 1 and rec["diverged_at"]["step"] == 2
    assert 3 < rec["diverged_at"]["last_finite_loss"] < 7  # about ln(100) at the start
    report = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert "diverged" in report.stdout


@pytest.mark.parametrize("sig, when", [(signal.SIGTERM, "at 1 s"),
                                       (signal.SIGINT, "when the record appears")])
def test_a_signal_at_any_moment_of_start_up_exits_130_without_a_traceback(sig, when,
                                                                          tmp_path):
    """SIGTERM 1 s after start exited 143 (the handler came later); Ctrl-C right after the
    record appeared printed a traceback and left it `running`."""
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", "ddp", "--cpu", "--gpus", "2",
           "--epochs", "50", "--data", "synthetic", "--train-limit", "256", "--test-limit",
           "16", "--output", str(tmp_path), *FAST]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if sig == signal.SIGTERM:
        time.sleep(1.0)
    else:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("runs/*.json")) and time.monotonic() < deadline:
            time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    for path in tmp_path.glob("out/runs/*.json"):
        assert json.loads(path.read_text())["status"] == "interrupted"


@pytest.mark.parametrize("strategy", ["ddp-spawn", "ddp"])
def test_a_stopped_rank_ends_the_run_within_the_timeout_and_ten_seconds(strategy, tmp_path):
    """SIGSTOP of one ddp-spawn rank with --timeout 30 ended only after 64 s: torch's spawn
    waits 30 s after SIGTERM (which a stopped process never acts on) before SIGKILL; under
    torchrun, with --timeout 10, 26 s (its agent waits 30 s for the SIGTERMed ranks)."""
    import tempfile
    from pathlib import Path

    timeout = 5
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", strategy, "--cpu",
           "--gpus", "2", "--epochs", "500", "--data", "synthetic", "--train-limit", "512",
           "--test-limit", "16", "--timeout", str(timeout), "--output", str(tmp_path), *FAST]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline, pid_file = time.monotonic() + 90, None
    while pid_file is None and time.monotonic() < deadline:
        for rec in tmp_path.glob("runs/*.json"):
            run_id = json.loads(rec.read_text())["run_id"]
            for folder in Path(tempfile.gettempdir()).glob(f"bench-{run_id}-*"):
                beat = folder / "beat-rank1"
                if beat.exists() and "train epoch" in beat.read_text():
                    pid_file = folder / "pid-rank1"
        time.sleep(0.2)
    assert pid_file is not None, "rank 1 never reported a training step"
    stopped = time.monotonic()
    os.kill(int(pid_file.read_text()), signal.SIGSTOP)
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - stopped
    assert proc.returncode == 1, err[-2000:]
    assert took < timeout + 10, f"ended {took:.0f} s after the rank stopped: {err[-1500:]}"


@pytest.mark.parametrize("limit", [6000, 9000])
def test_a_write_that_fails_is_one_line_and_never_leaves_a_running_record(limit, tmp_path):
    """A full disk, as a file-size limit (RLIMIT_FSIZE; SIGXFSZ ignored, so writes fail with
    EFBIG like ENOSPC): 6,000 bytes stop bench writing the ranks' spec, 9,000 stop rank 0
    writing its record mid-run. Either way one line, exit 1, and no `running` record."""
    import resource

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", "ddp", "--cpu", "--epochs",
           "8", "--data", "synthetic", "--train-limit", "64", "--test-limit", "8",
           "--output", str(tmp_path / "out"), *FAST]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          preexec_fn=limited, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert _left_in(tmp) == []  # the scratch folder too, when its spec could not be written
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bench: run failed:") and "File too large" in last, last
    assert "bench/cli.py" not in proc.stderr  # no traceback of bench itself (ranks' may show)
    for path in tmp_path.glob("out/runs/*.json"):
        assert json.loads(path.read_text())["status"] == "failed"
    # Recording the commit must not write the checkout's git index (it once left a stale
    # .git/index.lock under this very limit).
    assert not (ROOT / ".git" / "index.lock").exists()


# torch's own caches (torchinductor_USER), shared by every run on purpose, may stay.
_TORCH_CACHES = ("torchinductor_",)


def _left_in(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith(_TORCH_CACHES))


@pytest.mark.parametrize("strategy, fault", [("ddp", None), ("ddp-launch", "raise:1:2"),
                                             ("ddp-spawn", "raise:1:2")])
def test_a_run_leaves_nothing_in_the_temporary_directory(strategy, fault, tmp_path):
    """Every start of torchrun (and torch.distributed.launch) made a ``torchelastic_*``
    folder in the temporary directory and never removed it, and a spawned rank that failed
    left its ``pytorch-errorfile-*.pickle``: hundreds of them after a sweep."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), **({"BENCH_FAULT": fault} if fault else {})}
    proc = run_bench("run", "--strategy", strategy, "--gpus", "2", "--epochs", "1", *SMALL,
                     "--output", str(tmp_path / "out"), env=env)
    assert proc.returncode == (1 if fault else 0), proc.stderr[-2000:]
    assert _left_in(tmp) == []


def test_bench_probe_leaves_nothing_in_the_temporary_directory(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = run_bench("probe", "--cpu", "--gpus", "2", "--width", "0.125", "--max-size", "0.01",
                     "--output", str(tmp_path / "out"), env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _left_in(tmp) == []
