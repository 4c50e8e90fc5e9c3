"""bench report against hand-computed values from small hand-written records: the
figures, the files it writes, the README table, the records it skips."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_bench
from report_records import record, write_runs

from bench.records.files import load_records
from bench.report import readme_block, summary_table, to_markdown


@pytest.fixture
def results(tmp_path) -> Path:
    recs = [
        # warm-up 9 s is excluded: median of (2, 4, 3) = 3 s
        record("a", "ddp", 1, [9.0, 2.0, 4.0, 3.0], [0.1, 0.2, 0.3, 0.4]),
        # median of (1.0, 2.0) = 1.5 s; img/s median of (1000, 500) = 750
        record("b", "ddp", 2, [5.0, 1.0, 2.0], [0.1, 0.5, 0.45]),
        record("c", "horovod", 2, [], [], status="unavailable", error="no horovod"),
        record("d", "dp", 1, [3.0], [0.2], status="failed", error="rank 0: boom"),
    ]
    runs = write_runs(tmp_path, recs) / "runs"
    (runs / "broken.json").write_text("{ not json")
    (runs / "foreign.json").write_text(json.dumps({"hello": 1}))
    return tmp_path


def test_numbers_match_hand_computation(results):
    records, warnings = load_records(results)
    assert len(records) == 4 and len(warnings) == 2
    table = summary_table(records).set_index(["strategy", "world_size"])
    one, two = table.loc[("ddp", 1)], table.loc[("ddp", 2)]
    assert one["epoch_time_s"] == pytest.approx(3.0)
    # img/s per epoch 1000/t: epochs 2..4 give 500, 250, 333.3 -> median 333.3
    assert one["images_per_s"] == pytest.approx(1000 / 3)
    assert two["epoch_time_s"] == pytest.approx(1.5)
    assert two["images_per_s"] == pytest.approx(750.0)
    assert two["speedup"] == pytest.approx(750.0 / (1000 / 3))
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert two["final_top1"] == pytest.approx(45.0) and two["best_top1"] == pytest.approx(50.0)
    assert one["peak_mem_mib"] == pytest.approx(4.0)
    hvd = table.loc[("horovod", 2)]
    assert hvd["status"] == "unavailable" and hvd["error"] == "no horovod"
    assert math.isnan(hvd["epoch_time_s"])
    assert table.loc[("dp", 1)]["status"] == "failed"


def test_markdown_keeps_failed_and_unavailable_rows(results):
    records, _ = load_records(results)
    md = to_markdown(summary_table(records))
    assert "unavailable: no horovod" in md and "failed: rank 0: boom" in md
    assert "| ddp |" in md


def test_cli_writes_summary_and_plots_and_skips_bad_files(results):
    proc = run_bench("report", "--results", str(results), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert "broken.json" in proc.stderr and "foreign.json" in proc.stderr
    assert proc.stdout.splitlines()[0].startswith("workload,strategy")
    assert (results / "summary.csv").exists() and (results / "summary.md").exists()
    (folder,) = (results / "plots").iterdir()  # one workload: one folder of its plots
    assert folder.name == "synthetic-1000img-batch100-resnet18-on-Test-2-cores"
    for name in ("epoch_time", "scaling", "top1", "time_vs_accuracy"):
        assert (folder / f"{name}.png").stat().st_size > 1000
        assert (folder / f"{name}.svg").exists()
    assert not (folder / "time_to_target.png").exists()  # no run set a target: no empty axis


def test_report_of_a_single_run(tmp_path):
    write_runs(tmp_path, [record("only", "ddp", 2, [2.0], [0.3])])
    proc = run_bench("report", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (folder,) = (tmp_path / "plots").iterdir()
    assert (folder / "top1.png").exists()
    assert not (folder / "scaling.png").exists()  # one world size: nothing to scale


def test_the_folder_is_named_bare_as_bench_compare_and_project_take_it(tmp_path):
    """`bench report r1` (as `bench project r1` and `bench compare a b`) read r1; it was
    refused as 'unrecognized arguments: r1'."""
    write_runs(tmp_path, [record("only", "ddp", 2, [2.0], [0.3])])
    bare = run_bench("report", str(tmp_path), "--no-write", "--format", "csv")
    named = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout == named.stdout and "ddp" in bare.stdout, bare.stdout


def test_readme_table_matches_the_committed_records():
    records, warnings = load_records(ROOT / "results")
    assert records, "results/runs/ must hold the records behind the README table"
    assert not warnings
    readme = (ROOT / "README.md").read_text()
    from bench.records.probes import load_probes

    assert readme_block(records, load_probes(ROOT / "results")) in readme, (
        "run `bench report --update-readme`")


def test_the_readme_has_a_table_per_workload_with_the_columns_that_differ():
    """What every row of a workload shares goes beside its name (a run that never finished
    has no figures and does not stop that), a column without any figure leaves, and with
    one run a row Δ top-1 has no p-value to show. Two workloads: two tables."""
    from bench.report.readme_view import to_markdown_blocks

    records = [record("a", "ddp", 1, [5.0, 2.0], [0.1, 0.30]),
               record("b", "ddp", 2, [5.0, 1.0], [0.1, 0.32]),
               record("c", "horovod", 2, [], [], status="unavailable", error="no horovod"),
               {**record("d", "ddp", 1, [5.0, 2.0], [0.1, 0.3]), "train_size": 2000}]
    text = to_markdown_blocks(summary_table(records))
    lines = text.splitlines()
    headings = [line for line in lines if line.startswith("**")
                and not line.startswith("**Verdict:**")]
    assert headings == ["**synthetic 1000 img, batch 100, resnet18 on Test (2 cores)** — fp32, "
                        "per-replica-bn, runs 1, scaling eff. 100 %",
                        "**synthetic 2000 img, batch 100, resnet18 on Test (2 cores)** — N = 1, "
                        "procs 1, fp32, per-replica-bn, runs 1"], text
    first = lines[lines.index(headings[0]) + 2]
    assert first == ("| strategy | N | procs | epoch time (s) | img/s | speed-up vs N=1 | "
                     "final top-1 (%) | Δ top-1 vs ref | status |"), text
    assert "| horovod | 2 | 2 | — | — | — | — | — | unavailable: no horovod |" in lines
    assert "| ddp | 2 | 2 | 1.00 | 1000 | 2.00× | 32.00 | +2.00 | ok |" in lines


def test_terminal_view_fits_120_columns_one_block_per_workload():
    """The committed results (4 workloads, the GPU one on 2 GPU models, the CPU one on 2 CPU
    models and also over a shaped 1 Gbit/s link, the N = 1…8 accuracy one on 2 CPU models,
    the second its PowerSGD row and reference at 8 seeds): every line of the
    default view fits in 120 characters, each workload on each machine is a block of its
    own, the accum-4 run is told apart from
    the plain N=2 run, and a row that is not ok gives its reason on a line of its own."""
    proc = run_bench("report", "--results", str(ROOT / "results"), "--no-write")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    records, _ = load_records(ROOT / "results")
    workloads = {(r["config"].get("synthetic_difficulty"), tuple(r["env"].get("gpus") or ()),
                  r["env"].get("cpu") if r["device"] == "cpu" else None,
                  r.get("tag") if (r.get("nodes") or 1) > 1 else None)  # the link crossed
                 for r in records}
    headings = [line for line in lines if line.startswith("synthetic")]
    assert len(headings) == len(workloads) == 8
    assert any("accum 4" in line for line in lines)
    assert any(line.startswith("    unavailable: apex AMP needs CUDA") for line in lines)
    wide = run_bench("report", "--results", str(ROOT / "results"), "--no-write",
                     "--format", "wide")
    assert "ideal all-reduce / step (ms)" in wide.stdout.splitlines()[0]


def test_rows_with_many_options_keep_to_120_columns_with_every_column(tmp_path):
    """A row of many DDP options ('static graph,find unused,no buffer broadcast,powersgd hook
    r=4', 62 characters) beside a row of dp that ran fewer replicas than asked: the options
    go on lines of their own within their column, and no line is cut (the report's lost
    top-1, Δ top-1 and the status; `bench compare`'s ran to 143 columns, `bench project`'s
    to 137)."""
    many = {"static_graph": True, "broadcast_buffers": False, "find_unused_parameters": True,
            "comm_hook": "powersgd", "powersgd_rank": 4}
    long = {**record("b", "ddp", 2, [5.0, 1.0], [0.1, 0.32]), "ddp_options": many}
    write_runs(tmp_path / "cpu", [record("a", "ddp", 1, [5.0, 2.0], [0.1, 0.30]), long,
                                  {**record("c", "dp", 1, [5.0, 1.5], [0.1, 0.31]),
                                   "gpus_requested": 2}])
    write_runs(tmp_path / "gpu", [{**long, "device": "cuda", "compute_step_s": 0.05,
                                   "model": {"width": 1.0, "parameters": 11_000_000}}])
    for proc, last in ((run_bench("report", "--results", str(tmp_path / "cpu"), "--no-write"),
                        "ok"),
                       (run_bench("compare", str(tmp_path / "cpu"), str(tmp_path / "cpu")),
                        "ok"),
                       (run_bench("project", str(tmp_path / "gpu"), "--gpus", "8"),
                        "compute")):
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert max(len(line) for line in lines) <= 120, proc.stdout
        at = next(i for i, line in enumerate(lines) if line.startswith("strategy"))
        assert lines[at].split()[-1] in ("status", "verdict", "bottleneck"), proc.stdout
        start = lines[at].index("options")
        (row,) = [i for i, line in enumerate(lines)
                  if line.startswith("ddp ") and line[start:].startswith("static graph")]
        assert lines[row].split()[-1] == last, proc.stdout
        options = [lines[row][start:].split("  ")[0]]
        options += [line.strip() for line in lines[row + 1:] if line[:start].isspace()]
        # (a part wider than the column is broken at a space, which the lines do not keep)
        assert "".join(options).replace(" ", "") == (
            "staticgraph,findunused,nobufferbroadcast,powersgdhookr=4"), proc.stdout


def test_json_is_strict_csv_says_yes_and_failed_runs_are_counted(tmp_path):
    ok = record("a", "ddp", 1, [5.0], [0.1])  # one epoch: no median (NaN in the table)
    failed = record("b", "ddp", 1, [], [], status="failed", error="boom")
    write_runs(tmp_path, [{**rec, "initial_param_fingerprint": None} for rec in (ok, failed)])
    as_json = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "json")
    rows = json.loads(as_json.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert rows[0]["epoch_time_s"] is None and rows[0]["failed_runs"] == 1
    text = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert "1 (+1 not ok)" in text.stdout or "runs 1 (+1 not ok)" in text.stdout, text.stdout
    csv = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    assert "✓" not in csv.stdout and "✗" not in csv.stdout


def test_a_reference_that_is_no_finished_runs_row_is_refused_and_nothing_written(results):
    """`--reference fsdp:2` named no row and the report went on with every Δ top-1 blank
    (and wrote them); the rows it could name are the finished ones."""
    proc = run_bench("report", "--results", str(results), "--reference", "fsdp:2")
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "skipped" not in line]  # 2 bad files
    assert said == [f"bench: error: --reference fsdp:2 is no finished run's row in {results} "
                    "(those here: ddp:1, ddp:2); name one of them"], proc.stderr
    assert proc.stdout == "" and sorted(p.name for p in results.iterdir()) == ["runs"]


def test_report_refuses_a_missing_folder_and_writes_nothing_for_an_empty_one(tmp_path):
    missing = tmp_path / "nope" / "results"
    proc = run_bench("report", "--results", str(missing))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is not a folder" in proc.stderr and not (tmp_path / "nope").exists()
    empty = tmp_path / "empty"
    (empty / "runs").mkdir(parents=True)
    proc = run_bench("report", "--results", str(empty))
    assert proc.returncode == 1 and "no run records" in proc.stderr, proc.stderr
    assert "name the folder `bench run --output` or `bench sweep --output` wrote" in \
        proc.stderr, proc.stderr
    assert sorted(p.name for p in empty.rglob("*")) == ["runs"]  # nothing written


def test_malformed_records_and_a_fifo_are_skipped_with_a_warning(tmp_path):
    """Each of these made `bench report` traceback (or hang, the FIFO): now each is skipped
    with a line naming the file and what is wrong, and the good record is reported."""
    good = record("good", "ddp", 1, [5.0, 4.0], [0.1, 0.2])
    runs = write_runs(tmp_path, [good]) / "runs"
    bad = {
        "bare": {"run_id": "x", "status": "ok"},
        "started": {**good, "run_id": "s", "started_at": 5},
        "epochs": {**good, "run_id": "e", "per_epoch": "abc"},
        "epoch-field": {**good, "run_id": "f", "per_epoch": [{"top1": "high"}]},
    }
    for name, rec in bad.items():
        (runs / f"{name}.json").write_text(json.dumps(rec))
    (runs / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(runs / "x.json")
    proc = run_bench("report", "--results", str(tmp_path), "--no-write", timeout=60)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "skipped" in line]
    assert len(warned) == 6, proc.stderr
    assert all("Traceback" not in line for line in proc.stderr.splitlines())
    assert "not a regular file" in proc.stderr and "nested too deeply" in proc.stderr
    assert "started_at is int" in proc.stderr


_NO_TORCH = """
import sys
sys.modules["torch"] = None  # any import of torch now fails
from bench.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_the_report_reads_records_tables_and_plots_without_torch(tmp_path):
    """Importing torch cost the report ~550 MB and 1 s (3,000 records: 720 MB, 2.5 s for the
    table); records that carry their reference start need none."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from report_cost import make_records

    make_records(tmp_path, 40)
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, "report", "--results",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fsdp        8" in proc.stdout
    assert len(list((tmp_path / "plots").rglob("*.png"))) >= 5


def test_make_table_replaces_its_own_rows_and_keeps_the_gpu_and_parity_rows(tmp_path):
    """`make table` once began with `rm -rf results/runs`: measuring the CPU table again
    deleted the committed GPU rows and `make parity`'s. Its runs now replace only the
    records of the workload and device they measured."""
    results, new = tmp_path / "results", tmp_path / "results" / ".table-new"
    table_old = record("old-table", "ddp", 2, [3.0, 2.0], [0.1, 0.5])
    gpu = {**record("gpu-row", "ddp", 1, [3.0, 2.0], [0.1, 0.5]), "device": "cuda"}
    parity = {**record("parity-row", "ddp", 2, [3.0, 2.0], [0.1, 0.5]), "train_size": 12288}
    write_runs(results, [table_old, gpu, parity])
    write_runs(new, [record("new-table", "ddp", 2, [3.0, 1.0], [0.1, 0.6])])
    (new / "probes").mkdir()
    (new / "probes" / "p.json").write_text("{}")
    (results / "runs" / "notes.json").write_text("{ not a record")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "replace_rows.py"), str(new),
                           str(results)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1 record(s) in, 1 of the same rows' earlier runs out" in proc.stdout
    assert sorted(p.name for p in (results / "runs").iterdir()) == [
        "gpu-row.json", "new-table.json", "notes.json", "parity-row.json"]
    assert (results / "probes" / "p.json").exists() and not new.exists()
    # nothing measured (a table whose every run failed to start): nothing is removed
    (new / "runs").mkdir(parents=True)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "replace_rows.py"), str(new),
                           str(results)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "holds no run records" in proc.stderr
    assert len(list((results / "runs").iterdir())) == 4


def test_runs_over_different_links_and_bucket_caps_are_rows_of_their_own():
    """Two 2-node runs (--gpus 1 a node) tagged with the network each crossed, and a
    third at another bucket cap: three rows, each scaled against the one-process run."""
    one = record("one", "ddp", 1, [4.0, 2.0], [0.1, 0.2])
    one["ddp_options"] = {"bucket_cap_mb": 25.0}

    def over(run_id, tag, seconds, bucket=25.0):
        rec = record(run_id, "ddp", 2, [4.0, seconds], [0.1, 0.2])
        rec.update(nodes=2, gpus_requested=1, tag=tag, ddp_options={"bucket_cap_mb": bucket})
        return rec

    table = summary_table([one, over("slow", "net-100mbit", 4.0), over("fast", "net-10g", 1.0),
                           over("small", "net-100mbit", 2.0, bucket=1.0),
                           over("swept", "sweep:abc:r0", 1.0)])
    rows = {(r.workload.split(", ")[-1].removesuffix(" on Test (2 cores)"), r.options,
             r.world_size): r
            for r in table.itertuples()}
    assert set(rows) == {("resnet18", "—", 1), ("resnet18", "—", 2), ("over net-100mbit", "—", 2),
                         ("over net-10g", "—", 2), ("over net-100mbit", "bucket 1 MB", 2)}
    # 1,000 images: 500 img/s alone; 250 and 1,000 img/s over the links
    assert rows[("over net-100mbit", "—", 2)].speedup == pytest.approx(0.5)
    assert rows[("over net-10g", "—", 2)].speedup == pytest.approx(2.0)
    # another bucket cap is another row, scaled only against one process at that cap
    assert math.isnan(rows[("over net-100mbit", "bucket 1 MB", 2)].speedup)
    # a sweep's tag names no network: that run is the 2-node work with no link named
    assert rows[("resnet18", "—", 2)].runs == 1
    assert all(r.gpus_requested == r.world_size for r in table.itertuples())


def _shown_on_a_terminal(args: list[str], columns: int) -> list[str]:
    """The lines `bench ARGS` shows on a terminal of ``columns`` columns (a real pty for
    its stdout and stderr, its size set as a terminal emulator sets it)."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # every writer is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=120) == 0, seen.decode(errors="replace")
    return seen.decode().replace("\r\n", "\n").splitlines()


def test_the_report_fits_the_terminal_it_is_shown_on(tmp_path):
    """On a terminal of 80 columns (a terminal emulator's default) the report's lines were
    120 wide, each folded mid-word by the terminal; now its text fits the terminal, and its
    table first narrows the options, then leaves out a column another one repeats (the
    speed-up: eff. is it over N), never the status. A file or a pipe, and a terminal of 120
    or more, get 120 columns as before."""
    options = {"bucket_cap_mb": 1.0, "static_graph": True, "comm_hook": "powersgd",
               "powersgd_rank": 4}
    write_runs(tmp_path, [
        {**record(f"r{i}", s, n, [5.0, 2.0 + n / 10 + i / 7, 2.1], [0.2, 0.4, 0.5 + i / 100]),
         **({"ddp_options": options} if i == 2 else {})}
        for i, (s, n) in enumerate([("ddp", 1), ("ddp", 2), ("ddp", 2), ("fsdp", 2),
                                    ("horovod", 2), ("ddp-zero", 2)])]
        + [record("x", "ddp-amp", 2, [], [], status="failed", error="rank 1: RuntimeError")])
    args = ["report", "--results", str(tmp_path), "--no-write"]
    narrow = _shown_on_a_terminal(args, 80)
    assert max(map(len, narrow)) <= 80, "\n".join(narrow)
    table = [line.split() for line in narrow
             if line.split(" ")[0] in ("strategy", "ddp", "fsdp", "horovod", "ddp-zero",
                                       "ddp-amp")]
    assert sorted(row[-1] for row in table) == ["failed", *["ok"] * 6, "status"], narrow
    assert "speed-up" not in table[0] and "eff." in table[0], narrow
    piped = run_bench(*args)
    wide = (piped.stdout + piped.stderr).splitlines()
    assert 80 < max(map(len, wide)) <= 120, piped.stdout
    assert any(line.startswith("strategy ") and "speed-up" in line for line in wide), wide
    assert _shown_on_a_terminal(args, 200) == wide  # at most 120 columns
