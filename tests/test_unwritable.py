"""Every writer survives a read-only or full file system: one line naming the file, why and
the fix; the old file kept, never a cut or empty one, no temporary file left; a run's record
closed even when the disk filled during the run; an MLPerf log that cannot be written is a
warning, never the run's end. The file systems are real: a small tmpfs mounted for the test,
filled or remounted read-only (root only; skipped elsewhere with the reason)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, messages, only_record

from tests.report_records import record, write_runs

TINY = ["--cpu", "--data", "synthetic", "--train-limit", "128", "--test-limit", "32",
        "--width", "0.125", "--batch-size", "32", "--no-progress", "--comm-probe-steps", "0"]


@contextlib.contextmanager
def _tmpfs(where: Path, size: str = "4m"):
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: Path) -> None:
    """Fill the file system of FOLDER to its last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (65536, 512, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)


def _read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def _bench(*args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, timeout=timeout,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def _one_error_line(proc, path_part: str, why: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("bench: error:")]
    assert len(errors) == 1, proc.stderr
    assert path_part in errors[0] and why in errors[0], errors[0]


def _temporaries(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if ".tmp" in p.name]


def _records(folder: Path) -> Path:
    recs = [{**record(f"r{i}", s, n, [2.0, 1.0 * n], [0.1, 0.2]),
             "initial_param_fingerprint": "a", "initial_reference_fingerprint": "a"}
            for i, (s, n) in enumerate([("ddp", 1), ("ddp", 2)])]
    return write_runs(folder, recs)


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_report_on_an_unwritable_folder_is_one_line_and_keeps_the_old_files(how, tmp_path):
    with _tmpfs(tmp_path / "fs") as fs:
        results = _records(fs / "results")
        assert _bench("report", "--results", str(results)).returncode == 0
        before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
        assert any(p.suffix == ".png" for p in before)
        (results / "runs" / "r2.json").write_text(json.dumps(
            {**record("r2", "ddp", 4, [2.0, 0.6], [0.1, 0.2])}))
        before[results / "runs" / "r2.json"] = (results / "runs" / "r2.json").read_bytes()
        _read_only(fs) if how == "read-only" else _fill(fs)
        proc = _bench("report", "--results", str(results))
        _one_error_line(proc, str(results), "Read-only file system" if how == "read-only"
                        else "No space left on device")
        assert "ddp" in proc.stdout  # the table itself was printed
        after = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
        assert after == before  # every old file whole, nothing added
        assert not _temporaries(results)


def test_bench_slurm_on_a_full_disk_writes_no_empty_script(tmp_path):
    with _tmpfs(tmp_path / "fs", "64k") as fs:
        _fill(fs)
        proc = _bench("slurm", "--strategy", "ddp", "--nodes", "1", "--gpus", "1",
                      "--out", str(fs / "job.sbatch"), "--epochs", "1")
        _one_error_line(proc, "job.sbatch", "No space left on device")
        assert not (fs / "job.sbatch").exists() and not _temporaries(fs)


def test_bench_sweep_on_a_full_disk_is_one_line_and_leaves_no_claim(tmp_path):
    with _tmpfs(tmp_path / "fs") as fs:
        (fs / "out" / "runs").mkdir(parents=True)
        _fill(fs)
        proc = _bench("sweep", "--strategies", "ddp", "--gpus", "1", *TINY, "--epochs", "1",
                      "--output", str(fs / "out"))
        _one_error_line(proc, "out", "No space left on device")
        claims = fs / "out" / "runs" / ".claims"
        assert not (claims.exists() and any(claims.iterdir()))
        assert not _temporaries(fs)


def test_a_disk_that_fills_during_the_run_still_gets_the_record_closed(tmp_path):
    """The run fails in one line and its record says `failed` (it stayed `running`); the
    report on that full disk is one line too, after its table."""
    with _tmpfs(tmp_path / "fs", "8m") as fs:
        out = fs / "out"
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench", "run", "--strategy", "ddp", "--gpus", "2", *TINY,
             "--epochs", "400", "--output", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while not (list(out.glob("runs/*.json")) and json.loads(
                    next(out.glob("runs/*.json")).read_text()).get("per_epoch")):
                assert time.monotonic() < deadline and proc.poll() is None, "no epoch recorded"
                time.sleep(0.2)
            _fill(fs)
            text, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:  # the test failed: the run must not train on
                proc.kill()
                proc.wait()
        assert proc.returncode == 1, text[-2000:]
        assert "Traceback" not in text, text[-3000:]
        assert "No space left on device" in text.strip().splitlines()[-1], text[-2000:]
        rec = only_record(out)
        assert rec["status"] == "failed" and "No space left on device" in rec["error"], rec
        assert not list((out / "runs").glob(".*"))  # no reserve, no temporary file
        _fill(fs)  # the reserve the run freed to close its record
        report = _bench("report", "--results", str(out))
        _one_error_line(report, str(out), "No space left on device")


def test_a_stale_reserve_is_cleared_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    stale = out / "runs" / ".20990101T000000Z-ddp-1cpu-abcdef.reserve"
    stale.write_bytes(b"\0" * 1024)
    proc = _bench("run", "--strategy", "ddp", "--gpus", "1", *TINY, "--epochs", "1",
                  "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and not list((out / "runs").glob(".*.reserve"))


def test_an_mllog_that_cannot_be_written_is_a_warning_not_the_runs_end(tmp_path):
    pytest.importorskip("mlperf_logging", reason="the mlperf-logging package is not installed")
    with _tmpfs(tmp_path / "fs", "64k") as fs:
        log = fs / "run.log"
        shutil.copyfile(os.devnull, log)
        _fill(fs)
        log.unlink()  # room for the empty file --mllog opens, not for what goes in it
        out = tmp_path / "out"
        proc = _bench("run", "--strategy", "ddp", "--gpus", "2", *TINY, "--epochs", "2",
                      "--target-top1", "1", "--mllog", str(log), "--output", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr
        warnings = [said for said in messages(proc.stderr) if "MLPerf log" in said]
        assert len(warnings) == 1 and "No space left on device" in warnings[0], proc.stderr
        rec = only_record(out)
        assert rec["status"] == "ok" and len(rec["per_epoch"]) == 2
        assert any("MLPerf log" in note and "incomplete" in note for note in rec["notes"])


def test_a_file_named_through_a_link_or_a_pipe_is_written_there_not_replaced(tmp_path):
    """Every writer renamed a temporary file over the path it was given: a link (report.html
    -> the page a web server serves) became a file and what it named kept its old text; a
    pipe or a device became a regular file, and `bench slurm --out /dev/stdout` as root
    (the folder /dev is root's to write) would have made /dev/stdout, for every process of
    the machine, a file. A link is written where it leads, a pipe or a device into."""
    served = tmp_path / "served.html"
    served.write_text("old page")
    link = tmp_path / "report.html"
    link.symlink_to(served)
    results = write_runs(tmp_path / "results", [record("a", "ddp", 1, [2.0, 1.0], [0.1, 0.2])])
    proc = subprocess.run([sys.executable, "-m", "bench", "report", str(results), "--no-write",
                           "--html", str(link)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and served.read_text().startswith("<!DOCTYPE html>")

    fifo = tmp_path / "job.sbatch"
    os.mkfifo(fifo)
    end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: the writer's open returns
    script = [sys.executable, "-m", "bench", "slurm", "--strategy", "ddp", "--cpu",
              "--nodes", "1", "--gpus", "2"]
    try:
        proc = subprocess.run([*script, "--out", str(fifo)], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        got = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(end, 65536):
                got += chunk
    finally:
        os.close(end)
    assert proc.returncode == 0, proc.stderr
    assert fifo.is_fifo(), "the pipe was replaced by a file"
    assert got.startswith(b"#!/bin/bash\n#SBATCH"), got

    stdout = tmp_path / "out.sbatch"
    stdout.symlink_to("/proc/self/fd/1")  # what /dev/stdout is
    proc = subprocess.run([*script, "--out", str(stdout)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n#SBATCH") and stdout.is_symlink(), proc.stdout
