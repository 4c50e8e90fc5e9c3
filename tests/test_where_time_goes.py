"""Where the time goes: exposed communication (compute-only probe steps), the all-reduce
ceiling (bench probe), model FLOPs utilisation, and the profiler trace."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import assert_ok, only_record, run_bench
from report_records import record

from bench.measure.flops import train_flops_per_image
from bench.models.registry import ModelSpec
from bench.records.peaks import peak_tflops
from bench.report import summary_table, to_markdown
from bench.report.views import plausibility_warnings

SMALL = ["--strategy", "ddp", "--gpus", "2", "--cpu", "--epochs", "2", "--data", "synthetic",
         "--train-limit", "256", "--test-limit", "32", "--width", "0.125", "--batch-size",
         "32", "--no-progress", "--comm-probe-steps", "20"]


@pytest.mark.serial  # compares measured shares of a step: no neighbour's load
def test_exposed_communication_responds_to_communication_cost(tmp_path):
    """A 200 ms wait before every gradient bucket's all-reduce (BENCH_SLOW_COMM_MS, as a
    slow link; this model has one bucket) lengthens the step but not the compute-only step
    (sync off skips it): the exposed share must rise. The margins are half a wait: a loaded
    CI machine once doubled a 41 ms compute step between two runs (with a 60 ms wait, that
    read as the wait). The probe and profiled steps come after everything recorded: a run
    without them ends with the same parameters."""
    wait = 0.2
    profiled = run_bench("run", *SMALL, "--profile-steps", "2", "--output", str(tmp_path / "a"))
    assert_ok(profiled)
    # Kineto says nothing about a CPU trace (torch 2.14: 'USDT: ... profiler_start')
    assert not re.search(r"^[A-Z]+:\d{4}-\d\d-\d\d .*\.cpp:\d+\]", profiled.stderr, re.M), \
        profiled.stderr
    assert_ok(run_bench("run", *SMALL, "--output", str(tmp_path / "slow"),
                        env={"BENCH_SLOW_COMM_MS": str(wait * 1000)}))
    assert_ok(run_bench("run", *SMALL, "--comm-probe-steps", "0",
                        "--output", str(tmp_path / "none")))
    plain, slow, none = (only_record(tmp_path / d) for d in ("a", "slow", "none"))
    assert any("SLOW COMMUNICATION INJECTED" in n for n in slow["notes"])
    step = {name: rec["per_epoch"][1]["step_time_p50_s"] for name, rec in
            (("plain", plain), ("slow", slow))}
    compute = {"plain": plain["compute_step_s"], "slow": slow["compute_step_s"]}
    assert step["slow"] > step["plain"] + wait / 2, step  # the wait shows in every step
    assert compute["slow"] < step["slow"] - wait / 2, (compute, step)  # ... not without sync
    assert compute["slow"] < compute["plain"] + wait / 2, compute  # compute: unchanged
    exposed = {name: rec["exposed_comm_fraction"] * step[name] for name, rec in
               (("plain", plain), ("slow", slow))}
    assert exposed["slow"] > exposed["plain"] + wait / 2, exposed  # the wait is exposed time
    assert slow["exposed_comm_fraction"] > plain["exposed_comm_fraction"]
    # nothing recorded moved: same final parameters, epochs, accuracy as without the steps
    assert none["compute_step_s"] is None and none["comm_probe_steps"] == 0
    assert plain["param_fingerprint"] == none["param_fingerprint"]
    assert [e["top1"] for e in plain["per_epoch"]] == [e["top1"] for e in none["per_epoch"]]
    trace = json.loads(Path(plain["profile_trace"]).read_text())  # Chrome trace format
    assert any(e.get("name", "").startswith("aten::convolution")
               for e in trace["traceEvents"])
    # the terminal says where it went (it was the record's alone)
    assert (f"bench: trace of 2 steps after the epochs (rank 0's; Perfetto, TensorBoard) "
            f"{plain['profile_trace']}\n") in profiled.stdout, profiled.stdout
    assert none["profile_trace"] is None
    # the input pipeline alone (30 batches, no model) feeds far more than this run trains
    assert plain["loader_probe_steps"] == 30
    assert plain["loader_alone_images_per_s"] > 3 * plain["per_epoch"][1]["images_per_s"]
    # ... and its loop hardly waits for batches (in-process synthetic images, no delay)
    assert plain["summary"]["input_wait_share"] < 0.3, plain["summary"]

# the one epoch a finished run has at least (a record of status ok without one is no record)
ONE_EPOCH = [{"epoch": 1, "train_time_s": 10.0, "images_per_s": 5000.0, "top1": 0.01,
              "peak_mem_bytes": 2**30}]


def test_the_compute_step_is_the_median_of_each_steps_slowest_rank(tmp_path):
    """A synchronised step waits for whichever rank is slowest at that step. With a 500 ms
    wait in one rank's probe step in turn (BENCH_SLOW_PROBE_STEP_MS), every step's slowest
    rank waited: the compute step is at least the wait; either rank's own median is about
    half a wait less (a tiny step here is ~20 ms), and a sum over ranks a wait more."""
    assert_ok(run_bench("run", *SMALL, "--epochs", "1", "--comm-probe-steps", "10",
                        "--output", str(tmp_path), env={"BENCH_SLOW_PROBE_STEP_MS": "500"}))
    rec = only_record(tmp_path)
    assert rec["norm"] == "per-replica-bn"  # ranks not coupled inside a step (no SyncBN)
    assert 0.45 < rec["compute_step_s"] < 0.75, rec["compute_step_s"]
    assert "SLOW PROBE STEPS INJECTED (BENCH_SLOW_PROBE_STEP_MS): 500 ms" in \
        rec["comm_probe_note"], rec["comm_probe_note"]


def test_a_slow_link_waits_in_front_of_a_comm_hook(tmp_path):
    """The injected 60 ms wait per bucket goes in front of the run's own comm hook (DDP
    takes one hook only: registering a second one failed at start-up), every step waits at
    least once, and the rank-alone copy that measures PowerSGD's own work carries no wait."""
    assert_ok(run_bench("run", *SMALL, "--ddp-comm-hook", "powersgd", "--output",
                        str(tmp_path), env={"BENCH_SLOW_COMM_MS": "60"}))
    rec = only_record(tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert any(n.startswith("DDP comm hook: PowerSGD") for n in rec["notes"]), rec["notes"]
    assert any("SLOW COMMUNICATION INJECTED" in n for n in rec["notes"]), rec["notes"]
    assert rec["per_epoch"][1]["step_time_p50_s"] >= 0.06
    # measured (None: not), and far below one wait (0 when below the noise of a tiny model)
    assert rec["hook_work_s"] is not None and rec["hook_work_s"] < 0.03, rec["hook_work_s"]


@pytest.mark.serial  # compares a measured rate with training's: no neighbour's load
def test_loader_alone_finds_an_input_bound_run(tmp_path):
    """Every training image waits 20 ms before it is served (BENCH_SLOW_LOADER_MS, as a
    slow disk would make it) and each of the 2 ranks has 2 loader workers: the pipeline
    feeds at most 2 ranks x 2 workers x 50 img/s = 200 img/s. The loader probe must find
    about that; the narrow model trains several times faster than that alone, so the run
    trains at the pipeline's pace and `bench run` and the report call it input-bound."""
    out = tmp_path / "slow"
    slow_args = [*SMALL[:SMALL.index("--train-limit")], "--train-limit", "512",
                 *SMALL[SMALL.index("--test-limit"):]]
    proc = run_bench("run", *slow_args, "--workers", "2", "--comm-probe-steps", "0",
                     "--loader-probe-steps", "20", "--output", str(out),
                     env={"BENCH_SLOW_LOADER_MS": "20"})
    assert_ok(proc)
    rec = only_record(out)
    assert any("SLOW LOADER INJECTED" in n for n in rec["notes"])
    ceiling = rec["loader_alone_images_per_s"]
    # at most 200 img/s, +10 % for the batch already on its way when the clock starts
    assert rec["loader_probe_steps"] == 20 and 120 < ceiling < 220, ceiling
    trained = rec["summary"]["median_images_per_s"]
    assert trained >= 0.85 * ceiling, (trained, ceiling)
    # a rank gets a batch of 16 every 160 ms (2 workers, 320 ms each) and computes it in a
    # few tens of ms: its loop waits for batches most of each timed epoch, and says so. (Not
    # the warm-up epoch: once in CI its compute took 2.7 s of 3.5, a one-off stall the
    # warm-up exists to absorb; timed epochs wait 65-73 % of the time here.)
    for epoch in (e for e in rec["per_epoch"] if not e["warmup"]):
        assert epoch["input_wait_s"] > 0.5 * epoch["train_time_s"], epoch
    assert rec["summary"]["input_wait_share"] > 0.5
    assert proc.stdout.count("input wait ") == len(rec["per_epoch"]), proc.stdout
    assert f"input-bound (the loader alone: {ceiling:.0f} img/s)" in proc.stdout
    # it names the bench loader line to choose a count; that line, at the run's own count,
    # measures the same pipeline as the run's probe did
    lines = proc.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.endswith("which worker count feeds faster:")]
    sweep = shlex.split(lines[at + 1])
    assert sweep[:2] == ["bench", "loader"] and sweep[-2:] == ["--workers", "2,4,8"], lines
    assert "--epochs" not in sweep and "--train-limit" in sweep, sweep  # what shapes the input
    again = run_bench(*sweep[1:-1], "2", "--steps", "10", "--format", "json",
                      env={"BENCH_SLOW_LOADER_MS": "20"})
    assert_ok(again)
    (point,) = json.loads(again.stdout)["points"]
    assert 0.7 * ceiling < point["images_per_s"] < 1.3 * ceiling, (point, ceiling)
    report = run_bench("report", "--results", str(out), "--no-write")
    assert_ok(report)
    assert "input-bound" in report.stdout
    said = " ".join(report.stderr.split())  # the warning is wrapped at 120 columns
    assert f"of the {ceiling:.0f} img/s its input pipeline feeds with no model" in said


