"""kill -9 of `bench run` or `bench sweep`: nothing of the run survives, and the record it
could not close is reported as interrupted (its owner is gone), without being rewritten."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, alive, descendants, only_record, run_bench, still_running

from bench.launch import job
from bench.launch import launchers as launch
from bench.launch.output import (
    HorovodLines,
    RestartLines,
    TorchrunLines,
    torchrun_root_cause,
)
from bench.train.scratch import RankError, Scratch
from strategies.horovod import HorovodStrategy

SMALL = ["--cpu", "--data", "synthetic", "--train-limit", "512", "--test-limit", "32",
         "--width", "0.125", "--batch-size", "32", "--no-progress", "--epochs", "500",
         "--comm-probe-steps", "0"]
HOROVOD = HorovodStrategy("horovod").requires("cpu")
# Each test looks only at its own run's processes (its run id, output folder or process
# tree), so most run beside others; those that aim a signal at a moment a neighbour's load
# would move are marked serial (alone).


def _training(out: Path, timeout: float = 120) -> str:
    """The run id, once a rank of the run in ``out`` reports a training step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (out / "runs").glob("*.json") if (out / "runs").is_dir() else []:
            run_id = json.loads(path.read_text())["run_id"]
            for beat in Path(tempfile.gettempdir()).glob(f"bench-{run_id}-*/beat-rank*"):
                if "train epoch" in beat.read_text():
                    return run_id
        time.sleep(0.2)
    raise AssertionError(f"no training step reported under {out}")


