"""A record is data: opening a results folder (bench report, bench compare, bench project)
never runs code a record names, and a record that is valid JSON but wrong inside is skipped
with a line naming the file, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report_records import record, write_runs

BENCH = [sys.executable, "-m", "bench"]


def _crafted(run_id: str, model: str) -> dict:
    """A record that names MODEL and has a start fingerprint without its reference: the
    report once rebuilt the named model to draw the reference."""
    rec = record(run_id, "ddp", 2, [2.0, 1.0], [0.1, 0.2])
    rec["model"] = {"name": model, "width": 1.0, "num_classes": 100, "image_size": 32}
    rec["initial_param_fingerprint"] = "a" * 40
    rec["seed"] = 0
    return rec


@pytest.mark.parametrize("command", ["report", "compare", "project"])
def test_a_crafted_record_runs_no_code(command, tmp_path):
    marker = tmp_path / "ran"
    # 1. a module on the reader's PYTHONPATH whose "factory" leaves a mark
    code = tmp_path / "code"
    code.mkdir()
    (code / "evil_factory.py").write_text(
        f"import pathlib\ndef make(n):\n    pathlib.Path({str(marker)!r}).write_text('factory')\n")
    # 2. os:system, called with the class count: runs the command "100" found on PATH
    (code / "100").write_text(f"#!/bin/sh\necho system > {marker}\n")
    (code / "100").chmod(0o755)
    results = write_runs(tmp_path / "results", [_crafted("r1", "evil_factory:make"),
                                                 _crafted("r2", "os:system")])
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{Path.cwd()}",
           "PATH": f"{code}{os.pathsep}{os.environ['PATH']}"}
    args = {"report": ["report", "--results", str(results), "--no-write"],
            "compare": ["compare", str(results), str(results)],
            "project": ["project", str(results)]}[command]
    proc = subprocess.run([*BENCH, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert not marker.exists(), f"{command} ran code a record named: {marker.read_text()}"
    assert "Traceback" not in proc.stderr, proc.stderr
    if command == "report":
        assert proc.returncode == 0, proc.stderr
        # the start is unknown (no reference was written), never ✓ nor ✗
        table = [line for line in proc.stdout.splitlines() if "ddp" in line]
        assert table and not any("✓" in line or "✗" in line for line in table), proc.stdout


def test_the_same_start_is_read_never_drawn():
    """same_start compares two fingerprints the run wrote; without the reference it is
    unknown, whatever the seed and model say."""
    from bench.report.table import same_start

    rec = _crafted("r", "resnet18-cifar")
    assert same_start(rec) is None
    assert same_start({**rec, "initial_reference_fingerprint": "a" * 40}) is True
    assert same_start({**rec, "initial_reference_fingerprint": "b" * 40}) is False
    assert same_start({**rec, "initial_reference_fingerprint": "a" * 40,
                       "initial_replicas_identical": False}) is False


def test_committed_records_carry_their_reference():
    """Every committed record with a start fingerprint has its reference as data (records
    from before the field were given it once, by scripts/add_reference.py, which says so)."""
    runs = sorted(Path("results/runs").glob("*.json"))
    assert runs
    for path in runs:
        rec = json.loads(path.read_text())
        if rec.get("initial_param_fingerprint"):
            assert rec.get("initial_reference_fingerprint"), path