# Measures what all-reduces beside the compute cost it: alone on 2 cores +59 to +111 %, but
# +8 % in CI beside a neighbour's ranks (2026-12-03), whose load is in both windows
@pytest.mark.serial
def test_bench_probe_prints_a_table_and_writes_a_record(tmp_path):
    proc = run_bench("probe", "--cpu", "--gpus", "2", "--width", "0.125", "--max-size", "1",
                     "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "busbw (GB/s)" in proc.stdout and "<- one gradient" in proc.stdout
    # the two collectives' columns, named in full, their figures under their names
    header, *rows = [line for line in proc.stdout.splitlines() if "KiB" in line
                     or "MiB" in line or "busbw" in line][:3]
    assert header.endswith("  all-gather (ms)  reduce-scatter (ms)"), header
    assert all(len(row.split(" <-")[0]) == len(header) for row in rows), [header, *rows]
    # torch 2.14 warns on its old names for the two (six FutureWarnings above the table)
    assert "Warning" not in proc.stderr, proc.stderr
    (path,) = (tmp_path / "probes").glob("*.json")
    probe = json.loads(path.read_text())
    assert probe["kind"] == "allreduce-probe" and probe["world_size"] == 2
    assert probe["backend"] == "gloo" and probe["device"] == "cpu"
    sizes = [r["bytes"] for r in probe["results"]]
    assert sizes[0] == 1024 and 1024**2 in sizes and probe["gradient_bytes"] in sizes
    for r in probe["results"]:
        # nccl-tests: busbw = algbw * 2(n-1)/n, which is algbw itself at n = 2
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"]) and r["time_s"] > 0
        assert r["time_mean_s"] > 0  # the mean call besides the median: what calls add to
        assert r["all_gather_s"] > 0 and r["reduce_scatter_s"] > 0  # FSDP's collectives
    # small messages are latency-bound: 1 KiB moves far slower per byte than 1 MiB
    by_size = {r["bytes"]: r["algbw_GBps"] for r in probe["results"]}
    assert by_size[1024**2] > 10 * by_size[1024]
    assert probe["gradient_bytes"] == 4 * probe_parameters()  # float32 gradients
    # what overlap costs: the model's steps alone and beside all-reduces of its gradient.
    # On loopback gloo's copies take the cores the compute needs (+59 to +111 % here)
    contention = probe["contention"]
    assert contention["allreduce_bytes"] == probe["gradient_bytes"], contention
    assert len(contention["compute_alone_s"]) == len(contention["compute_beside_s"]) == 3
    assert min(contention["compute_alone_s"]) > 0, contention
    assert contention["compute_slowdown"] > 0.1, contention
    said = " ".join(proc.stdout.split())
    assert (f"beside all-reduces of the gradient, a step of 32 images a rank took "
            f"{100 * contention['compute_slowdown']:+.0f} %") in said, proc.stdout
    # the gradient's model as the report names it: ResNet-18 at its width
    assert (f"one resnet18 x0.125 gradient ({probe['gradient_bytes'] / 2**20:.1f} MiB) "
            "all-reduces in") in proc.stdout, proc.stdout
    bad = run_bench("probe", "--cpu", "--gpus", "1", "--output", str(tmp_path / "x"))
    assert bad.returncode == 2 and "at least 2 ranks" in bad.stderr


def test_bench_probe_measures_the_gradient_of_the_model_named(tmp_path):
    """ResNet-50 with a 100-class head (bench run's default classes): torchvision's
    25,557,032 parameters less the 1,000-class head plus a 100-class one, 4 bytes each."""
    proc = run_bench("probe", "--cpu", "--gpus", "2", "--model", "torchvision:resnet50",
                     "--max-size", "0.01", "--contention-batch", "0", "--output", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = (tmp_path / "probes").glob("*.json")
    probe = json.loads(path.read_text())
    grad = 4 * (25_557_032 - 2048 * 1000 - 1000 + 2048 * 100 + 100)
    assert probe["model"] == "torchvision:resnet50" and probe["gradient_bytes"] == grad
    assert grad in [r["bytes"] for r in probe["results"]]
    assert "one resnet50 gradient (90.5 MiB)" in proc.stdout
    assert "contention" not in probe  # --contention-batch 0: not measured
    bad = run_bench("probe", "--cpu", "--model", "torchvision:resnet5000", "--output",
                    str(tmp_path / "x"))
    assert bad.returncode == 2 and "did you mean" in bad.stderr


def probe_parameters() -> int:
    from bench.models.parameters import count_parameters
    from bench.models.resnet_cifar import resnet18_cifar

    return count_parameters(resnet18_cifar(width=0.125))


def test_train_flops_of_full_width_resnet18_match_the_hand_count():
    """Hand count: the forward of one 32x32 image is 0.5555 G multiply-adds (stem conv
    3->64 at 32x32: 1.77 M; stage 1: 4 convs 64->64 at 32x32: 151 M; stages 2-4 likewise
    ~ 151 M each with their downsampling 1x1 convs: 0.556 G in all), 2 FLOPs each: 1.111
    GFLOP; backward twice the forward: 3.333 GFLOP per image in training."""
    flops = train_flops_per_image()
    assert flops == pytest.approx(3.333e9, rel=0.05)


def test_mfu_uses_the_gpus_dense_peak_for_the_runs_precision(tmp_path):
    from bench.records.run_record import RunRecord

    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0  # SXM
    assert peak_tflops("NVIDIA H100 PCIe", "tf32") == 378.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "apex-O1") == 312.0  # apex O1 computes fp16
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None  # V100 has no bf16 units
    assert peak_tflops("AMD EPYC", "fp32") is None
    record = RunRecord(tmp_path / "r.json", {
        "run_id": "r", "status": "running", "device": "cuda", "gpu_shared": False,
        "env": {"gpus": ["NVIDIA H100 80GB HBM3"] * 2}, "train_flops_per_image": 3_330_000_000,
    })
    record.start(world_size=2, processes=2, norm="syncbn", precision="bf16",
                 per_replica_batch=256, per_process_batch=256, grad_accum=1,
                 workers_per_process=4, threads_per_process=8, train_size=50000,
                 test_size=10000, steps_per_epoch=97, warmup_steps=97, model=ModelSpec(),
                 parameters=11_220_132, notes=[], compile_time_s=None,
                 initial_param_fingerprint="x", initial_reference_fingerprint="x",
                 initial_replicas_identical=True,
                 allow_tf32=True)
    from bench.records.run_record import EvalStats, TrainStats

    train = TrainStats(data_order_sha1="d", train_time_s=1.0, train_loss=1.0,
                       train_images=100_000, lr_last=0.1, step_time_p50_s=0.01,
                       step_time_p90_s=0.01)
    evaluation = EvalStats(eval_time_s=0.1, top1=0.5, top5=0.8, test_loss=1.0,
                           test_images=10000)
    entry = record.add_epoch(1, train, evaluation, 2**30)
    # 100,000 img/s x 3.33 GFLOP = 333 TFLOP/s over 2 GPUs of 989 -> 16.8 %
    assert entry["achieved_tflops"] == pytest.approx(333.0)
    assert entry["mfu"] == pytest.approx(333.0 / (2 * 989.0))


def test_report_shows_exposed_comm_mfu_and_the_comm_ceiling(tmp_path):
    rec = {**record("a", "ddp", 2, [2.0, 1.0], [0.1, 0.2]), "exposed_comm_fraction": 0.25,
           "compute_step_s": 0.03, "backend": "gloo",
           "model": {"width": 1.0, "parameters": 1_000_000}}
    for epoch in rec["per_epoch"]:
        epoch.update(step_time_p50_s=0.04, mfu=0.42)
    probe = {"kind": "allreduce-probe", "device": "cpu", "backend": "gloo", "world_size": 2,
             "gradient_bytes": 4_000_000, "env": rec["env"],  # of the run's machine
             "results": [{"bytes": 1_000_000, "time_s": 0.001},
                         {"bytes": 16_000_000, "time_s": 0.016}]}
    table = summary_table([rec], probes=[probe])
    row = table.iloc[0]
    assert row["exposed_comm"] == 0.25 and row["mfu"] == 0.42
    # 4 MB between 1 MB (1 ms) and 16 MB (16 ms), log-log: 4 ms; the step is 40 ms
    assert row["comm_ceiling"] == "4.0 / 40.0"
    assert "| 25.0 | 42.0 | 4.0 / 40.0 |" in to_markdown(table)
    # 2 ranks on 2 nodes cross the network: a probe of 2 ranks on one node does not say
    two_nodes = {**rec, "nodes": 2}
    assert summary_table([two_nodes], probes=[probe]).iloc[0]["comm_ceiling"] is None
    across = {**probe, "nodes": 2, "results": [{"bytes": 1_000_000, "time_s": 0.002},
                                               {"bytes": 16_000_000, "time_s": 0.032}]}
    assert summary_table([two_nodes], probes=[probe, across]).iloc[0][
        "comm_ceiling"] == "8.0 / 40.0"
    assert summary_table([rec], probes=[probe, across]).iloc[0]["comm_ceiling"] == "4.0 / 40.0"


def test_trace_breakdown_counts_each_instant_once_by_hand():
    """compute [0,10] and [30,40], NCCL [5,20], a copy [18,25]: 20 µs compute, 10 of
    communication not under compute, 5 of copy alone, 5 idle, over a 40 µs window."""
    from bench.report.trace_breakdown import breakdown

    def ev(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                "args": {"device": 0}}

    events = [ev("kernel", "conv", 0, 10), ev("kernel", "ncclDevKernel_AllReduce", 5, 15),
              ev("gpu_memcpy", "Memcpy DtoH", 18, 7), ev("kernel", "gemm", 30, 10),
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 100}]
    got = breakdown(events)[0]
    assert got == pytest.approx({"window_s": 40e-6, "compute_s": 20e-6,
                                 "communication_s": 10e-6, "memory_s": 5e-6,
                                 "idle_s": 5e-6})