def _gone_within(seconds: float, *patterns: str) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        left = [line for p in patterns for line in alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _interrupted_in_report(out: Path) -> None:
    rec = only_record(out)
    assert rec["status"] == "running"  # nobody closed it, and the report does not rewrite it
    proc = run_bench("report", "--results", str(out), "--format", "csv", "--no-write")
    assert proc.returncode == 0, proc.stderr
    assert "interrupted" in proc.stdout and "owner" in proc.stdout, proc.stdout


@pytest.mark.parametrize("strategy", ["ddp", "ddp-launch", "fsdp", "horovod"])
def test_kill_9_of_bench_run_leaves_nothing_running(strategy, tmp_path):
    if strategy == "horovod" and HOROVOD:
        pytest.skip(f"horovod unavailable: {HOROVOD}")
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", strategy, "--gpus", "2",
           *SMALL, "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    run_id = _training(tmp_path)
    tree = descendants(proc.pid)  # the agent, a copy of bench, lacks the run id in its argv
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = _gone_within(10, f"bench-{run_id}-")
    assert not left, f"still running 10 s after kill -9 of bench run: {left}"
    assert not still_running(tree), f"{still_running(tree)} of {len(tree)} processes still running"
    _interrupted_in_report(tmp_path)


def test_kill_9_of_bench_sweep_leaves_nothing_running_and_resumes(tmp_path):
    cmd = [sys.executable, "-m", "bench", "sweep", "--strategies", "ddp", "--gpus", "2",
           *SMALL, "--epochs", "4", "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    run_id = _training(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = _gone_within(10, f"bench-{run_id}-", str(tmp_path))
    assert not left, f"still running 10 s after kill -9 of bench sweep: {left}"
    _interrupted_in_report(tmp_path)
    # The same sweep again: the stale `running` record (owner gone) and the dead sweep's
    # claim do not block it; the record moves aside and the combination runs to the end.
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert only_record(tmp_path)["status"] == "ok"
    assert [p.name for p in (tmp_path / "runs" / "superseded").iterdir()] == [
        f"{run_id}.json"]
    # and the killed launcher's scratch folder, which it could not remove, is gone
    assert not list(Path(tempfile.gettempdir()).glob(f"bench-{run_id}-*"))


def _rank_1_killed_in_training(tmp_path: Path, strategy: str, *options: str
                               ) -> tuple[subprocess.Popen, str]:
    """A 2-rank run of ``strategy`` into ``tmp_path`` (SMALL, then ``options``), its rank 1
    SIGKILLed once a rank reports a training step: the run's process and its run id."""
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", strategy, "--gpus", "2",
           *SMALL, *options, "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    run_id = _training(tmp_path)
    scratch = next(Path(tempfile.gettempdir()).glob(f"bench-{run_id}-*"))
    os.kill(int((scratch / "pid-rank1").read_text()), signal.SIGKILL)
    return proc, run_id


@pytest.mark.parametrize("strategy", ["ddp", "ddp-spawn", "horovod"])
def test_a_rank_killed_by_a_signal_is_named(strategy, tmp_path):
    if strategy == "horovod" and HOROVOD:
        pytest.skip(f"horovod unavailable: {HOROVOD}")
    proc, run_id = _rank_1_killed_in_training(tmp_path, strategy)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    rec = only_record(tmp_path)
    assert rec["status"] == "failed"
    assert rec["error"].startswith("rank 1 was killed by signal 9 (SIGKILL) [in "), rec["error"]
    assert "epoch" in rec["error"]  # the phase it last reported
    # bench's line alone: not the shell's "Killed", nor the peers' broken connections
    assert [line for line in err.splitlines() if not line.startswith("bench: ")] == [], err
    assert not _gone_within(10, f"bench-{run_id}-")


def test_a_rank_killed_outright_is_the_cause_its_restarted_record_keeps(tmp_path):
    """--max-restarts 1 and rank 1 SIGKILLed in training: torchrun starts the ranks again
    and the run ends ok, its record saying what ended the attempt before (restart_cause,
    the report's line). A rank killed outright writes nothing, and the record's cause was
    null ('after a rank failed'); it is the launcher's account ('rank 1 was killed by
    signal 9 (SIGKILL) [in train epoch ...]', or that it ended without a word where
    torchrun saw its peer's end first)."""
    proc, _ = _rank_1_killed_in_training(tmp_path, "ddp", "--epochs", "3",
                                         "--max-restarts", "1")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    # torchrun names the first end it saw: rank 1's signal, or its peer's exit, after which
    # rank 1 is the one that said nothing
    said = next(line for line in err.splitlines() if line.startswith("bench: rank 1 "))
    assert said.startswith(("bench: rank 1 was killed by signal 9 (SIGKILL) [in train epoch",
                            "bench: rank 1 ended without a word, as one killed by a signal "
                            "does")), err
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["restarts"] == 1, rec
    assert said.startswith("bench: " + rec["restart_cause"].split(" [in ")[0]), (
        rec["restart_cause"], err)
    assert "[in train epoch" in rec["restart_cause"], rec["restart_cause"]
    assert any(f"after {rec['restart_cause']}" in note for note in rec["notes"]), rec["notes"]


def test_what_only_follows_a_ranks_death_is_held_back_under_horovodrun():
    """horovodrun's stderr as it came when rank 1 was SIGKILLed (its shell's report, the
    peer's broken connection), between lines a rank wrote itself: those pass, in order."""
    lines = HorovodLines(False)
    loop = ("[2026-11-25 22:16:16.703247: E horovod/common/operations.cc:697] [0]: Horovod "
            "background loop uncaught exception: [gloo/transport/tcp/pair.cc:598] Connection "
            "closed by peer [127.0.0.1]:16795\n")
    shown = lines("[0]<stderr>:step 3\n[0]<stderr>:" + loop + "[1]<stderr>:Killed\n"
                  "[1]<stderr>:Killed 3 stale workers\n") + lines("")
    assert shown == "step 3\nKilled 3 stale workers\n"
    assert lines.withheld() == loop + "Killed\n"


def _two_ranks_under_torchrun(tmp_path: Path, script: Path, *options: str,
                             args: tuple[str, ...] | list[str] = ()) -> subprocess.CompletedProcess:
    """Real torchrun (its files in ``tmp_path``) running ``script`` as two ranks."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *options,
         launch.agent_log_dir(tmp_path), str(script), *args],
        capture_output=True, text=True, timeout=120)


def test_what_torchrun_logs_after_a_ranks_death_is_held_back(tmp_path):
    """Real torchrun, two ranks: rank 1 is SIGKILLed while rank 0 waits outside any
    collective, so torchrun SIGTERMs rank 0 before it could write an error file (what make
    test met once under load: torchrun's 'closing signal' lines and ChildFailedError report
    came before bench's line). What the ranks wrote before passes, in order, whether the
    output comes in one piece or line by line; what the agent logs from the death on is held
    back whole, for bench to show where it finds no cause. The death is named from
    torchrun's report, in a restarted run's last attempt too."""
    script = tmp_path / "two_ranks.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "ready = sys.argv[1]\n"
        "if os.environ['RANK'] == '0':\n"
        "    print('rank 0 waiting', file=sys.stderr, flush=True)\n"
        "    open(ready, 'w').close()\n"
        "    time.sleep(60)\n"
        "while not os.path.exists(ready):\n"
        "    time.sleep(0.01)\n"
        "print('rank 1 going', file=sys.stderr, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = _two_ranks_under_torchrun(tmp_path, script, args=[str(tmp_path / "ready")])
    assert proc.returncode != 0 and "ChildFailedError" in proc.stderr, proc.stderr
    whole = TorchrunLines()
    shown = whole(proc.stderr) + whole("")
    pieces = TorchrunLines()
    assert "".join(pieces(line) for line in proc.stderr.splitlines(keepends=True)) == shown
    assert [line for line in shown.splitlines() if line.startswith("rank ")] == [
        "rank 0 waiting", "rank 1 going"], shown
    assert "signal" not in shown and "exitcode" not in shown, shown
    assert shown + whole.withheld() == proc.stderr == shown + pieces.withheld()
    assert "ChildFailedError" in whole.withheld()
    assert torchrun_root_cause(proc.stderr) == (1, signal.SIGKILL)
    # the last attempt of a restarted run (--max-restarts): rank 1's error file is its first
    # attempt's (it raised then), and said nothing of this death, which its peer's broken
    # connection did not cause either (before, that connection was named as the run's end)
    scratch = Scratch(tmp_path / "scratch")
    scratch.root.mkdir()
    scratch.write_error(1, RankError("RuntimeError: injected [in train epoch 1 step 3]", False,
                                     "", 0))
    scratch.start_attempt(1)
    scratch.write_error(0, RankError("RuntimeError: Connection reset by peer", False, "", 1))
    job.find_root_cause(proc.stderr, scratch, torchrun_root_cause(proc.stderr))
    assert scratch.root_cause.read_text().startswith("rank 1 was killed by signal 9 (SIGKILL)")


# torchrun's agent's lines once a rank has ended, as torch 2.x logs them
_AGENT_ENDED = ("W1130 13:11:17.064000 29365 torch/distributed/elastic/multiprocessing/api.py:"
                "1028] Sending process 29367 closing signal SIGTERM\n"
                "E1130 13:11:17.097000 29365 torch/distributed/elastic/multiprocessing/api.py:"
                "1002] failed (exitcode: {code}) local_rank: {rank} (pid: 29368) of binary: "
                "/usr/bin/python3\n")


def test_a_restarted_attempts_failure_is_said_once_and_the_next_attempt_flows(tmp_path):
    """With --max-restarts, an attempt's failure is bench's account of it, not the ranks'
    tracebacks and torchrun's lines, and what the next attempt prints passes again. The
    cause is not the rank torchrun's line names: it logs one rank's end, the first it saw
    (the lower rank where two end in one poll), and a rank killed outright writes nothing,
    while its peer writes its broken connection. The last attempt torchrun allows is held
    for the run's end."""
    scratch = Scratch(tmp_path)
    for rank in (0, 1):
        scratch.pid(rank).write_text(str(100 + rank))
    scratch.beat(1).write_text("train epoch 2 step 5")
    lines = RestartLines(scratch, restarts=2)
    assert lines("[ddp] a note of attempt 0\n") == "[ddp] a note of attempt 0\n"
    scratch.write_error(0, RankError("RuntimeError: Read error [127.0.0.1]:6532: Connection "
                                     "reset by peer [in train epoch 2 step 5]", False, "Tb"))
    assert lines("Traceback (most recent call last):\nRuntimeError: ... reset by peer\n") == ""
    said = lines(_AGENT_ENDED.format(code=1, rank=0))
    assert " ".join(said.split()).startswith(
        "bench: rank 1 ended without a word, as one killed by a signal does (kill -9, the OOM "
        "killer) [in train epoch 2 step 5] bench: torchrun"), said
    assert "rank 0" not in said, said
    assert said.endswith("bench: torchrun starts the ranks again (restart 1 of --max-restarts "
                         "2); the record will hold the last attempt's epochs\n"), said
    # in one line for the next attempt's record, which no rank of this one could tell it
    assert scratch.failed_attempt(0).read_text() == (
        "rank 1 ended without a word, as one killed by a signal does (kill -9, the OOM "
        "killer) [in train epoch 2 step 5]")
    assert lines("[W] torchrun's agent, still about the failure\n") == ""
    scratch.start_attempt(1)  # the next attempt's ranks start
    assert lines("[ddp] a note of attempt 1\n") == "[ddp] a note of attempt 1\n"
    # a rank killed while its peer waited: torchrun names it, with its signal
    said = lines(_AGENT_ENDED.format(code=-9, rank=1))
    assert said.startswith("bench: rank 1 was killed by signal 9 (SIGKILL) [in train epoch 2 "
                           "step 5]\nbench: torchrun starts the ranks again (restart 2 of "), said
    assert scratch.failed_attempt(1).read_text() == ("rank 1 was killed by signal 9 (SIGKILL) "
                                                     "[in train epoch 2 step 5]")
    scratch.start_attempt(2)
    assert lines("[ddp] attempt 2\n") == "[ddp] attempt 2\n"
    # the last attempt: nothing said now, all held for the run's end to show if it must
    scratch.write_error(1, RankError("RuntimeError: boom [in eval batch 1]", False, "Tb", 2))
    assert lines("Traceback (most recent call last):\n") == ""
    assert lines(_AGENT_ENDED.format(code=1, rank=1)) == ""
    assert lines.withheld().startswith("Traceback (most recent call last):\nW1130")


def test_a_warning_every_rank_logs_is_shown_once():
    """torch's C++ warnings come once per rank, each with its rank and time: the first is
    passed on, the others not; another warning, or the same one from another source line,
    is its own."""
    from bench.launch.output import OnceAcrossRanks

    def warning(rank: int, where: str, what: str) -> str:
        return f"[rank{rank}]:[W1130 14:19:16.63901859{rank} {where}] Warning: {what}\n"

    unused = "find_unused_parameters=True was specified in DDP constructor, but ..."
    once = OnceAcrossRanks()
    first = warning(0, "reducer.cpp:1529", unused)
    assert once("[ddp] a line\n" + first + warning(1, "reducer.cpp:1529", unused)) == (
        "[ddp] a line\n" + first)
    other = warning(1, "reducer.cpp:400", "Grad strides do not match")
    assert once(warning(2, "reducer.cpp:1529", unused) + other) == other
    assert once(warning(3, "api.cpp:9", unused)) == warning(3, "api.cpp:9", unused)


class _Chunks:
    """A launcher's stderr as ``tee`` reads it: each chunk after its ``before()`` ran (what
    the ranks did to the scratch folder by then)."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    def read1(self, size):
        if not self.chunks:
            return b""
        before, text = self.chunks.pop(0)
        before()
        return text.encode()


def test_bench_lines_after_a_progress_bar_start_a_line_of_their_own(tmp_path):
    """A progress bar redraws its line without ending it: bench's line after a failure
    (a restart's account, the run's end) was glued to the bar's end on a terminal
    ('| 3/16 [00:00<00:00, 23.09step/s]bench: rank 1 failed: ...')."""
    import collections
    import io
    import threading

    from bench.launch.output import end_open_line, tee

    scratch = Scratch(tmp_path)
    for rank in (0, 1):
        scratch.pid(rank).write_text(str(100 + rank))
    bar = "\repoch 1/2:  19%|#         | 3/16 [00:00<00:00, 23.09step/s]"

    def fails() -> None:  # rank 1 writes its error, then prints its traceback
        scratch.write_error(1, RankError("RuntimeError: boom [in train epoch 1 step 5]", True,
                                         "Tb"))

    out, echo = io.StringIO(), threading.Event()
    echo.set()
    tee(_Chunks([(lambda: None, bar), (fails, "Traceback (most recent call last):\n"),
                 (lambda: None, _AGENT_ENDED.format(code=1, rank=1))]),
        collections.deque(), echo, None, out, RestartLines(scratch, restarts=1))
    assert out.getvalue().startswith(bar + "\nbench: rank 1 failed: RuntimeError: boom"), (
        out.getvalue())
    # the run's end: the line a bar left open is ended first, once
    out = io.StringIO()
    tee(_Chunks([(lambda: None, bar)]), collections.deque(), echo, None, out)
    end_open_line(out)
    end_open_line(out)
    assert out.getvalue() == bar + "\n"
    # a bar cleared to the line's start ("\r") leaves no line open
    out = io.StringIO()
    tee(_Chunks([(lambda: None, bar + "\r" + " " * 60 + "\r")]), collections.deque(), echo,
        None, out)
    end_open_line(out)
    assert not out.getvalue().endswith("\n")


def test_a_restarted_attempts_error_names_its_rank_with_its_traceback(tmp_path):
    """A rank that raised: its line, and its traceback where the line does not say what to
    do, once; the peer's broken connection is a consequence, whichever torchrun names."""
    scratch = Scratch(tmp_path)
    for rank in (0, 1):
        scratch.pid(rank).write_text(str(100 + rank))
    lines = RestartLines(scratch, restarts=1)
    scratch.write_error(1, RankError("RuntimeError: injected [in train epoch 1 step 3]", False,
                                     "Traceback (most recent call last):\nRuntimeError: x\n"))
    scratch.write_error(0, RankError("RuntimeError: Connection closed by peer [in train epoch "
                                     "1 step 3]", False, "Tb"))
    assert lines("Traceback (most recent call last):\n") == ""
    said = lines(_AGENT_ENDED.format(code=1, rank=0))
    assert said.startswith("bench: rank 1 failed: RuntimeError: injected [in train epoch 1 step "
                           "3]\nbench: the traceback of rank 1:\nTraceback (most recent call "
                           "last):\nRuntimeError: x\nbench: torchrun starts"), said


@pytest.mark.serial  # both deaths must land in one of torchrun's 2 s polls: no load
@pytest.mark.parametrize(("ending", "code"), [("os.abort()", "-6"), ("os._exit(1)", "1")])
def test_a_killed_rank_is_named_when_torchrun_blames_the_peer_that_ended(ending, code,
                                                                         tmp_path):
    """Real torchrun, two ranks: rank 1 is SIGKILLed, rank 0 ends the moment it is gone, as
    a peer whose collective broke does: it aborts, or it exits with 1 (bench's ranks do, having
    written their error; what CI met under load). torchrun sees both in one poll, stamps them
    with the same second and names rank 0 as root cause; the run must still name rank 1."""
    script = tmp_path / "two_ranks.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "pid_file = sys.argv[1]\n"
        "if os.environ['RANK'] == '1':\n"
        "    open(pid_file + '.tmp', 'w').write(str(os.getpid()))\n"
        "    os.rename(pid_file + '.tmp', pid_file)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "while not os.path.exists(pid_file):\n"
        "    time.sleep(0.01)\n"
        "pid = int(open(pid_file).read())\n"
        "while os.path.exists(f'/proc/{pid}') and "
        "open(f'/proc/{pid}/stat').read().split(')')[-1].split()[0] != 'Z':\n"
        "    time.sleep(0.001)\n"
        f"{ending}\n")
    proc = _two_ranks_under_torchrun(tmp_path, script, "--monitor-interval", "2",
                                     args=[str(tmp_path / "pid-rank1")])
    assert proc.returncode != 0
    report = proc.stderr[proc.stderr.rfind("Root Cause"):]
    assert f"exitcode  : {code} " in report, proc.stderr  # torchrun blames rank 0
    assert torchrun_root_cause(proc.stderr) == (1, signal.SIGKILL)


def test_a_collective_ended_by_nccls_watchdog_is_a_timeout_not_a_signal(tmp_path):
    """On 2 or more GPUs a collective that outlives --timeout is ended by NCCL's watchdog: it
    logs the collective and aborts the rank (SIGABRT), which says nothing itself. Real
    torchrun, two ranks: rank 1 logs the watchdog's line as torch's ProcessGroupNCCL writes it
    (WorkNCCL::checkTimeout, behind its log prefix) and aborts; rank 0 is stopped by torchrun.
    The run's cause is the timeout, not 'killed by signal 6' (no GPU pair here to run NCCL)."""
    script = tmp_path / "two_ranks.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.stderr.write('[rank1]:[E1125 16:12:38.000000000 ProcessGroupNCCL.cpp:697] '\n"
        "                     '[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught '\n"
        "                     'collective operation timeout: WorkNCCL(SeqNum=41, '\n"
        "                     'OpType=ALLREDUCE, NumelIn=2797380, NumelOut=2797380, '\n"
        "                     'Timeout(ms)=30000) ran for 30085 milliseconds before timing '\n"
        "                     'out.\\n')\n"
        "    sys.stderr.flush()\n"
        "    os.abort()\n"
        "time.sleep(60)\n")
    proc = _two_ranks_under_torchrun(tmp_path, script)
    assert proc.returncode != 0 and "exitcode  : -6" in proc.stderr, proc.stderr
    scratch = Scratch(tmp_path / "scratch")
    scratch.root.mkdir()
    scratch.beat(1).write_text("train epoch 2 step 7")
    killed = torchrun_root_cause(proc.stderr)
    job.find_root_cause(proc.stderr, scratch, killed)
    assert scratch.root_cause.read_text() == (
        "timeout: rank 1: NCCL's watchdog ended its ALLREDUCE after 30 s (--timeout): a rank "
        "stopped taking part [in train epoch 2 step 7]\n")
    # a rank that raised said more than the watchdog can: its own error comes first
    scratch.write_error(0, RankError("RuntimeError: boom [in train epoch 2 step 7]", False, ""))
    job.find_root_cause(proc.stderr, scratch, killed)
    assert scratch.root_cause.read_text().startswith("rank 1 was killed by signal 6 (SIGABRT)")


def _spawned_by_bench(tmp_path: Path, ranks: str) -> subprocess.CompletedProcess:
    """Two processes running ``rank(index, folder)`` (defined in ``ranks``, a script's text)
    started by bench's own mp.spawn launcher; it prints its exit code and the cause it wrote."""
    script = tmp_path / "spawned.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from bench.launch.job import Launch\n"
        "from bench.launch.spawn import spawn_ranks\n"
        "from bench.train.scratch import RankError, Scratch\n"
        f"{ranks}"
        "if __name__ == '__main__':\n"
        "    scratch = Scratch(Path(sys.argv[1]))\n"
        "    scratch.root.mkdir()\n"
        "    run = Launch(Path('unused'), 2, 0, 1, scratch, timeout=60)\n"
        "    rc = spawn_ranks(rank, (sys.argv[1],), run)\n"
        "    cause = scratch.root_cause\n"
        "    print(rc, cause.read_text() if cause.exists() else 'no cause\\n', end='')\n")
    return subprocess.run([sys.executable, str(script), str(tmp_path / "scratch")],
                          capture_output=True, text=True, timeout=120)


