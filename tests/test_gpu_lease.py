"""scripts/gpu_lease.py: the GPU check as one call of a 15-minute lease. What a lease cannot
afford is checked here on CPU: a plan that does not fit, an item that runs past its stage, and
files that a call cannot bring back (8 at most, 16 MiB each, in one folder, plain names)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import time

from conftest import ROOT

LEASE = ROOT / "scripts" / "gpu_lease.py"
CHECK = ROOT / "scripts" / "gpu_check.sh"
# The device tool's limits (its README): device time per lease, one command, files returned.
LEASE_S, CALL_S = 900, 600
BACK_FILES, BACK_FILE_BYTES = 8, 16 * 2**20


def _lease(*args: str, timeout: float = 300):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([sys.executable, str(LEASE), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def _returnable(back) -> list:
    files = sorted(back.iterdir())
    assert len(files) <= BACK_FILES, files
    for f in files:
        assert f.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f.name), f
        assert f.stat().st_size <= BACK_FILE_BYTES, (f, f.stat().st_size)
    return files


def test_the_plan_fits_one_call_and_runs_every_check_when_the_wheels_are_built(tmp_path):
    """With both wheels built beforehand (make gpu-ready), the plan's builds take seconds,
    its call ends inside one command's limit and the lease inside its 15 minutes with the
    machine's start, and at the check's own estimates no correctness item and none of the
    first timed group is deferred: the budget defers only the table's lesser rows."""
    for tool, key in (("horovod", "torch2.11.0_cu130-gpu-cxx17"),
                      ("apex", "cuda-extensions-x-torch2.11.0_cu130-nvcc13.0-arch9.0")):
        wheel = tmp_path / "built" / tool / key / f"{tool}-1.0-cp312-cp312-linux_x86_64.whl"
        wheel.parent.mkdir(parents=True)
        wheel.write_bytes(b"")
    proc = _lease("--plan", "--deps", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert max(map(len, proc.stdout.splitlines())) <= 120, proc.stdout
    plan = re.sub(r"\n {17}", " ", proc.stdout)  # a long line goes on, indented
    fit = re.search(r"the call ~(\d+)s \(limit 600s\); the lease ~(\d+)s of 900s", plan)
    assert fit, proc.stdout
    assert int(fit.group(1)) <= CALL_S and int(fit.group(2)) <= LEASE_S
    build = re.search(r"^build +~ *(\d+)s .*build_horovod \(wheel torch2.11.0_cu130-gpu-cxx17\); "
                      r"build_apex \(wheel cuda-extensions-", plan, re.M)
    assert build and int(build.group(1)) <= 30, proc.stdout
    rows = re.findall(r"^(checks|timed) +~ *\d+s  ([^:]+): (.*)$", plan, re.M)
    assert [r for r in rows if r[0] == "checks"], proc.stdout
    for stage, name, items in rows:
        if stage == "checks" or name == "timed 1":
            assert "(" not in items, (name, items)  # nothing deferred there
    listed = " ".join(items for _, _, items in rows).split()
    assert {"pytest_gpu", "verify", "n1_horovod", "table_horovod"} <= set(listed)


def test_a_lease_on_cpu_returns_only_files_a_call_can_bring_back(tmp_path):
    """The installed packages stay behind, a profiler trace travels apart, and the records
    and logs come back in one archive beside the summary."""
    work, back = tmp_path / "work", tmp_path / "back"
    (work / "site" / "horovod").mkdir(parents=True)
    (work / "site" / "horovod" / "big.so").write_bytes(os.urandom(2**20))
    (work / "results" / "traces").mkdir(parents=True)
    (work / "results" / "traces" / "r.trace.json").write_text('{"traceEvents": []}')
    proc = _lease("--cpu", "--only", "^model_user$", "--budget", "200", str(work), str(back))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pass  model_user" in proc.stdout
    names = [f.name for f in _returnable(back)]
    assert names == ["check.tar.gz", "summary.txt", "traces.tar.gz"], names
    summary = (back / "summary.txt").read_text()
    assert re.search(r"^pass  model_user \(\d+s\)$", summary, re.M), summary
    with tarfile.open(back / "check.tar.gz") as tar:
        members = tar.getnames()
        (rec,) = [m for m in members if re.fullmatch(r"work/results/runs/.*\.json", m)]
        assert b'"user_models:tiny_cnn"' in tar.extractfile(rec).read()
    assert "work/model_user.log" in members
    assert not [m for m in members if m.startswith("work/site") or m.endswith(".trace.json")]
    with tarfile.open(back / "traces.tar.gz") as tar:
        assert tar.getnames() == ["work/results/traces/r.trace.json"]


def _pack_module():
    spec = importlib.util.spec_from_file_location("gpu_lease", LEASE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_what_would_not_come_back_is_left_out_and_said(tmp_path):
    """A log or traces too large for one returned file: the archive keeps the summaries and
    records, the traces stay behind, and summary.txt says both."""
    work, back = tmp_path / "work", tmp_path / "back"
    (work / "results" / "runs").mkdir(parents=True)
    (work / "results" / "runs" / "r.json").write_text('{"run_id": "r"}')
    (work / "verify.log").write_bytes(os.urandom(BACK_FILE_BYTES + 2**20))
    (work / "summary-all.txt").write_text("pass  verify (99s)\n")
    (work / "results" / "traces").mkdir()
    (work / "results" / "traces" / "r.trace.json").write_bytes(os.urandom(BACK_FILE_BYTES))
    notes = _pack_module().pack(work, back, "gpu lease\n", "nvidia-smi says\n")
    names = [f.name for f in _returnable(back)]
    assert names == ["check.tar.gz", "nvidia-smi.txt", "summary.txt"], names
    with tarfile.open(back / "check.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["work/results/runs/r.json", "work/summary-all.txt"]
    summary = (back / "summary.txt").read_text()
    assert len(notes) == 2 and all(f"note: {n}" in summary for n in notes)
    assert "check.tar.gz is 1" in summary and "traces.tar.gz left out" in summary


def test_an_item_still_running_past_its_budget_is_ended(tmp_path):
    """A stage's items end at its budget plus CHECK_GRACE: a rank that hangs at its first
    step (the item's own limit is 4 x its cost + 120 s: 124 s) is killed 3 s after the 12 s
    budget, and the summary says why."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "n1_ddp.secs").write_text("1")  # as if it had taken 1 s before
    env = {**os.environ, "PYTHON": sys.executable, "CHECK_GRACE": "3",
           "BENCH_FAULT": "hang:0:1"}
    began = time.monotonic()
    proc = subprocess.run(["bash", str(CHECK), "--cpu", "--phase", "core", "--items", "^n1_ddp$",
                           "--budget", "12", str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    took = time.monotonic() - began
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^FAIL  n1_ddp \(killed after \d+s \(3s past the 12s budget\), \d+s, log ",
                     proc.stdout, re.M), proc.stdout
    assert took < 60, took  # the hang would have lasted 124 s