def test_report_prints_the_gpu_breakdown_of_a_real_h100_trace(tmp_path):
    """A trace --profile-steps 5 wrote on an H100 (kernel events kept): the report finds it
    beside the records, prints the four shares and writes trace_breakdown.csv."""
    import shutil

    from conftest import ROOT

    runs = tmp_path / "runs"
    runs.mkdir()
    (tmp_path / "traces").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "h100-ddp-profile-kernels.trace.json.gz",
                tmp_path / "traces" / "t.trace.json.gz")
    run_id = "20261126T053559Z-ddp-1cuda-976d6a"  # a real run id: its lines in 120 columns
    rec = {"run_id": run_id, "status": "ok", "strategy": "ddp", "world_size": 1,
           "device": "cuda", "precision": "tf32", "profile_steps": 5,
           "profile_trace": "/elsewhere/traces/t.trace.json.gz", "per_epoch": ONE_EPOCH,
           "started_at": "2026-11-23T03:07:04Z"}
    (runs / f"{run_id}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith(run_id))
    assert max(len(x) for x in lines[at - 2:at + 1]) <= 120, "\n".join(lines[at - 2:at + 1])
    line = lines[at]
    shares = [float(x.rstrip("%")) for x in line.split()[-4:]]
    assert sum(shares) == pytest.approx(100, abs=0.2) and shares[1] == 0  # N=1: no NCCL
    assert shares[0] > 5 and shares[3] > 50  # a tiny model: the GPU mostly waits
    assert (tmp_path / "trace_breakdown.csv").read_text().startswith("run_id,")


def test_a_trace_cut_short_or_of_another_shape_is_a_note_not_a_traceback(tmp_path):
    """A gzipped trace cut short (a run killed while it was written) raised gzip's EOFError
    out of `bench report`; JSON of another shape or with events of other types raised
    AttributeError or TypeError. Each is now the run's note, within 120 columns, and the
    report goes on; an event whose figures are not numbers is left out of the breakdown."""
    import gzip

    from bench.report.trace_breakdown import breakdown

    runs, traces = tmp_path / "runs", tmp_path / "traces"
    runs.mkdir(), traces.mkdir()
    whole = gzip.compress(json.dumps({"traceEvents": []}).encode() * 50)
    contents = {"cut.trace.json.gz": whole[: len(whole) // 2],
                "list.trace.json": b"[]",
                "events.trace.json": b'{"traceEvents": {"a": 1}}'}
    for i, (name, data) in enumerate(contents.items()):
        (traces / name).write_bytes(data)
        run_id = f"20261126T05355{i}Z-ddp-1cuda-976d6a"
        rec = {"run_id": run_id, "status": "ok", "strategy": "ddp", "world_size": 1,
               "device": "cuda", "precision": "tf32", "profile_steps": 5,
               "profile_trace": f"/elsewhere/traces/{name}", "per_epoch": ONE_EPOCH,
               "started_at": "2026-11-23T03:07:04Z"}
        (runs / f"{run_id}.json").write_text(json.dumps(rec))
    proc = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "unreadable trace: cut.trace.json.gz is cut short" in said, proc.stdout
    assert said.count("is not a Chrome trace") == 2, proc.stdout
    assert max(map(len, proc.stdout.splitlines())) <= 120, proc.stdout
    good = {"ph": "X", "cat": "kernel", "name": "conv", "ts": 0, "dur": 10}
    assert breakdown([good, "x", {**good, "ts": "soon"}, {**good, "args": [1]}])[0][
        "compute_s"] == pytest.approx(10e-6)


def test_a_record_naming_a_file_that_is_no_trace_has_it_left_unread(tmp_path):
    """`bench report` read whole any file a record named as its trace: a shared record
    naming a 64 GiB file (/proc/kcore, a sparse file) took all memory, a MemoryError
    traceback under a 4 GiB limit. Only a traces/*.trace.json[.gz] is read, and no more of
    it than a trace can be; a gzip bomb or JSON nested past Python's stack is a note."""
    import gzip
    import os
    import resource
    import subprocess
    import sys

    from conftest import ROOT

    from bench.report.trace_breakdown import read_trace

    big = tmp_path / "elsewhere" / "kcore"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(64 << 30)  # sparse: no disk, 64 GiB of zeros to whoever reads it
    runs = tmp_path / "runs"
    runs.mkdir()
    run_id = "20261126T053559Z-ddp-1cuda-976d6a"
    rec = {"run_id": run_id, "status": "ok", "strategy": "ddp", "world_size": 1,
           "device": "cuda", "precision": "tf32", "profile_steps": 5,
           "profile_trace": str(big), "per_epoch": ONE_EPOCH, "started_at": "2026-11-23T03:07:04Z"}
    (runs / f"{run_id}.json").write_text(json.dumps(rec))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.run([sys.executable, "-m", "bench", "report", "--results",
                           str(tmp_path), "--no-write"], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ), preexec_fn=limited, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stdout.split())
    assert "/elsewhere/kcore as its trace, not a traces/*.trace.json[.gz] file" in said, said
    assert max(map(len, proc.stdout.splitlines())) <= 120, proc.stdout

    traces = tmp_path / "traces"
    traces.mkdir()
    bomb = traces / "bomb.trace.json.gz"
    bomb.write_bytes(gzip.compress(b" " * 5000))
    with pytest.raises(ValueError, match=r"bomb\.trace\.json\.gz holds over"):
        read_trace(bomb, max_bytes=4096)
    deep = traces / "deep.trace.json"
    deep.write_text("[" * 200_000)
    with pytest.raises(ValueError, match="nests too deep"):
        read_trace(deep)


def test_top_kernels_ranks_a_real_h100_traces_kernels(tmp_path):
    """scripts/top_kernels.py (what the GPU lease prints of the fastest path's profile) on
    the H100 trace: kernel time, not operators; the largest first; the shares of the
    listed kernels add up to at most the whole."""
    import gzip
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    (tmp_path / "traces").mkdir()
    trace = ROOT / "tests" / "data" / "h100-ddp-profile-kernels.trace.json.gz"
    shutil.copy(trace, tmp_path / "traces" / "t.trace.json.gz")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "top_kernels.py"),
                           str(tmp_path), "--top", "5"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    head, *rows = proc.stdout.splitlines()
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    total_ms = sum(e["dur"] for e in events if e.get("cat") == "kernel") / 1e3
    assert f"{total_ms:.1f} ms of kernel time" in head, head
    assert len(rows) == 5
    shares = [float(r.split("%")[0]) for r in rows]
    spent = [float(r.split("%")[1].split("ms")[0]) for r in rows]
    assert spent == sorted(spent, reverse=True) and sum(shares) <= 100.05
    assert spent[0] <= total_ms
    # a folder with neither records nor traces: one line, exit 2
    empty = subprocess.run([sys.executable, str(ROOT / "scripts" / "top_kernels.py"),
                            str(tmp_path / "nothing")], capture_output=True, text=True)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1