def test_a_collective_nccls_watchdog_ended_is_named_under_mp_spawn(tmp_path):
    """Ranks bench spawns itself (ddp-spawn) write to stderr it passes on, not to a launcher's:
    the watchdog's line, written from C++ to file descriptor 2 before the rank aborts, must
    still reach the terminal and make the cause a timeout, not 'killed by signal 6'. Real
    mp.spawn, two processes: rank 0 logs the line and aborts, rank 1 waits (the stopped peer)."""
    proc = _spawned_by_bench(
        tmp_path,
        "def rank(index, folder):\n"
        "    Scratch(Path(folder)).beat(index).write_text('train epoch 3 step 2')\n"
        "    if index == 0:\n"
        "        os.write(2, b'[rank0]:[E1125 16:12:38.000000000 ProcessGroupNCCL.cpp:697] '\n"
        "                    b'[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught '\n"
        "                    b'collective operation timeout: WorkNCCL(SeqNum=12, '\n"
        "                    b'OpType=_ALLGATHER_BASE, NumelIn=10, NumelOut=20, '\n"
        "                    b'Timeout(ms)=20000) ran for 20012 milliseconds before timing '\n"
        "                    b'out.\\n')\n"
        "        os.abort()\n"
        "    time.sleep(60)\n")
    assert proc.stdout == (
        "1 timeout: rank 0: NCCL's watchdog ended its _ALLGATHER_BASE after 20 s (--timeout): a "
        "rank stopped taking part [in train epoch 3 step 2]\n"), proc.stderr
    assert "Watchdog caught collective operation timeout" in proc.stderr  # passed on


