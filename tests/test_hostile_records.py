"""A record is data: opening a results folder (bench report, bench compare, bench project)
never runs code a record names, and a record that is valid JSON but wrong inside is skipped
with a line naming the file, never a traceback."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.records.schema import RECORD_VERSION
from tests.report_records import probe, record, write_runs

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


def _valid(run_id: str, world: int = 2) -> dict:
    return {**record(run_id, "ddp", world, [2.0, 1.0], [0.1, 0.2]),
            "initial_param_fingerprint": "a", "initial_reference_fingerprint": "a",
            "compute_step_s": 0.5}


# Valid JSON, wrong inside: each was a traceback in report, compare or project.
MALFORMED = {
    "model name a number": {"model": {"name": 5, "width": 1.0}},
    "model width a string": {"model": {"width": "wide"}},
    "dataset a number": {"dataset": 7},
    "ddp_options a string": {"ddp_options": "fast"},
    "epochs a list": {"epochs": [3]},
    "reached without a time": {"reached_target": True, "time_to_target_s": None,
                               "target_top1": 10.0},
    "compute step a string": {"compute_step_s": "0.1"},
    "difficulty a string": {"config": {"synthetic_difficulty": "hard"}},
    "top-1 absurd": {"per_epoch": [{**record("x", "ddp", 2, [2.0], [0.1])["per_epoch"][0],
                                    "top1": 1e308}]},
    "an epoch of 0 s": {"per_epoch": [{**record("x", "ddp", 2, [2.0], [0.1])["per_epoch"][0],
                                       "train_time_s": 0}]},
    "gpu clocks a string": {"per_epoch": [{**record("x", "ddp", 2, [2.0], [0.1])["per_epoch"][0],
                                           "gpu_clocks": "fast"}]},
    "world size 0": {"world_size": 0},
    # counted as a run ('runs 2' with one run's epochs): n of the mean and of the tests
    "an ok run without an epoch": {"per_epoch": []},
    # past 2^63 numpy holds it as an object, which the plots' log scale could not take
    "world size 1e30": {"world_size": 10**30},
    "epochs negative": {"epochs": -3},
    # the verdict divided a row's img/s by the fastest's
    "an epoch of 0 images a second": {
        "per_epoch": [{**record("x", "ddp", 2, [2.0], [0.1])["per_epoch"][0],
                       "images_per_s": 0.0}]},
    "env gpus a string": {"env": {"gpus": "H100"}},
    "DDP bucket size a string": {"ddp_options": {"bucket_cap_mb": "big"}},
    # bench project counted it in bytes: int(infinity)
    "DDP bucket of 1e308 MB": {"ddp_options": {"bucket_cap_mb": 1e308}},
    "comm hook a number": {"ddp_options": {"comm_hook": 3}},
    "profile trace a number": {"profile_trace": -1},
    "ghost BatchNorm a string": {"config": {"ghost_bn": "8"}},
    # JSON's Infinity is read as a float: the learning-rate rule divided by it
    "lr reference batch infinite": {"lr": 0.1, "base_lr": 0.1,
                                    "lr_reference_batch": float("inf")},
    # a newer bench may mean something else by a field: read as this one means it, its
    # figures would be wrong in silence
    "a newer record version": {"record_version": RECORD_VERSION + 1},
    # the report's threads column read it as a number: a list was a traceback
    "threads per process a list": {"threads_per_process": [4]},
    # the projection's validation divided by it
    "a step of 0 s": {"per_epoch": [{**record("x", "ddp", 2, [2.0], [0.1])["per_epoch"][0],
                                     "step_time_p50_s": 0.0}]},
    "a negative compute step": {"compute_step_s": -0.02},
    # an edited speed: its images over its time say otherwise (read, it was the row's img/s)
    "a speed its images and time contradict": {
        "per_epoch": [{**record("x", "ddp", 2, [2.0], [0.1])["per_epoch"][0],
                       "train_images": 1000, "train_time_s": 2.0, "images_per_s": 1e300}]},
}


def test_absurd_figures_that_agree_with_each_other_end_in_no_traceback(tmp_path):
    """Three runs of 1e300 img/s (1,000 images in 1e-297 s: a record consistent with itself)
    beside two plain ones: the tests over repeats summed their squares exactly, in
    fractions, and a variance of 1e600 was an OverflowError in report and compare."""
    def absurd(run_id: str, world: int) -> dict:
        rec = record(run_id, "ddp", world, [2.0, 1.0], [0.1, 0.2])
        for epoch in rec["per_epoch"]:
            epoch.update(train_images=1000, images_per_s=1e300, train_time_s=1000 / 1e300)
        return rec

    results = write_runs(tmp_path / "results", [
        record("plain1", "ddp", 2, [2.0, 1.0], [0.1, 0.2]),
        record("plain2", "ddp", 1, [2.0, 1.0], [0.1, 0.2]),
        absurd("a1", 2), absurd("a2", 2), absurd("a3", 1)])
    for args in (["report", "--results", str(results), "--no-write"],
                 ["compare", str(results), str(results)]):
        proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "skipped" not in proc.stderr, proc.stderr  # a record, read as it is


def test_fields_recorded_as_null_read_as_not_recorded(tmp_path):
    """null is "not recorded" for every optional field, as absent is: a DDP option left null
    is torch's default (a row of its own only where it differs), a null start time sorts
    first, a null note, batch or accumulation is none, a null precision "?". Each was a
    traceback in report (its figures too), compare or project (None formatted as a bucket
    size, multiplied, compared with a string or a number, joined into a label, searched as
    a note) or a row named "None"; so was a gradient timeline of JSON's Infinity steps
    (read as none: the model's own bucket timing is used)."""
    # on CUDA, so that project takes its network from the command line
    cuda = {"device": "cuda", "backend": "nccl",
            "model": {"width": 1.0, "parameters": 11_000_000}}
    null = {**_valid("null"), **cuda, "started_at": None, "per_rank_batch": None, "notes": [None],
            "grad_accum": None, "precision": None, "config": {"synthetic_classes": None},
            "ddp_options": {"bucket_cap_mb": None, "static_graph": None, "comm_hook": None},
            "gradient_timeline": {"steps": float("inf"), "backward_start": 0.5,
                                  "ready": [[10, 0.6], [float("inf"), 0.9]]}}
    for epoch in null["per_epoch"]:
        epoch["step_time_p50_s"] = 0.6  # what --validate predicts
    results = write_runs(tmp_path / "results", [{**_valid("good", 1), **cuda}, null])
    (results / "probes").mkdir()
    (results / "probes" / "p.json").write_text(json.dumps(probe("p", "cuda", 10.0)))
    for args in (["report", "--results", str(results), "--no-write"],
                 ["report", "--results", str(results)],  # its figures too
                 ["compare", str(results), str(results)],
                 ["project", str(results), "--intra-busbw", "10", "--inter-busbw", "5"],
                 ["project", str(results), "--intra-busbw", "10", "--inter-busbw", "5",
                  "--validate"]):
        proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "skipped" not in proc.stderr and "None" not in proc.stdout, proc.stdout
        rows = [line.split()[:2] for line in proc.stdout.splitlines()]
        assert ["ddp", "2"] in rows or ["ddp", "fp32"] in rows or ["ddp", "x1"] in rows, (
            args, proc.stdout)
        if args[0] == "report":  # the row names no bucket size: the default's
            assert "bucket" not in proc.stdout, proc.stdout


def test_a_failed_run_without_its_reason_beside_one_with_it_reads_no_nan(tmp_path):
    """pandas holds a text column's null as NaN where other rows have text: a failed run
    that recorded no error, beside one that did, was 'failed: nan' under its row."""
    runs = [record("ok", "ddp", 2, [2.0, 1.0], [0.1, 0.2]),
            record("said", "horovod", 2, [], [], status="failed", error="rank 0: boom"),
            record("unsaid", "fsdp", 2, [], [], status="failed", error=None)]
    proc = subprocess.run([*BENCH, "report", "--results", str(write_runs(tmp_path, runs)),
                           "--no-write"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "failed: rank 0: boom" in proc.stdout and "nan" not in proc.stdout.lower(), (
        proc.stdout)


def test_a_row_whose_batchnorm_is_not_recorded_is_compared_as_not_recorded(tmp_path):
    """Two rows that differ in BatchNorm only, one of them not recorded: compare's BN column
    named it 'nan'."""
    sides = []
    for side in ("a", "b"):
        rows = [record(f"{side}1", "ddp", 2, [2.0, 1.0], [0.1, 0.2]),
                {**record(f"{side}2", "ddp", 2, [2.0, 1.0], [0.1, 0.2]), "norm": None}]
        sides.append(str(write_runs(tmp_path / side, rows)))
    proc = subprocess.run([*BENCH, "compare", *sides], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    cells = [line.split()[2] for line in proc.stdout.splitlines() if line.startswith("ddp ")]
    assert cells == ["per-replica-bn", "—"], proc.stdout


def test_a_side_that_did_not_say_its_torch_is_compared_as_not_said_in_strict_json(tmp_path):
    """B's fsdp run recorded no torch where its ddp run did: compare's torch cell read
    'x→nan', and its JSON held a bare NaN, which strict readers (jq) refuse."""
    a = write_runs(tmp_path / "a", [record("a1", "ddp", 2, [2.0, 1.0], [0.1, 0.2]),
                                    record("a2", "fsdp", 2, [2.0, 1.0], [0.1, 0.2])])
    untold = record("b2", "fsdp", 2, [2.0, 1.0], [0.1, 0.2])
    untold["env"] = {k: v for k, v in untold["env"].items() if k != "torch"}
    told = record("b1", "ddp", 2, [2.0, 1.0], [0.1, 0.2])
    told["env"] = {**told["env"], "torch": "2.15.0"}
    b = write_runs(tmp_path / "b", [told, untold])
    text = subprocess.run([*BENCH, "compare", str(a), str(b)], capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    cells = {line.split()[0]: line.split()[-2] for line in text.stdout.splitlines()
             if line.startswith(("ddp ", "fsdp "))}
    assert cells == {"ddp": "x→2.15.0", "fsdp": "x→?"}, text.stdout
    out = subprocess.run([*BENCH, "compare", str(a), str(b), "--format", "json"],
                         capture_output=True, text=True, timeout=120).stdout

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    rows = json.loads(out, parse_constant=refuse)
    assert sorted(str(r["torch_b"]) for r in rows) == ["2.15.0", "None"], rows


def test_committed_records_with_every_optional_field_null_are_read(tmp_path):
    """The committed CPU table's ddp N=1 and N=2 records, and copies of them with every field
    but the five a record must hold made null (a dict's fields each null): report (its
    figures and HTML page too), compare, project and its validation read them all, with no
    traceback and no row, workload or machine named "None"."""
    root = Path(__file__).resolve().parents[1] / "results"
    required = {"run_id", "status", "strategy", "world_size", "per_epoch"}
    results = tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    (results / "probes").mkdir()
    (probe_file,) = (root / "probes").glob("20261124T065755Z-*.json")
    (results / "probes" / probe_file.name).write_text(probe_file.read_text())
    for name in ("20261124T065801Z-ddp-1cpu-bf6bca", "20261124T065958Z-ddp-2cpu-01dce7"):
        rec = json.loads((root / "runs" / f"{name}.json").read_text())
        null = {k: v if k in required else dict.fromkeys(v) if isinstance(v, dict) else None
                for k, v in rec.items()}
        null["run_id"] += "-null"
        (results / "runs" / f"{name}.json").write_text(json.dumps(rec))
        (results / "runs" / f"{name}-null.json").write_text(json.dumps(null))
    for args in (["report", "--results", str(results), "--html", str(tmp_path / "r.html")],
                 ["compare", str(results), str(results)],
                 ["project", str(results), "--network", "probe"],
                 ["project", str(results), "--network", "probe", "--validate"]):
        proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "skipped" not in proc.stderr and "None" not in proc.stdout, (args, proc.stdout)
    for page in (tmp_path / "r.html", results / "summary.md"):  # the machines it names too
        assert "None" not in page.read_text(), page


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_record_is_skipped_with_its_reason(case, tmp_path):
    results = write_runs(tmp_path / "results", [_valid("good"), _valid("good2", 1)])
    bad = {**_valid("bad"), **MALFORMED[case]}
    (results / "runs" / "bad.json").write_text(json.dumps(bad))
    (results / "runs" / "foreign.json").write_text(json.dumps({"name": "not ours", "n": [1]}))
    for args in (["report", "--results", str(results), "--no-write"],
                 ["compare", str(results), str(results)],
                 ["project", str(results), "--intra-busbw", "10", "--inter-busbw", "5"]):
        proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, (args[0], proc.stderr)
        # (project: 2 where the good records hold nothing it projects, as for any folder)
        assert proc.returncode in ((0, 2) if args[0] == "project" else (0,)), proc.stderr
        skipped = [line for line in proc.stderr.splitlines() if "skipped" in line]
        assert any("bad.json" in line for line in skipped), (args[0], proc.stderr)
        assert any("foreign.json" in line for line in skipped), (args[0], proc.stderr)
    # named alone, it is bad input
    proc = subprocess.run([*BENCH, "compare", str(results / "runs" / "bad.json"),
                           str(results)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "bad.json" in proc.stderr


@pytest.mark.parametrize("figures, fields", [
    *((change, {}) for change in (
        {"bytes": 0}, {"time_s": 0}, {"busbw_GBps": -1}, {"busbw_GBps": "fast"}, {"bytes": None},
        # the largest message (1 GiB) faster than the smallest (1 KiB): bench project
        # divided by 0
        {"bytes": 2**30, "time_s": 1e-6},
        # the mean call, kept beside the median: the report's and project's readers
        # read every figure of a result
        {"time_mean_s": 0}, {"time_mean_s": "x"})),
    # the report matched runs to it by nodes: a list was a traceback; bench project read
    # the gradient's size and the machine's name from them
    *(({}, change) for change in ({"nodes": [1, 2]}, {"nodes": 0}, {"gradient_bytes": "x"},
                                  {"env": 3}, {"backend": 1})),
    # what overlap costs, as bench project reads it: 1 + a slowdown of -1 or less divides
    # by zero or runs time backwards
    *(({}, {"contention": change}) for change in (
        3, {"compute_slowdown": "x"}, {"compute_slowdown": -1.0},
        {"compute_slowdown": 0.2, "comm_slowdown": float("inf")})),
])
def test_a_probe_with_impossible_figures_is_skipped_with_its_reason(figures, fields, tmp_path):
    from tests.report_records import probe

    results = write_runs(tmp_path / "results", [_valid("good"), _valid("good2", 1)])
    bad = probe("bad", "cpu", 1.0)
    bad["results"][1].update(figures)
    bad.update(fields)
    (results / "probes").mkdir()
    (results / "probes" / "bad.json").write_text(json.dumps(bad))
    for args in (["report", "--results", str(results), "--no-write"],
                 ["project", str(results), "--network", "probe"],
                 ["project", str(results), "--validate"]):
        proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "skipped" in proc.stderr and "probes/bad.json" in proc.stderr, (args, proc.stderr)


def test_two_records_of_one_run_are_counted_once(tmp_path):
    results = write_runs(tmp_path / "results", [_valid("one"), _valid("single", 1)])
    (results / "runs" / "one-copy.json").write_text((results / "runs" / "one.json").read_text())
    proc = subprocess.run([*BENCH, "report", "--results", str(results), "--format", "csv",
                           "--no-write"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "run one is already" in proc.stderr, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [row["runs"] for row in rows if row["world_size"] == "2"] == ["1"], proc.stdout


def test_a_writers_temporary_file_is_never_read_as_a_record(tmp_path):
    """pathlib's `*.json` matches hidden names: a record's temporary file (half written by a
    rank killed mid-write) must neither count nor be warned about as a record."""
    results = write_runs(tmp_path / "results", [_valid("one"), _valid("single", 1)])
    runs = results / "runs"
    (runs / ".one.json.4242.x1y2.tmp").write_text('{"run_id": "one", "stat')
    (runs / ".old-style.json").write_text(json.dumps(_valid("one")))
    proc = subprocess.run([*BENCH, "report", "--results", str(results), "--format", "csv",
                           "--no-write"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "skipped" not in proc.stderr, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert sorted(row["runs"] for row in rows) == ["1", "1"], proc.stdout


# What a terminal obeys: clear the screen, paint red, set the window title, move up a line
# (to write over one), right-to-left override.
ESCAPES = "\x1b[2J\x1b[31m\x1b]0;owned\x07\x1b[1A\u202e\x9b"


def test_a_records_text_prints_as_text_never_as_terminal_commands(tmp_path):
    """A record is data someone else may have written. Its CPU name, tag and error, and a
    file's name, reached the terminal as they were: `bench report` on a crafted record
    cleared the screen and set the window's title. Every control character is written
    out (\\x1b), in report, compare and project alike."""
    evil = {**_valid("evil"), "env": {"cpu": f"Test{ESCAPES}", "cpu_count": 2, "torch": "x",
                                      "python": "3"}}
    failed = {**_valid("failed", 1), "status": "failed", "error": f"boom{ESCAPES}\nfake ok",
              "strategy": "fsdp"}
    results = write_runs(tmp_path / "results", [evil, failed])
    (results / "runs" / f"x{ESCAPES[:4]}.json").write_text("{not json")
    for args in (["report", "--results", str(results), "--no-write"],
                 ["report", "--results", str(results), "--no-write", "--format", "wide"],
                 ["compare", str(results), str(results)],
                 ["project", str(results), "--intra-busbw", "10", "--inter-busbw", "5"]):
        proc = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        shown = proc.stdout + proc.stderr
        assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", shown), (args, shown)
        assert "\\x1b[2J" in shown, (args, shown)  # said, as text
        assert "\nfake ok" not in shown, (args, shown)


def test_a_dollar_in_a_records_text_is_drawn_as_text_not_parsed_as_a_formula(tmp_path):
    """matplotlib reads '$...$' in a label as a formula: a record whose model, CPU name or
    tag held a '$' (a folder named so, a crafted record) ended `bench report` and `bench
    project --plot` in its parser's traceback ('Expected {phantom | llap ...}'), and the
    page was never written. Every text of bench's figures is plain; the log axis of the
    all-reduce figure says 2²⁰ in plain text, not as a formula."""
    dollar = "my$^$models:net"  # (an even count of '$': an odd one is not parsed)
    recs = [{**_valid(f"d{world}", world),
             "model": {"name": dollar, "width": 1.0, "parameters": 11_000_000},
             "tag": dollar, "env": {"cpu": "Test $\\frac{$", "cpu_count": 2, "torch": "x",
                                     "python": "3"}} for world in (1, 2)]
    results = write_runs(tmp_path / "results", recs)
    (results / "probes").mkdir()
    (results / "probes" / "p.json").write_text(json.dumps(
        {**probe("p1", "cpu", 1.0), "model": dollar}))
    page = results / "page.html"
    proc = subprocess.run([*BENCH, "report", "--results", str(results), "--html", str(page)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(list((results / "plots").rglob("busbw.png"))) == 1
    html = page.read_text()
    assert "2²⁰" in html and "mathdefault" not in html  # the probe's 1 MiB, in plain text
    assert "my$^$models:net" in html
    plot = tmp_path / "projection.png"
    proc = subprocess.run([*BENCH, "project", str(results), "--intra-busbw", "10",
                           "--inter-busbw", "5", "--plot", str(plot)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert plot.stat().st_size > 0


def test_a_workload_named_past_a_file_names_length_is_drawn_in_a_folder_that_fits(tmp_path):
    """The plots of a workload go in a folder named after it: a CPU (or ImageFolder) name of
    some 300 characters made a name past the file system's 255 bytes, and the report ended
    ('cannot write ... (File name too long): write elsewhere', which could not help). A long
    name keeps its start and a hash of the whole, so two such workloads stay apart."""
    from bench.report.plots import workload_slug

    long_cpu = "Very Long Processor Name " * 25
    rec = {**_valid("long", 1), "env": {"cpu": long_cpu, "cpu_count": 2, "torch": "x",
                                         "python": "3"}}
    results = write_runs(tmp_path / "results", [rec])
    proc = subprocess.run([*BENCH, "report", "--results", str(results)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    [folder] = (results / "plots").iterdir()
    assert len(folder.name) <= 120 and any(folder.glob("*.png")), folder.name
    a, b = workload_slug(long_cpu + " A"), workload_slug(long_cpu + " B")
    assert a != b and len(a) == len(b) <= 120
    assert workload_slug("synthetic d=1 50000 img, batch 512, resnet18") == (
        "synthetic-d1-50000img-batch512-resnet18")  # short names as they were


def test_an_imagefolder_named_like_a_count_keeps_its_name_in_the_plot_folder():
    """The plot folder joined every ' img' and 'batch ' of the workload's name: an ImageFolder
    named 'imgs' was drawn in 'imagefolderimgs-38img-...', its name run into the data's."""
    from bench.report.plots import workload_slug

    assert workload_slug("imagefolder imgs 38 img, batch 8, resnet18 x0.125") == (
        "imagefolder-imgs-38img-batch8-resnet18-x0_125")
    assert workload_slug("imagefolder batches 6 img, batch 2, resnet18") == (
        "imagefolder-batches-6img-batch2-resnet18")