def test_a_row_takes_the_probe_of_its_own_machine(tmp_path):
    """gloo over one machine's loopback measures that machine. A folder holding two CPU
    machines' runs and a probe of each gave every row the newest probe, the other
    machine's for half of them: its ideal all-reduce read 10x off here."""
    def on(cpu, thing):
        return {**thing, "env": {**(thing.get("env") or {}), "cpu": cpu, "cpu_count": 2}}

    rec = {**record("a", "ddp", 2, [2.0, 1.0], [0.1, 0.2]), "compute_step_s": 0.03,
           "backend": "gloo", "model": {"width": 1.0, "parameters": 1_000_000}}
    for epoch in rec["per_epoch"]:
        epoch.update(step_time_p50_s=0.04)
    probe = {"kind": "allreduce-probe", "device": "cpu", "backend": "gloo", "world_size": 2,
             "gradient_bytes": 4_000_000,
             "results": [{"bytes": 1_000_000, "time_s": 0.001},
                         {"bytes": 16_000_000, "time_s": 0.016}]}
    tenfold = {**probe, "results": [{"bytes": 1_000_000, "time_s": 0.0001},
                                    {"bytes": 16_000_000, "time_s": 0.0016}]}
    mine, theirs = on("AMD EPYC 7B13", probe), on("Intel Xeon Gold 6338", tenfold)
    row = summary_table([on("AMD EPYC 7B13", rec)], probes=[mine, theirs]).iloc[0]
    # 4 MB at 1 ms a MB (log-log between its two sizes): 4 ms, as its own probe says
    assert row["comm_ceiling"] == "4.0 / 40.0", row["comm_ceiling"]
    assert row["projected_efficiency"].endswith("% (projected)"), row["projected_efficiency"]
    assert not plausibility_warnings(summary_table([on("AMD EPYC 7B13", rec)], probes=[mine]))
    # no probe of its machine: the newest of its device, and both cells say so, and a note
    # names the machine it measured (they read as its own before: 10x off here)
    table = summary_table([on("AMD EPYC 9B14", rec)], probes=[mine, theirs])
    row = table.iloc[0]
    assert row["comm_ceiling"] == "0.4 / 40.0 (another machine)", row["comm_ceiling"]
    assert row["projected_efficiency"].endswith("% (projected over another machine)"), row[
        "projected_efficiency"]
    notes = plausibility_warnings(table)
    assert len(notes) == 1 and ("the `bench probe` of another machine (Intel Xeon Gold 6338 "
                                "(2 cores)) gave its rows' ideal all-reduce and projection, "
                                "no probe of its own" in notes[0]), notes
    # a probe of its machine over another network than its runs crossed (the testbed's
    # link, for a run over one machine's loopback) is marked alike
    tagged = {**on("AMD EPYC 9B14", tenfold), "tag": "testbed-100mbit"}
    row = summary_table([on("AMD EPYC 9B14", rec)], probes=[tagged]).iloc[0]
    assert row["projected_efficiency"].endswith("(projected over another network)"), row[
        "projected_efficiency"]
    # the projection column alike: the committed AMD EPYC rows were projected over the
    # Intel Xeon's testbed probe, the newest (58 % at 64 GPUs; over their own, 94 %)
    def projected(*probes):
        return summary_table([on("AMD EPYC 7B13", rec)], probes=list(probes)).iloc[0][
            "projected_efficiency"]

    assert projected(mine) != projected(theirs)
    assert projected(mine, theirs) == projected(mine) == projected(theirs, mine)
    tagged = {**on("AMD EPYC 7B13", tenfold), "tag": "testbed-100mbit"}
    assert projected(mine, tagged) == projected(mine)  # an untagged run: no network named