def test_a_killed_rank_is_named_when_mp_spawn_finds_the_peer_that_exited_first(tmp_path):
    """Real mp.spawn, two processes: rank 1 is SIGKILLed, and rank 0, which says its error
    (a broken collective) and exits with 1, ends before bench's launcher looks again (it is
    stopped meanwhile, as a busy machine may leave it). torch finds both in one wait and
    names the lowest rank; the run must still name rank 1 and its signal."""
    proc = _spawned_by_bench(
        tmp_path,
        "def rank(index, folder):\n"
        "    scratch = Scratch(Path(folder))\n"
        "    scratch.beat(index).write_text('train epoch 1 step 3')\n"
        "    pid_file = scratch.root / 'pid-1'\n"
        "    if index == 1:\n"
        "        while not (scratch.root / 'launcher-stopped').exists():\n"
        "            time.sleep(0.01)\n"
        "        pid_file.with_suffix('.tmp').write_text(str(os.getpid()))\n"
        "        pid_file.with_suffix('.tmp').rename(pid_file)\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    launcher = os.getppid()\n"
        "    os.kill(launcher, signal.SIGSTOP)\n"
        "    (scratch.root / 'launcher-stopped').touch()\n"
        "    while not pid_file.exists():\n"
        "        time.sleep(0.01)\n"
        "    stat = Path(f'/proc/{pid_file.read_text()}/stat')\n"
        "    while stat.read_text().rsplit(')', 1)[1].split()[0] != 'Z':\n"
        "        time.sleep(0.001)\n"
        "    scratch.write_error(0, RankError('RuntimeError: Connection reset by peer [in "
        "train epoch 1 step 3]', False, ''))\n"
        "    subprocess.Popen(['sh', '-c', f'sleep 0.5; kill -CONT {launcher}'])  # once gone\n"
        "    os._exit(1)\n")
    assert proc.stdout == (
        "1 rank 1 was killed by signal 9 (SIGKILL) [in train epoch 1 step 3]\n"), proc.stderr


def test_kill_9_of_a_rank_ends_its_loader_workers_at_once():
    """torch's own watchdog ends a dead rank's DataLoader workers only between batches (1 to 5
    s after a kill -9 here; after an out-of-memory kill some were still waiting a minute
    later): each worker arms its death signal. `bench loader` draws in bench's own process."""
    cmd = [sys.executable, "-m", "bench", "loader", "--cpu", "--data", "synthetic",
           "--train-limit", "2048", "--batch-size", "32", "--workers", "2", "--steps",
           "10000000", "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(workers := descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers) == 2, "its two loader workers never started"
        time.sleep(3)  # drawing batches
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not still_running(workers, within=1), "a loader worker outlived its rank by 1 s"
    finally:
        for pid in (proc.pid, *workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.serial  # its delays aim at start-up phases timed on an idle machine
@pytest.mark.parametrize("strategy, delay", [
    ("ddp", 0.0), ("ddp", 2.5), ("ddp-spawn", 2.0), ("ddp-launch", 1.5),
])
def test_kill_9_during_start_up_leaves_nothing_running(strategy, delay, tmp_path):
    """kill -9 while the ranks are being started, import torch or meet: 0 s after the
    record appears (no rank yet), then later (importing, rendezvous). Every process the run
    had started dies with it: the ranks arm their death signal before importing torch, and
    check that their parent still is the one that started them."""
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", strategy, "--gpus", "2",
           *SMALL, "--output", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("runs/*.json")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(tmp_path.glob("runs/*.json")), "bench run wrote no record"
    time.sleep(delay)
    tree = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = still_running(tree)
    assert not left, f"{len(left)} of {len(tree)} processes still running 10 s later: {left}"


_SIGNAL_DURING_FORK = """
import os, signal, subprocess, sys, time
from bench.tools.lifetime import start_dying_with_me
child = start_dying_with_me(["grep", "SigBlk", "/proc/self/status"], stdout=subprocess.PIPE)
print(child.communicate()[0].decode(), flush=True)
# The moment a Ctrl-C was lost: a signal landing in an at-fork hook run by Popen.
os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
try:
    start_dying_with_me(["true"])
    time.sleep(2)
    print("the Ctrl-C was lost")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_ctrl_c_while_a_child_starts_is_not_lost_and_the_child_can_be_signalled():
    """Ctrl-C right as bench started its launcher was swallowed ("Exception ignored in
    _releaseLock") and the run trained on; the child must not inherit the held signals."""
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_DURING_FORK], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    words = proc.stdout.split()
    assert words[-1] == "interrupted", proc.stdout + proc.stderr
    blocked = int(words[words.index("SigBlk:") + 1], 16)
    assert blocked & (1 << (signal.SIGINT - 1)) == 0, proc.stdout
    assert blocked & (1 << (signal.SIGTERM - 1)) == 0, proc.stdout


def test_kill_9_of_bench_probe_leaves_nothing_running_and_the_next_probe_clears_its_folder(
        tmp_path):
    """The probe's torchrun keeps its files in a scratch folder of the probe's own, which a
    probe killed outright cannot remove: the next probe (or run) does."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    probe = [sys.executable, "-m", "bench", "probe", "--cpu", "--gpus", "2", "--width", "0.125",
             "--output", str(tmp_path / "out")]
    proc = subprocess.Popen([*probe, "--max-size", "256"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(tmp.glob("bench-*/torchrun/*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    folders = list(tmp.glob("bench-*"))
    assert folders, "the probe's torchrun never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = _gone_within(10, str(tmp_path / "out"))  # in every rank's command line
    assert not left, f"still running 10 s after kill -9 of bench probe: {left}"
    assert folders[0].is_dir()  # nobody removed it yet
    # A torchrun agent that outlives its run's clean-up can make its log folder again: no
    # launcher file names an owner then. Such a folder goes once 10 minutes old; one that
    # young (being created) stays, and so does a folder bench did not name.
    remade, young, other = (tmp / name for name in (
        "bench-20261125T151809Z-ddp-2cpu-b182d3-edqtl2a4",
        "bench-20261125T151810Z-ddp-2cpu-c293e4-fer3m5b6", "bench-results"))
    for folder in (remade, young, other):
        (folder / "torchrun" / "none_bxhfgs8i").mkdir(parents=True)
    for folder in (remade, other):
        os.utime(folder, (time.time() - 601, time.time() - 601))
    again = subprocess.run([*probe, "--max-size", "0.01"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(tmp.glob("bench-*")) == [young, other]


def _wait_for_processes(out: Path, kind: str, count: int, never: str) -> None:
    """Until ``count`` processes of ``kind`` name ``out`` in their command line (60 s)."""
    deadline = time.monotonic() + 60
    while len([line for line in alive(str(out)) if kind in line]) < count:
        assert time.monotonic() < deadline, never
        time.sleep(0.1)


def test_kill_9_of_a_two_node_probe_waiting_for_its_peer_ends_its_agent(tmp_path):
    """Node 0 of a 2-node probe whose peer never comes: torchrun's agent waits in the
    rendezvous (for minutes). It was started as a plain child and outlived bench's kill -9."""
    from bench.tools.ports import free_port

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "probe", "--cpu", "--gpus", "1", "--nodes", "2",
         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--width", "0.125",
         "--output", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_processes(out, "bench.launch.agent", 1, "the probe's agent never started")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    left = _gone_within(10, str(out))  # in the agent's command line
    assert not left, f"still running 10 s after kill -9 of bench probe: {left}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_probe_interrupted_while_its_ranks_measure_ends_them_in_one_line(sig, tmp_path):
    """Ctrl-C (to the terminal's process group) or SIGTERM (to bench) while the ranks
    all-reduce: exit 130 and one line. SIGTERM left both ranks waiting on their dead agent's
    store; Ctrl-C printed torchrun's traceback."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "probe", "--cpu", "--gpus", "2", "--width", "0.125",
         "--output", str(out)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    _wait_for_processes(out, "bench.commands.probe WORKER", 2, "the probe's ranks never started")
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "bench: interrupted", err
    assert "Traceback" not in err, err
    left = _gone_within(10, str(out))
    assert not left, f"still running 10 s after bench probe ended: {left}"
