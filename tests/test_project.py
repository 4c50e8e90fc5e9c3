"""bench project: NCCL's all-reduce cost model and DDP's bucket overlap against values worked
out by hand, and the model's prediction of real 2-rank runs (with an injected slow link)
against what they measured."""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import replace

import pytest
from conftest import ROOT, assert_ok, only_record, run_bench

from bench.project.from_records import workload_of
from bench.project.scaling import Network, Workload, allreduce_s, project
from bench.records.gradient_timeline import GradientTimeline

NET = Network("test", 400.0, 400.0, "nvlink", "hand-written")


def test_one_slowed_small_message_of_a_probe_does_not_set_the_latency():
    """A probe's latency per ring step came from its smallest message alone: on 2 busy cores
    1 KiB took 3.3 ms where 4 and 16 KiB took 0.3 ms, and the latency read 1,658 µs against
    the 159 µs of a probe minutes before, which made 'collective latency' the bottleneck of
    every projection to many GPUs. The figures here are two probes of this machine's
    (2026-12-01); each message's time is the latency's two ring steps and its bytes."""
    from bench.project.scaling import network_from_probe

    def probe(small_ms: list[float]) -> dict:
        sizes = [1024 * 4**k for k in range(10)]
        times = [*(ms / 1e3 for ms in small_ms),
                 *(2 * 150e-6 + size / 1.0e9 for size in sizes[len(small_ms):])]
        return {"probe_id": "p", "device": "cpu", "backend": "gloo", "world_size": 2,
                "results": [{"bytes": b, "time_s": t} for b, t in zip(sizes, times)]}

    quiet = network_from_probe(probe([0.319, 0.290, 0.361, 0.366]))
    slowed = network_from_probe(probe([3.317, 0.386, 0.276, 0.845]))
    assert 130e-6 < quiet.fixed_latency_s < 160e-6, quiet.fixed_latency_s
    assert 120e-6 < slowed.fixed_latency_s < 160e-6, slowed.fixed_latency_s
    # the bandwidth is the large messages' (the slope to 256 MiB moves by 1 %)
    assert abs(slowed.busbw(1) - quiet.busbw(1)) < 0.02 * quiet.busbw(1)


def test_a_probe_is_fitted_by_its_median_calls_where_it_kept_their_means_too():
    """On 2 busy cores gloo's small calls take about 0.3 ms or a scheduler tick (3-4 ms),
    so one 2-rank probe's median 1 KiB read 0.39 ms and its 4 KiB 3.36 ms, where their
    means read 1.82 and 2.24 ms (1 Gbit/s, results/testbed-scaling, 2026-12-03). Fitted
    to the means, the model predicted the small messages of
    3 and 4 nodes better and the large ones worse (benchmarks/testbed_scaling.py: 1 MiB
    and more 8.5 % off against 1.6 %): a thread that streams a large message does not
    sleep, and so pays no tick. The fit stays on the medians. Below, means of 2.0 to
    2.4 ms at 1 to 64 KiB beside medians of 0.36 to 0.41 ms, the larger sizes 2 ms and
    their bytes at 1 GB/s: the latency is the least median left once the bytes are paid,
    64 KiB's 0.41 ms less 65.9 us (at the fitted 0.994 GB/s), over 2 ring steps: 172 us."""
    from bench.project.scaling import network_from_probe
    from bench.records.probes import ideal_allreduce_s

    sizes = [1024 * 4**k for k in range(10)]
    means = [fixed + size / 1.0e9 for fixed, size in zip(
        [2.0e-3, 2.1e-3, 2.2e-3, 2.4e-3, *[2.0e-3] * 6], sizes)]
    medians = [0.37e-3, 0.36e-3, 0.39e-3, 0.41e-3, *means[4:]]
    probe = {"probe_id": "p", "device": "cpu", "backend": "gloo", "world_size": 2,
             "results": [{"bytes": b, "time_s": t, "time_mean_s": m}
                         for b, t, m in zip(sizes, medians, means)]}
    assert network_from_probe(probe).fixed_latency_s == pytest.approx(172e-6, rel=0.01)
    assert ideal_allreduce_s(probe, 1024) == pytest.approx(0.37e-3)  # the report's, too


def test_a_large_all_reduce_takes_the_ring_a_small_one_at_scale_the_tree():
    """Figures worked out by hand from NCCL 2.30's tuning.cc tables."""
    # ring/Simple: 8.4 us + 14 hops x 3.4 us + 100 MB x 14/8 / 400 GB/s (the Simple tree:
    # 8.4 + 2 x 7 x 4.0 us + 100 MB / (400 GB/s x .92 x .5 x .9) = 668 us)
    assert allreduce_s(100_000_000, 8, 1, NET) == pytest.approx(56e-6 + 437.5e-6)
    # 1 KiB over 4,096 GPUs on 512 nodes: the ring's 8,190 steps cost ms; the LL tree
    # 6.8 + 2 (7 x 0.6 + 9 x 5.0) us plus 1 KiB at 400 GB/s x .92 / 3.8 x .5, times NCCL's
    # correction at 2^4 x 64 bytes (0.9)
    tree = (6.8 + 2 * (7 * 0.6 + 9 * 5.0)) * 1e-6 + 1024 / (400e9 * 0.92 / 3.8 * 0.5 * 0.9)
    assert allreduce_s(1024, 4096, 512, NET) == pytest.approx(tree)
    # 100 MB over 16 GPUs on 2 nodes: the Simple ring, its 30 steps 28 inside a node at
    # 3.4 us, 2 across at 14 us, x1.4 for a multi-node ring, plus 100 MB x 30/16 / 400 GB/s
    ring = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4e-6 + 100e6 * 30 / 16 / 400e9
    assert allreduce_s(100_000_000, 16, 2, NET) == pytest.approx(ring)
    assert allreduce_s(1024, 1, 1, NET) == 0.0


def test_ddp_buckets_overlap_backward_and_a_blocking_hook_delays_it():
    """90 ms compute: forward 30, backward 60; three 1 MiB buckets ready at 50, 70, 90 ms;
    an all-reduce of 1 MiB takes 1.048576 ms at 1 GB/s: only the last one shows."""
    work = Workload("ddp", 0.090, 3 * 2**20, 2**20)
    p = project(work, 2, 2, NET, measured_allreduce=lambda size: size / 1e9)
    assert p.step_s == pytest.approx(0.090 + 2**20 / 1e9)
    assert p.exposed_s == pytest.approx(2**20 / 1e9)
    # a 10 ms blocking wait before each bucket: ready at 60, 90, 120 ms
    slow = Workload("ddp", 0.090, 3 * 2**20, 2**20, hook_delay_s=0.010)
    assert project(slow, 2, 2, NET, measured_allreduce=lambda size: size / 1e9).step_s == (
        pytest.approx(0.120 + 2**20 / 1e9))
    assert project(Workload("dp", 0.09, 1, 1), 16, 8, NET).bottleneck == (
        "1 process, 1 node max")


def test_buckets_follow_the_measured_timeline():
    """Four parameters readied at 40, 50, 70, 90 % of the step (1, 2, 1, 4 M elements of 4
    bytes): DDP closes a bucket once it holds the cap or more."""
    timeline = GradientTimeline(5, 0.35, ((1_000_000, 0.4), (2_000_000, 0.5),
                                          (1_000_000, 0.7), (4_000_000, 0.9)))
    assert timeline.buckets(10_000_000, 4) == [(12_000_000, 0.5), (20_000_000, 0.9)]
    assert timeline.buckets(100e6, 4) == [(32_000_000, 0.9)]
    work = Workload("ddp", 0.100, 32_000_000, 10_000_000, timeline=timeline)
    # 1 GB/s: bucket 1 (12 MB) ready at 50 ms ends at 62; bucket 2 (20 MB) ready at 90 ms
    # ends at 110; the optimizer's 10 ms after backward (90 ms) follow: 120 ms
    p = project(work, 2, 2, NET, measured_allreduce=lambda size: size / 1e9)
    assert p.step_s == pytest.approx(0.120) and p.exposed_s == pytest.approx(0.020)
    record = timeline.to_record()
    assert GradientTimeline.from_record(record) == timeline
    for bad in ({**record, "ready": [[5, 0.5], [5, 0.4]]}, {**record, "ready": []},
                {**record, "backward_start": 0.6}, {"steps": 3}, None, "x"):
        assert GradientTimeline.from_record(bad) is None



def test_communication_under_backward_slows_both_as_the_probe_measured():
    """The timeline's two buckets (12 MB ready at 50 ms, 20 MB at 90 ms; 1 GB/s), on a
    network whose probe measured compute 100 % slower beside an all-reduce and the
    all-reduce 50 % slower beside compute. Worked by hand: from 50 to 68 ms both run
    (bucket 1's 12 ms at 1/1.5 take 18; backward does 9 of its 40 ms left at half speed);
    backward's other 31 ms, alone, end at 99 ms; bucket 2 (20 ms) then runs alone to 119;
    the optimizer's 10 ms: 129 ms, against 120 where overlap is free."""
    timeline = GradientTimeline(5, 0.35, ((1_000_000, 0.4), (2_000_000, 0.5),
                                          (1_000_000, 0.7), (4_000_000, 0.9)))
    work = Workload("ddp", 0.100, 32_000_000, 10_000_000, timeline=timeline)
    contended = replace(NET, compute_slowdown=1.0, comm_slowdown=0.5)
    p = project(work, 2, 2, contended, measured_allreduce=lambda size: size / 1e9)
    assert p.step_s == pytest.approx(0.129) and p.exposed_s == pytest.approx(0.029)
    # a bucket ready only as backward ends overlaps nothing: contention costs it nothing
    late = Workload("ddp", 0.100, 32_000_000, 100_000_000, timeline=timeline)
    for net in (NET, contended):
        assert project(late, 2, 2, net, measured_allreduce=lambda size: size / 1e9
                       ).step_s == pytest.approx(0.100 + 0.032)


def test_a_probes_contention_reaches_the_network_and_noise_below_zero_is_none():
    """The testbed's 10 Gbit/s probe measured compute +134 % and the all-reduce +37 % beside
    each other (2026-12-03); a host's noise can read a slowdown below 0, which is no gain;
    a probe from before it measured nothing (overlap free, as before)."""
    from bench.project.scaling import network_from_probe

    sizes = [1024 * 4**k for k in range(6)]
    probe = {"probe_id": "p", "device": "cpu", "backend": "gloo", "world_size": 2,
             "results": [{"bytes": b, "time_s": 1e-4 + b / 1e9} for b in sizes]}
    measured = network_from_probe({**probe, "contention": {"compute_slowdown": 1.34,
                                                           "comm_slowdown": 0.37}})
    assert (measured.compute_slowdown, measured.comm_slowdown) == (1.34, 0.37)
    assert "compute 134 % slower, the all-reduce 37 %" in measured.source
    noisy = network_from_probe({**probe, "contention": {"compute_slowdown": -0.03,
                                                        "comm_slowdown": None}})
    assert (noisy.compute_slowdown, noisy.comm_slowdown) == (0.0, 0.0)
    before = network_from_probe(probe)
    assert (before.compute_slowdown, before.comm_slowdown) == (0.0, 0.0)
    assert "slower" not in before.source


def test_fsdps_collectives_under_compute_slow_it_as_the_probe_measured():
    """The 1-s FSDP step below (forward 1/3, backward 2/3; all-gather and reduce-scatter 50
    ms each, five units) is 1.030 s where overlap is free. Compute 100 % slower beside
    communication: of forward's all-gather, the 40 ms hidden under compute (all but the
    first unit's 10) cost forward 20 ms of its work; in backward the 80 ms hidden (all but
    its first all-gather's and last reduce-scatter's 10 each) cost 40: 1.090 s. With the
    collectives 50 % slower beside compute too, those 40 and 80 ms take 60 and 120, costing
    30 and 60: 1.120 s."""
    work = Workload("fsdp", 1.0, 100_000_000, 25 * 2**20)
    for compute, comm, step in ((0.0, 0.0, 1.030), (1.0, 0.0, 1.090), (1.0, 0.5, 1.120)):
        net = replace(NET, compute_slowdown=compute, comm_slowdown=comm)
        assert project(work, 2, 2, net, measured_allreduce=lambda size: size / 1e9
                       ).step_s == pytest.approx(step), (compute, comm)

def test_fsdp_takes_its_all_gathers_and_reduce_scatter_at_what_the_probe_measured():
    """An FSDP step of 1 s (forward 1/3, backward 2/3) moving 100 MB in five units. At 1 GB/s
    per all-reduce and half of it per all-gather and reduce-scatter (NCCL's rings: 50 ms
    each), compute leads: the first unit's all-gather shows in forward (10 ms), its
    all-gather and the last unit's reduce-scatter in backward (10 + 10 ms). With gloo's
    figures, all-gather 3x and reduce-scatter 5x half an all-reduce (150 and 250 ms):
    30 ms, then 30 + 50 ms. At 8x each (400 ms) communication leads: forward takes the
    all-gather and the last unit's compute (400 + 66.7 ms), backward both collectives
    and the last unit's compute (800 + 133.3 ms)."""
    work = Workload("fsdp", 1.0, 100_000_000, 25 * 2**20)
    ring = project(work, 2, 2, NET, measured_allreduce=lambda size: size / 1e9)
    assert ring.step_s == pytest.approx(1.030)
    gloo = project(work, 2, 2, NET, measured_allreduce=lambda size: size / 1e9,
                   measured_split=(lambda size: 1.5 * size / 1e9, lambda size: 2.5 * size / 1e9))
    assert gloo.step_s == pytest.approx(1.110)
    slow = Network("gloo", 400.0, 400.0, "nvlink", "hand-written", gather_factor=8,
                   scatter_factor=8)
    at_8 = project(work, 2, 2, slow, measured_allreduce=lambda size: size / 1e9)
    assert at_8.step_s == pytest.approx(0.4 + 1 / 15 + 0.8 + 2 / 15)
    # --no-reshard-after-forward: backward gathers nothing (the parameters are kept from
    # forward); its reduce-scatters (400 ms) hide under its compute (667 ms) but the last
    # unit's (80 ms): 0.4 + 1/15, then 2/3 + 0.08. It was projected as the above.
    kept = replace(work, reshard_after_forward=False)
    assert project(kept, 2, 2, slow, measured_allreduce=lambda size: size / 1e9).step_s == \
        pytest.approx(0.4 + 1 / 15 + 2 / 3 + 0.08)
    record = {"strategy": "fsdp", "compute_step_s": 1.0, "model": {"parameters": 25_000_000},
              "ddp_options": {"reshard_after_forward": False}}
    assert workload_of(record).reshard_after_forward is False
    assert workload_of({**record, "ddp_options": {}}).reshard_after_forward is True
    # the units its run recorded (mobilenet_v3_small: 8), else ResNet-18's five: at 8 units
    # backward's hidden reduce-scatters leave 400 / 8 ms, forward 2/3 / 8 s of compute
    eight = [4 * 25_000_000 // 8] * 8
    assert workload_of({**record, "gradient_buckets": eight}).fsdp_units == 8
    assert workload_of(record).fsdp_units == 5
    assert project(replace(kept, fsdp_units=8), 2, 2, slow,
                   measured_allreduce=lambda size: size / 1e9).step_s == pytest.approx(
        0.4 + 1 / 24 + 2 / 3 + 0.05)


@pytest.mark.serial  # its runs' step times are predicted within 15 %: no neighbour's load
def test_the_model_predicts_measured_runs_and_ddp_buckets(tmp_path):
    """Five runs of benchmarks/projection_validation.py's matrix, every delay (0, 10 and 30
    ms before each bucket), bucket size (0.25, 1 and 25 MB), node count (1, 2 on loopback)
    and hook (PowerSGD) once, are predicted from their own compute-only step, gradient
    timeline and probe; the buckets the model builds are the ones DDP's reducer reported.
    PowerSGD's run measured its own work (a DDP of each rank alone with the same hook).
    (The benchmark runs all seven.)"""
    from benchmarks.projection_validation import MATRIX, run_matrix

    chosen = tuple(m for m in MATRIX if (m.bucket_cap_mb, m.delay_ms, m.nodes, m.comm_hook) in (
        (1, 0, 1, "none"), (0.25, 10, 1, "none"), (25, 30, 1, "none"), (1, 10, 2, "none"),
        (1, 0, 1, "powersgd")))
    assert len(chosen) == 5
    run_matrix(tmp_path, matrix=chosen)
    proc = run_bench("project", str(tmp_path), "--validate")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "projection-validation.json").read_text())
    points = summary["points"]
    assert sorted((p["nodes"], p["bucket_cap_mb"], p["injected_delay_ms"], p["comm_hook"])
                  for p in points) == sorted((m.nodes, m.bucket_cap_mb, m.delay_ms, m.comm_hook)
                                             for m in chosen)
    (powersgd,) = [p for p in points if p["comm_hook"] == "powersgd"]
    assert 0 < powersgd["hook_work_ms"] < powersgd["compute_ms"], powersgd
    # the table names the hook whole ('powers' before), within 120 columns
    assert " powersgd " in proc.stdout, proc.stdout
    assert max(map(len, proc.stdout.splitlines())) <= 120, proc.stdout
    for point in points:
        assert point["gradient_timeline"], point
        assert point["buckets_ran"] == point["buckets_modelled"], point
        # one run on 2 CPU cores: the zero-delay point measured +0.9 to -26.2 % off over
        # repeats (docs/projection.md); the goal is the median's, below
        assert abs(point["error_pct"]) < 35, proc.stdout
    # over the plain DDP points (PowerSGD's step varies most from run to run): the model's
    # median |error| within 20 % (2026-11-28, alone: 8.0, 10.1, 13.6 %; in a fresh clone's
    # CI 16.3 %, which failed the 15 % bound then held, and 14.7 %)
    plain = [p for p in points if p["comm_hook"] == "none"]
    assert statistics.median(abs(p["error_pct"]) for p in plain) < 20, proc.stdout
    # and better than the guess that adds no communication where the two differ: at the
    # points that wait before each bucket, closer at two of the three, and their median at
    # most two thirds of its. (At zero delay the model adds under 1 ms to the same
    # compute-only step: both guesses are one there, and that run's noise, -13 to -17 % in
    # both in one CI run, decided a median taken over all four.) Not closer at each, nor
    # under half: the model leaves out what communication costs the compute on 2 shared
    # cores (the zero-delay points are measured 15-23 % above their compute-only step),
    # and a compute-only step moves by 20 % between repeats here. In the four runs of
    # 2026-11-28 whose figures were kept, the 25 MB point (one bucket, one 30 ms wait) came
    # out nearer no communication three times (its compute-only step 158-164 ms against
    # 109-138 for its neighbours), and the medians' ratio was 0.38, 0.40, 0.44 and 0.55
    # (model 9.0 against 16.2 %, the 2-loopback-node point's wait being smaller still). A
    # model that adds no communication is closer at none of them and its ratio is 1.
    waits = [p for p in plain if p["injected_delay_ms"] > 0]
    closer = [abs(p["error_pct"]) < abs(p["no_communication_error_pct"]) for p in waits]
    assert len(waits) == 3 and sum(closer) >= 2, proc.stdout
    model = statistics.median(abs(p["error_pct"]) for p in waits)
    no_comm = statistics.median(abs(p["no_communication_error_pct"]) for p in waits)
    assert model <= 2 * no_comm / 3, proc.stdout
    assert [len(p["buckets_ran"]) for p in points if p["bucket_cap_mb"] != 1] == [7, 1]
    plot = tmp_path / "efficiency.png"
    shown = run_bench("project", str(tmp_path), "--network", "probe", "--gpus", "2,16",
                      "--plot", str(plot))
    assert shown.returncode == 0, shown.stderr
    assert f"validated on {tmp_path} (" in shown.stdout.replace("\n  ", " ")
    assert "(projected from its runs" in shown.stdout
    assert "slow comm 30 ms" in shown.stdout and "injected delay" in shown.stdout
    assert "from datasheet rates" not in shown.stdout  # a probe's network: no such caveat
    assert plot.read_bytes()[:4] == b"\x89PNG"
    report = run_bench("report", "--results", str(tmp_path), "--format", "csv", "--no-write")
    rows = list(csv.DictReader(report.stdout.splitlines()))
    assert rows and all(r["projected_efficiency"].endswith("% (projected)") for r in rows)
    # what the demo shows on its folder (a probe and runs, like this one): the report with
    # its verdict and page, and a comparison (here of the folder with itself)
    page = tmp_path / "report.html"
    shown = run_bench("report", "--results", str(tmp_path), "--no-write", "--html", str(page))
    assert shown.returncode == 0 and "→ N=" in shown.stdout, shown.stdout + shown.stderr
    assert "<h2>Projection</h2>" in page.read_text()
    same = run_bench("compare", str(tmp_path), str(tmp_path))
    assert same.returncode == 0 and ", 0 regressed" in same.stderr, same.stdout + same.stderr


def test_the_projection_fits_a_terminal_of_80_columns():
    """On 80 columns (a terminal's default) the table was 88 wide and a workload over a
    shaped link 100, with a probe's name 86: each line folded, its last columns under its
    first. The table leaves out exposed (eff. says nearly as much), then nodes (its heading
    says the GPUs a node); a heading or a name longer than a line wraps. On 120 nothing
    is left out."""
    from conftest import ROOT

    args = ["project", str(ROOT / "results" / "testbed"), "--network", "probe"]
    narrow = run_bench(*args, env={"COLUMNS": "80"})
    wide = run_bench(*args)
    assert narrow.returncode == 0 and wide.returncode == 0, narrow.stderr + wide.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 80, narrow.stdout
    headers = [line.split() for line in narrow.stdout.splitlines() if line.startswith("strategy")]
    assert headers and all("exposed" not in h and "nodes" not in h for h in headers), headers
    # the projection is to 8 GPUs a node by default: a 64-GPU row is 8 nodes
    said = " ".join(narrow.stdout.split())
    assert said.count("8 GPUs a node,") == len(headers), narrow.stdout
    assert " over testbed-1000mbit (projected " in said, narrow.stdout
    headers = [line.split() for line in wide.stdout.splitlines() if line.startswith("strategy")]
    assert headers and all("exposed" in h and "nodes" in h for h in headers), headers
    assert "GPUs a node" not in wide.stdout, wide.stdout


def test_a_compute_step_its_record_contradicts_is_flagged_not_projected_in_silence(tmp_path):
    """A committed run whose compute_step_s was set to 1e6 s, its exposed_comm_fraction
    left as it was: the projection started from steps of 11 days, and said nothing (the
    warning read the record's fraction, not the step it projected from)."""
    import shutil

    from conftest import ROOT

    source = ROOT / "results" / "runs" / "20261121T183931Z-ddp-amp-2cpu-7e655c.json"
    rec = json.loads(source.read_text())
    assert -0.1 < rec["exposed_comm_fraction"] < 0.5  # the run's own: no warning
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / source.name).write_text(json.dumps({**rec, "compute_step_s": 1e6}))
    shutil.copytree(ROOT / "results" / "probes", tmp_path / "probes")
    proc = run_bench("project", str(tmp_path), "--network", "probe")
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "ddp-amp N=2" in said and "its compute-only step (1000000.00 s) ran slower than its " \
        "measured step" in said and "rerun it on an idle machine" in said, proc.stderr


def test_csv_keeps_options_with_commas_in_one_field_and_a_closed_pipe_is_quiet():
    import subprocess
    import sys

    from conftest import ROOT

    proc = run_bench("project", str(ROOT / "results"), "--gpus", "8,4096", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(proc.stdout.splitlines()))
    assert {r["options"] for r in rows} >= {"gpu-data,NHWC,compile,fused", "—"}
    assert {r["gpus"] for r in rows} == {"8", "4096"}
    text = run_bench("project", str(ROOT / "results"), "--gpus", "8,4096")
    lines = text.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, text.stdout
    # nn.DataParallel is not projected: one line says why at each count, no row of dashes
    assert not [line for line in lines if line.startswith("dp ") and "—  " in line], text.stdout
    # a datasheet network says what the published points showed of it
    joined = " ".join(text.stdout.split())
    assert "network h100-nvlink-ndr is from datasheet rates (not a probe): against 19 " \
           "published results the model did no better than 'no communication'" in joined
    assert "dp tf32 is not projected: 8 GPUs — 1 process: measure it; 4096 GPUs — 1 process, 1 " \
           "node max" in text.stdout
    head = subprocess.run(f"{sys.executable} -m bench project results --format csv | head -1",
                          shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in head.stderr and head.stdout.startswith("workload,"), head.stderr
    # the folder as `bench report` names it (it was "unrecognized arguments: --results")
    named = run_bench("project", "--results", str(ROOT / "results"), "--gpus", "8,4096",
                      "--format", "csv")
    assert named.returncode == 0 and named.stdout == proc.stdout, named.stderr
    two = run_bench("project", str(ROOT / "results"), "--results", str(ROOT / "docs"))
    assert two.returncode == 2 and "two results given" in two.stderr, two.stderr


def test_a_probe_projects_the_runs_of_the_device_it_measured_in_120_columns():
    """The committed results hold 2-process CPU probes (gloo; the newest across the 1 Gbit/s
    testbed link, 0.12 GB/s) and H100 and H200 runs. `--network probe` projected those GPU
    runs over it (4 % efficiency at 8 GPUs, 'all-reduce bandwidth'), in rows of 126
    columns: a mem/rank column of dashes, there for the CPU blocks, widened every block.
    The GPU runs are left out with a line saying why: 9 series of the README's H100 block
    and 7 of its H200."""
    proc = run_bench("project", str(ROOT / "results"), "--network", "probe")
    assert proc.returncode == 0, proc.stderr
    assert "H100" not in proc.stdout and "H200" not in proc.stdout, proc.stdout
    assert "AMD EPYC" in proc.stdout and "Intel Xeon" in proc.stdout
    said = " ".join(proc.stderr.split())
    assert ("bench project: 16 series not projected: no `bench probe` here measured their "
            "machine (H100 80GB HBM3, H200)") in said, said
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120, proc.stdout
    # mem/rank only where the block's runs measured their memory parts (the testbed's, not
    # the AMD EPYC table's older runs)
    blocks = "\n".join(lines).split("\n\n")  # a block's name (on one line or two), its rows
    headers = {block.split("\nstrategy")[0]: next(line for line in block.splitlines()
                                                  if line.startswith("strategy"))
               for block in blocks}
    epyc = next(h for block, h in headers.items() if block.startswith("synthetic d=0 1536 img")
                and "AMD EPYC" in block)
    assert "mem/rank" not in epyc, headers
    assert any("mem/rank" in h for h in headers.values()), headers
    # the accuracy block (8 ranks on 2 cores: its times are the crowding, and the report
    # shows its top-1 alone) was projected to 78,079 img/s at 64 GPUs from them
    assert "8192 img 16px" not in proc.stdout, proc.stdout
    assert ("synthetic d=0.25 8192 img 16px, batch 128, resnet18 x0.125 on Intel Xeon (2 cores) "
            "is not projected: some of its runs' ranks oversubscribed the cores") in said, said
    # each machine over its own probe: the AMD EPYC's loopback (1.78 GB/s), not the Intel
    # Xeon's 1 Gbit/s testbed link, the newest probe, which took its ddp to 63 % at 8 GPUs
    said_networks = [line for line in lines if line.startswith("network: probe")]
    assert [line.split()[2] for line in said_networks] == [
        "20261124T065755Z-allreduce-2cpu-1aa16e", "20261127T021632Z-allreduce-2cpu-66bc42"], lines
    # and each block says which of them it was projected over: with two "network:" lines and
    # four blocks, nothing said which block took which probe. The Intel Xeon's runs over its
    # loopback took the probe of the 1 Gbit/s testbed link (the only probe of that machine),
    # which is said; its runs over that link took it as theirs, which needs no word
    text = " ".join(proc.stdout.split())
    for block, probe in (("on AMD EPYC (2 cores)", "20261124T065755Z-allreduce-2cpu-1aa16e "
                          "(cpu gloo N=2)"),
                         ("on Intel Xeon (2 cores)", "20261127T021632Z-allreduce-2cpu-66bc42 "
                          "(cpu gloo N=2, testbed-1000mbit)"),
                         ("on Intel Xeon (2 cores), over testbed-1000mbit",
                          "20261127T021632Z-allreduce-2cpu-66bc42 (cpu gloo N=2, "
                          "testbed-1000mbit)")):
        assert (f"synthetic d=0 1536 img, batch 64, resnet18 {block} (projected from its runs "
                f"over probe {probe}, not measured)") in text, proc.stdout
    elsewhere = [line.strip() for line in said.split("bench project: ")
                 if "network its runs" in line]
    assert elsewhere == ["synthetic d=0 1536 img, batch 64, resnet18 on Intel Xeon (2 cores): "
                         "no probe here measured the network its runs crossed, so it is "
                         "projected over another its machine was probed on (named above its "
                         "rows); a `bench probe` over it (with its runs' --tag, if any) "
                         "measures its own"], said
    # nor in the report's columns (the page's projection table, summary.md): its 16 rows on
    # the Intel Xeon and 2 on the AMD EPYC (PowerSGD's 8 seeds and their reference)
    from bench.records.files import load_records
    from bench.records.probes import load_probes
    from bench.report import summary_table

    table = summary_table(load_records(ROOT / "results")[0],
                          probes=load_probes(ROOT / "results"))
    crowded = table[table["workload"].str.contains("8192 img 16px")]
    assert len(crowded) == 18 and not crowded["projected_efficiency"].notna().any(), crowded
    assert table["projected_efficiency"].notna().sum() >= 10  # the other CPU blocks' rows


def test_a_run_measured_at_its_input_pipelines_pace_projects_an_input_bottleneck(tmp_path):
    """The committed H100 ddp run trained at 18,868 img/s. Had its input pipeline fed only
    19,800 img/s alone (training at 95 % of it), its step was the loader's, and so is every
    projected step: the bottleneck says so. At 5x that feed it is compute."""
    import json

    from conftest import ROOT

    (source,) = [p for p in (ROOT / "results" / "runs").glob("20261123T*-ddp-1cuda-*.json")]
    rec = json.loads(source.read_text())
    for feed, expected in ((19_800.0, "input pipeline (as measured)"), (94_000.0, "compute")):
        folder = tmp_path / str(int(feed)) / "runs"
        folder.mkdir(parents=True)
        (folder / source.name).write_text(json.dumps({**rec, "loader_alone_images_per_s": feed}))
        proc = run_bench("project", str(folder.parent), "--gpus", "8", "--format", "json")
        assert proc.returncode == 0, proc.stderr
        (row,) = json.loads(proc.stdout)["rows"]
        assert row["bottleneck"] == expected, row


def test_published_scaling_points_are_predicted_within_ten_percent():
    """PyTorch's DDP benchmark (V100, 8 and 16 GPUs, 4 models) and NVIDIA's ResNet-50 TF32
    table (8 x A100) from their 1-GPU step times; the AMP point, which the published TF32
    run on the same machine does not share, is the stated miss (no input-pipeline term)."""
    from benchmarks.published_scaling import POINTS

    ddp_and_dle = [p for p in POINTS if not p.source.startswith("TensorFlow")]
    for point in ddp_and_dle:
        if point.precision == "AMP":
            assert point.error_pct < -10, point  # the model misses it: faster than published
        else:
            assert abs(point.error_pct) < 10, point
    assert len({p.model for p in ddp_and_dle}) == 4 and max(p.gpus for p in POINTS) == 16


def test_where_communication_costs_the_model_beats_the_null_models_only_with_a_probe():
    """TensorFlow's P100 points (VGG16, AlexNet; 2 to 8 GPUs), where the published step is up
    to 40 % over the 1-GPU one. From NVLink's rate the model sees no cost, as "no
    communication" does. Given the bus bandwidth of one point (what a probe would measure)
    it predicts AlexNet at 2 to 8 GPUs within 10 %, where both null models miss one by
    more than 20 %; VGG16 at batch 32 it overestimates by more than 40 % (docs/projection.md
    says why it cannot be right there)."""
    from benchmarks.published_scaling import POINTS, costly, fitted_network

    costs = costly()
    assert len(costs) >= 3 and all(p.communication_share >= 0.15 for p in costs)
    for point in (p for p in costs if p.source.startswith("TensorFlow")):
        assert point.error_pct < -20 and abs(point.error_pct
                                            - point.no_communication_error_pct) < 1, point
    tf = [p for p in POINTS if p.source.startswith("TensorFlow")]
    anchor = next(p for p in tf if p.model == "vgg16" and p.precision.endswith("64")
                  and p.gpus == 8)
    fitted = fitted_network(anchor)
    assert anchor.predicted_step_s(fitted) == pytest.approx(anchor.step_s, rel=1e-3)
    assert fitted.intra_busbw_gbps < 0.1 * anchor.network.intra_busbw_gbps  # far below NVLink
    alexnet = [p for p in tf if p.model == "alexnet"]
    assert len(alexnet) == 3
    for point in alexnet:
        error = (point.predicted_step_s(fitted) - point.step_s) / point.step_s
        serial = (point.no_overlap_step_s(fitted) - point.step_s) / point.step_s
        assert abs(error) < 0.10 and serial > 0.30, (point, error, serial)
    assert max(-p.no_communication_error_pct for p in alexnet) > 20
    vgg32 = next(p for p in tf if p.precision.endswith("32") and p.gpus == 4)
    assert vgg32.predicted_step_s(fitted) > 1.4 * vgg32.step_s
    # what `bench project` says over a datasheet network is these points' medians
    from bench.project.scaling import PUBLISHED_MEDIANS

    medians = {"model": [p.error_pct for p in costs],
               "no communication": [p.no_communication_error_pct for p in costs],
               "no overlap": [p.no_overlap_error_pct for p in costs]}
    assert {name: round(statistics.median(map(abs, errors)), 1)
            for name, errors in medians.items()} == PUBLISHED_MEDIANS
    assert len(POINTS) == 19


@pytest.mark.serial  # where backward starts in the step is a proportion of times: no load
def test_one_process_records_when_each_gradient_is_ready(tmp_path):
    """A 1-rank run has nothing to switch off but still measures its gradient timeline: every
    parameter once, in time order, backward after the first 3 of 4 accumulated micro-steps
    (alone, about 0.8 of the step; beside another worker's ranks it once measured 0.44: one
    slowed micro-step moves it anywhere, so it runs alone)."""
    assert_ok(run_bench("run", "--strategy", "ddp", "--cpu", "--gpus", "1", "--width", "0.125",
                        "--batch-size", "32", "--grad-accum", "4", "--epochs", "1",
                        "--train-limit", "128", "--test-limit", "32", "--data", "synthetic",
                        "--comm-probe-steps", "3", "--no-progress", "--output", str(tmp_path)))
    rec = only_record(tmp_path)
    timeline = GradientTimeline.from_record(rec["gradient_timeline"])
    assert timeline is not None and timeline.steps == 3
    assert timeline.elements == rec["model"]["parameters"]
    assert len(timeline.ready) == 62  # ResNet-18's parameter tensors
    assert 0.5 < timeline.backward_start < timeline.ready[0][1] < timeline.backward_end <= 1
    assert rec["comm_probe_steps"] == 0 and rec["compute_step_s"] is None
    # one rank: DDP's reducer keeps every gradient in one bucket (torch's own report)
    assert rec["gradient_buckets"] == [4 * rec["model"]["parameters"]]


def test_a_plot_file_must_be_png_or_svg(tmp_path):
    from conftest import ROOT

    proc = run_bench("project", str(ROOT / "results"), "--plot", str(tmp_path / "x.jpg"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert ".png or .svg" in proc.stderr and not (tmp_path / "x.jpg").exists()


def test_a_plot_of_more_than_ten_series_dashes_the_eleventh(tmp_path):
    """Eleven series in one panel: matplotlib's ten colours came round, the eleventh line
    drawn as the first. It is dashed now (SVG: its line's and its legend sample's
    stroke-dasharray beside the dotted 100 % line's own)."""
    from report_records import record

    from bench.project.plot import write_projection_plot

    runs = [({**record(f"r{i}", "ddp", 2, [2.0, 1.0], [0.1, 0.5]),
              "ddp_options": {"bucket_cap_mb": i + 1}},
             Workload("ddp", 0.1, 40_000_000, (i + 1) * 2**20)) for i in range(11)]
    for count, dashed in ((10, 1), (11, 3)):
        path = tmp_path / f"{count}.svg"
        write_projection_plot(path, runs[:count], [], [8, 64], 8, lambda rec: NET)
        assert path.read_text().count("stroke-dasharray") == dashed, count


def test_a_model_without_batchnorm_pays_no_syncbn_collectives():
    """A record that says 0 BatchNorm layers gets no SyncBatchNorm time; one from before
    the count was recorded is ResNet-18's 20 layers (2 collectives each)."""
    from bench.project.from_records import workload_of

    rec = {"strategy": "ddp", "world_size": 2, "compute_step_s": 0.1, "norm": "syncbn",
           "model": {"name": "user_models:tiny_cnn", "parameters": 1000,
                     "batchnorm_layers": 0}}
    latency = Network("flat", 1000.0, 1000.0, "nvlink", "test", fixed_latency_s=1e-3)
    plain = project(workload_of({**rec, "norm": "per-replica-bn"}), 2, 2, latency)
    assert project(workload_of(rec), 2, 2, latency).step_s == plain.step_s
    older = {**rec, "model": {"name": "resnet18-cifar", "parameters": 1000}}
    # each SyncBN collective: 2 ring steps x 1 ms, plus 4 KiB at 1 TB/s
    extra = 2 * 20 * (2e-3 + 4096 / 1e12)
    assert project(workload_of(older), 2, 2, latency).step_s == pytest.approx(
        plain.step_s + extra)


def test_a_compressing_hook_keeps_ddps_buckets_and_powersgd_sends_three_collectives():
    """DDP buckets the fp32 gradient whatever its hook sends: 10 M parameters (40 MB) in
    25 MiB buckets are 2 buckets under every hook. Each bucket's all-reduce costs 100 us
    plus 1 ns a byte; compute is negligible, so the step is its communication: plain
    2 x 100 us + 40 ms; the fp16 hook 2 x 100 us + 20 ms; PowerSGD (100,000 elements,
    400 kB) 2 buckets x 3 all-reduces (vectors, P, Q) x 100 us + 0.4 ms = 1.0 ms."""
    from bench.project.from_records import workload_of

    rec = {"strategy": "ddp", "compute_step_s": 1e-9, "world_size": 2, "norm": "none",
           "model": {"parameters": 10_000_000, "batchnorm_layers": 0}}
    hooks = {"plain": {},
             "fp16": {"ddp_options": {"comm_hook": "fp16"}},
             "powersgd": {"ddp_options": {"comm_hook": "powersgd", "powersgd_rank": 1},
                          "compressed_gradient_elements": 100_000}}
    works = {name: workload_of({**rec, **extra}) for name, extra in hooks.items()}
    steps = {name: project(work, 2, 2, NET, measured_allreduce=lambda size: 1e-4 + size / 1e9
                           ).step_s for name, work in works.items()}
    assert steps["plain"] == pytest.approx(2e-4 + 0.040, rel=1e-6)
    assert steps["fp16"] == pytest.approx(2e-4 + 0.020, rel=1e-6)
    assert steps["powersgd"] == pytest.approx(6e-4 + 4e-4, rel=1e-6)
    cap = works["powersgd"].bucket_bytes
    assert [round(size) for size, _ in works["powersgd"].buckets(cap)] == [262_144, 137_856]


def test_ddp_zero_broadcasts_its_parameters_whatever_compresses_the_gradient():
    """PowerSGD sends 100,000 of 10 M gradient elements; ZeRO still all-gathers the 40 MB of
    fp32 parameters after each step: at 1 GB/s (an all-reduce of B bytes takes B ns, the
    all-gather half of it) ddp-zero's step is 20 ms longer than ddp's."""
    from bench.project.from_records import workload_of

    rec = {"strategy": "ddp", "compute_step_s": 0.1, "world_size": 2, "norm": "none",
           "model": {"parameters": 10_000_000, "batchnorm_layers": 0},
           "ddp_options": {"comm_hook": "powersgd", "powersgd_rank": 1},
           "compressed_gradient_elements": 100_000}
    steps = {name: project(workload_of({**rec, "strategy": name}), 2, 2, NET,
                           measured_allreduce=lambda size: size / 1e9).step_s
             for name in ("ddp", "ddp-zero")}
    assert steps["ddp-zero"] - steps["ddp"] == pytest.approx(0.020)


def test_powersgd_projected_from_several_ranks_says_its_compression_work_is_left_out(tmp_path):
    """A multi-rank run's compute step is measured with gradient sync off, which skips
    PowerSGD's own work (its matrix products, orthogonalisation and error feedback). A run
    that did not measure it apart (`hook_work_s`: older records, --compile) projects
    without it, and the output says so. A run that measured it, a 1-rank run (whose step,
    its compute here, ran the hook) and a run without the hook have nothing to say."""
    import json

    from conftest import ROOT

    (source,) = [p for p in (ROOT / "results" / "runs").glob("20261123T*-ddp-1cuda-*.json")]
    rec = json.loads(source.read_text())
    powersgd = {"ddp_options": {**rec["ddp_options"], "comm_hook": "powersgd"},
                "compressed_gradient_elements": 100_000}
    several = {**rec, **powersgd, "world_size": 2, "compute_step_s": 0.02}
    cases = {"several ranks": several, "measured": {**several, "hook_work_s": 0.004},
             "one rank": {**rec, **powersgd}, "no hook": rec}
    for name, variant in cases.items():
        folder = tmp_path / name.replace(" ", "-") / "runs"
        folder.mkdir(parents=True)
        (folder / source.name).write_text(json.dumps(variant))
        proc = run_bench("project", str(folder.parent), "--gpus", "8", "--format", "json")
        assert proc.returncode == 0, proc.stderr
        said = "PowerSGD's own compression work" in json.loads(proc.stdout)["left_out"]
        assert said == (name == "several ranks"), (name, proc.stdout)


def test_powersgds_own_work_and_blocking_collectives_over_gloo_hold_up_backward():
    """PowerSGD of 10 M parameters in 2 buckets (26.2 and 13.8 MB of fp32 gradient), sending
    400 kB; each bucket's 3 all-reduces cost 3 x 100 us plus 1 ns a byte sent: 562.1 us for
    the first bucket's 262,144 bytes, 437.9 us for the second's. The 100 ms compute step
    leaves the first bucket's collectives hidden under backward over NCCL, so only the
    last bucket's show: +437.9 us. Over gloo bench waits for each bucket inside backward,
    so both show: +1.0 ms. The hook's own work (10 ms measured a step, alone) adds itself."""
    from bench.project.from_records import workload_of

    rec = {"strategy": "ddp", "compute_step_s": 0.1, "world_size": 2, "norm": "none",
           "model": {"parameters": 10_000_000, "batchnorm_layers": 0},
           "ddp_options": {"comm_hook": "powersgd", "powersgd_rank": 1},
           "compressed_gradient_elements": 100_000}

    def step(**extra):
        return project(workload_of({**rec, **extra}), 2, 2, NET,
                       measured_allreduce=lambda size: 1e-4 + size / 1e9).step_s

    assert step(backend="nccl") - 0.1 == pytest.approx(437.856e-6, rel=1e-4)
    assert step(backend="gloo") - 0.1 == pytest.approx(1.0e-3, rel=1e-4)
    assert step(backend="nccl", hook_work_s=0.01) - 0.1 == pytest.approx(0.01 + 437.856e-6,
                                                                         rel=1e-4)


def test_validation_prints_the_null_models_beside_the_model(tmp_path):
    """On the committed runs (no training: records only): each point's "no communication"
    error is its compute-only step against its measured step, read here from the record
    itself, and "no overlap" adds at least what the gradient's all-reduce costs, so it is
    never below "no communication"; the summary and `bench project` name both."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(ROOT / "results", results)
    proc = run_bench("project", str(results), "--validate")
    assert proc.returncode == 0, proc.stderr
    assert "no comm" in proc.stdout and "no ovl." in proc.stdout
    data = json.loads((results / "projection-validation.json").read_text())
    by_id = {}
    for path in (results / "runs").glob("*.json"):
        rec = json.loads(path.read_text())
        by_id[rec["run_id"]] = rec
    for point in data["points"]:
        rec = by_id[point["run_id"]]
        epochs = rec["per_epoch"][1:] or rec["per_epoch"]
        measured = statistics.median(e["step_time_p50_s"] for e in epochs)
        expected = 100 * (rec["compute_step_s"] - measured) / measured
        assert abs(point["no_communication_error_pct"] - expected) < 1e-6, point
        assert point["no_overlap_error_pct"] >= point["no_communication_error_pct"]
    said = proc.stderr.replace("\n  ", " ")  # as wrapped at 120 columns
    assert "no communication" in said and "no overlap" in said
    shown = run_bench("project", str(results))
    said = shown.stdout.replace("\n  ", " ")
    assert f"validated on {results} (" in said, said
    assert "the null models (median / worst): no communication" in said, said
    assert "stale" not in said, said
    # a run it predicted, gone: the kept validation no longer speaks for the folder
    gone = data["points"][0]["run_id"]
    next(p for p in (results / "runs").glob("*.json")
         if json.loads(p.read_text())["run_id"] == gone).unlink()
    said = run_bench("project", str(results)).stdout.replace("\n  ", " ")
    assert (f"stale (1 run it predicted gone): run `bench project {results} --validate` "
            "again") in said, said


def test_a_validation_of_one_run_says_run_not_runs():
    """A folder of two ddp repeats and two ddp-amp ones at N=2 with one run whose
    communication was a quarter of its step read '(1 runs)'; one run predicted, 'over 1
    runs'."""
    from bench.project.validation import summary_line, validation_summary

    def point(error, comm_share):
        return {"error_pct": error, "no_communication_error_pct": error - 2,
                "no_overlap_error_pct": error, "comm_share": comm_share, "spread_pct": None}

    two = [point(-28.2, 0.30), point(-8.6, 0.12)]
    line = summary_line({**validation_summary(two), "points": two})
    assert "over 2 runs;" in line and "(1 run), median |error| 28.2 %" in line, line
    line = summary_line({**validation_summary(two[:1]), "points": two[:1]})
    assert "over 1 run;" in line and "(1 run)," in line, line


def test_the_committed_validation_covers_the_committed_runs():
    """results/projection-validation.json said "over 17 runs" for two days after the
    testbed's 8 runs joined results/: `bench project results` printed it as the validation
    of the folder. Rows added to results/ must be validated again (`bench project results
    --validate`)."""
    said = run_bench("project", str(ROOT / "results")).stdout.replace("\n  ", " ")
    assert "validated on" in said and "stale" not in said, said


def test_the_readmes_testbed_figures_are_the_committed_validations(tmp_path):
    """The README's figures for the shaped link are results/testbed's validation, read
    again: the median |error| over every run, and over the runs whose buckets are
    all-reduced under backward (1 MB at 1 and 10 Gbit/s) the model's, "no overlap"'s and
    the model's with overlap free (its probes' contention left out, validated again). A
    testbed measured again must carry its figures into the README."""
    import shutil

    def overlap_median(points, key):
        return statistics.median(abs(p[key]) for p in points if p["bucket_cap_mb"] == 1
                                 and p["network"] in ("testbed-1000mbit", "testbed-10000mbit"))

    kept = json.loads((ROOT / "results" / "testbed" / "projection-validation.json").read_text())
    free = tmp_path / "testbed"
    shutil.copytree(ROOT / "results" / "testbed", free)
    for path in (free / "probes").glob("*.json"):
        probe = json.loads(path.read_text())
        assert probe.pop("contention", None), f"{path.name} measured no contention"
        path.write_text(json.dumps(probe))
    assert_ok(run_bench("project", str(free), "--validate"))
    free_points = json.loads((free / "projection-validation.json").read_text())["points"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    expected = (f"its median error is {kept['median_error_pct']:.1f} %",
                f"it is {overlap_median(kept['points'], 'error_pct'):.1f} % off and guessing",
                f"nothing overlapped\" {overlap_median(kept['points'], 'no_overlap_error_pct'):.1f}"
                " %", f"with overlap taken as free it was "
                f"{overlap_median(free_points, 'error_pct'):.1f} % off there")
    for text in expected:
        assert text in readme, text


def test_a_run_whose_compute_probe_ran_slow_is_projected_with_a_warning(tmp_path):
    """After `bench probe`, the demo projected ddp-spawn from a compute-only step of 3.4 s
    whose real step was 2.4 s (exposed communication -42 %: a slowed probe, flagged in the
    report) without a word. The same run with a probe below its step says nothing."""
    import json

    from conftest import ROOT

    (source,) = [p for p in (ROOT / "results" / "runs").glob("20261123T*-ddp-1cuda-*.json")]
    rec = json.loads(source.read_text())
    step = statistics.median(e["step_time_p50_s"] for e in rec["per_epoch"][1:])
    for name, compute in (("slowed", 1.42 * step), ("plain", 0.8 * step)):
        variant = {**rec, "world_size": 2, "compute_step_s": compute,
                   "exposed_comm_fraction": 1 - compute / step}
        folder = tmp_path / name / "runs"
        folder.mkdir(parents=True)
        (folder / source.name).write_text(json.dumps(variant))
        proc = run_bench("project", str(folder.parent), "--gpus", "8")
        assert proc.returncode == 0, proc.stderr
        warned = "ran slower than its measured step" in proc.stderr
        assert warned == (name == "slowed"), (name, proc.stderr)
        if warned:
            assert "exposed communication -42 %" in " ".join(proc.stderr.split())


def test_a_run_whose_cores_other_work_took_is_projected_with_a_warning(tmp_path):
    """A GPU run on 16 cores beside other work that kept 12 of them busy while its own kept
    4 (none idle: the report's `shared cores`) starts its projection from slowed steps, and
    the projection says so; beside 1 core's other work (11 idle) it says nothing."""
    import json

    from conftest import ROOT

    (source,) = [p for p in (ROOT / "results" / "runs").glob("20261123T*-ddp-1cuda-*.json")]
    rec = json.loads(source.read_text())
    for name, others in (("shared", 12.0), ("quiet", 1.0)):
        load = {"run": 4.0, "others": others, "steal": 0.0}
        variant = {**rec, "cpu_load_sampled": {"cores": 16},
                   "per_epoch": [{**e, "cpu_load": load} for e in rec["per_epoch"]]}
        folder = tmp_path / name / "runs"
        folder.mkdir(parents=True)
        (folder / source.name).write_text(json.dumps(variant))
        proc = run_bench("project", str(folder.parent), "--gpus", "8")
        assert proc.returncode == 0, proc.stderr
        said = " ".join(proc.stderr.split())
        warned = "other processes kept 12.0 of the 16 cores it could use busy" in said
        assert warned == (name == "shared"), (name, proc.stderr)
        assert ("projection starts from slowed steps" in said) == warned, said


def test_memory_per_rank_at_scale_divides_what_each_strategy_shards(tmp_path):
    """From a 2-rank run's memory_parts: ddp keeps 100 + 100 + 100 MiB of parameters,
    gradients and optimizer state at any N, ddp-zero divides the optimizer state by N, fsdp
    all three; activations (200 MiB) stay. With 0.41 GiB (419.8 MiB) a GPU: ddp never fits
    (500 MiB), ddp-zero from N=16 (400 + 100 x 2/N: 450, 425, then 412.5 MiB), fsdp from
    N=4 (200 + 300 x 2/N: 500 at 2, 350 at 4)."""
    import json

    from conftest import ROOT

    (source,) = [p for p in (ROOT / "results" / "runs").glob("20261123T*-ddp-1cuda-*.json")]
    rec = json.loads(source.read_text())
    mib = 2**20
    parts = {"parameters": 100 * mib, "gradients": 100 * mib, "optimizer_state": 100 * mib,
             "activations_and_workspace": 200 * mib, "peak": 500 * mib}
    folder = tmp_path / "runs"
    folder.mkdir()
    for strategy in ("ddp", "ddp-zero", "fsdp"):
        variant = {**rec, "run_id": f"r-{strategy}", "strategy": strategy, "world_size": 2,
                   "compute_step_s": 0.02, "memory_parts": parts}
        (folder / f"r-{strategy}.json").write_text(json.dumps(variant))
    proc = run_bench("project", str(tmp_path), "--gpus", "2,4,8,16", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    got = {(r["strategy"], r["gpus"]): r["memory_per_rank_gib"] * 1024
           for r in json.loads(proc.stdout)["rows"]}
    for n in (2, 4, 8, 16):
        assert got[("ddp", n)] == pytest.approx(500, abs=1)
        assert got[("ddp-zero", n)] == pytest.approx(400 + 100 * 2 / n, abs=1)
        assert got[("fsdp", n)] == pytest.approx(200 + 300 * 2 / n, abs=1)
    text = run_bench("project", str(tmp_path), "--gpus", "2,4,8,16", "--gpu-memory", "0.41")
    flat = " ".join(text.stdout.split())
    assert "0.41 GiB a GPU: ddp tf32 (—) fits at no N up to 16" in flat, flat
    assert "0.41 GiB a GPU: ddp-zero tf32 (—) fits from N=16 on" in flat
    assert "0.41 GiB a GPU: fsdp tf32 (—) fits from N=4 on" in flat
    assert "mem/rank" in text.stdout


def test_a_probe_of_no_runs_machine_is_one_line(tmp_path):
    """The committed H100 ddp run and the AMD EPYC's loopback probe: nothing to project over
    it. One line names the machine and the fix, exit 2, as bad input is told."""
    import shutil

    (source,) = [p for p in (ROOT / "results" / "runs").glob("20261123T*-ddp-1cuda-*.json")]
    (probe,) = (ROOT / "results" / "probes").glob("20261124T065755Z-*.json")
    for folder, path in (("runs", source), ("probes", probe)):
        (tmp_path / folder).mkdir()
        shutil.copy(path, tmp_path / folder / path.name)
    proc = run_bench("project", str(tmp_path), "--network", "probe")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"bench: error: --network probe: no probe in {tmp_path} measured the machine of its "
        "runs (H100 80GB HBM3); run `bench probe` there, or name a --network"], proc.stderr
    assert proc.stdout == ""


def test_figures_given_on_the_command_line_name_the_network_they_project_over():
    """`--intra-busbw 10 --inter-busbw 5` named its network "custom": each block's heading
    read "(projected from its runs over custom, not measured)"."""
    proc = run_bench("project", str(ROOT / "results"), "--intra-busbw", "10", "--inter-busbw",
                     "5", "--gpus", "8")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert ("resnet18 on H200 (projected from its runs over busbw 10 GB/s in a node and 5 GB/s "
            "across nodes, not measured)") in text, proc.stdout
    assert ("network: busbw 10 GB/s in a node and 5 GB/s across nodes — given on the command "
            "line") in text, proc.stdout
    assert "custom" not in proc.stdout


def test_the_validation_says_what_the_model_gains_over_each_guess():
    """A prediction is worth what it gains over the obvious guess: the validation's line
    says so in words, not only the medians side by side (on the committed loopback runs the
    model was no closer than the guess that communication costs nothing, and a reader had
    to find it). A gain within half the repeats' spread is none."""
    from bench.project.validation import summary_line

    def summary(model, no_comm, no_overlap, heavy=None, spread=8.0):
        s = {"points": [{}] * 40, "median_error_pct": model, "worst_error_pct": 3 * model,
             "no_communication_median_error_pct": no_comm,
             "no_communication_worst_error_pct": 90.0,
             "no_overlap_median_error_pct": no_overlap, "no_overlap_worst_error_pct": 40.0,
             "comm_heavy_runs": 0, "median_repeat_spread_pct": spread}
        if heavy:
            s.update(comm_heavy_runs=30, comm_heavy_median_error_pct=heavy[0],
                     no_communication_comm_heavy_median_error_pct=heavy[1],
                     no_overlap_comm_heavy_median_error_pct=heavy[2])
        return " ".join(summary_line(s).split())

    # the testbed's: far closer than no communication, within ±4 % of no overlap
    line = summary(4.8, 68.0, 4.7, heavy=(3.6, 87.7, 3.5))
    assert line.endswith(
        "so the model is closer than no communication by 63.2 points and no closer than no "
        "overlap (where communication is 25 % or more: closer than no communication by 84.1 "
        "points and no closer than no overlap), a difference within ±4.0% (half the repeats' "
        "spread) counting as none"), line
    # within the noise of both: one phrase
    assert "so the model is no closer than either, a difference within ±4.0%" in summary(
        10.2, 13.9, 10.0)
    # worse than a guess beyond the noise, and no repeats to say what the noise is
    line = summary(20.9, 29.6, 4.6, spread=None)
    assert line.endswith("so the model is closer than no communication by 8.7 points and "
                         "further than no overlap by 16.3 points (no repeats here say how "
                         "far a point's step moves)"), line


def test_the_readmes_beyond_two_ranks_figures_are_the_committed_scaling():
    """The README's figures for 3 and 4 nodes are results/testbed-scaling's, computed again
    from its probes and records (benchmarks/testbed_scaling.py): DDP predicted from the
    2-node probe against "communication as at 2 nodes", and the all-reduce from 1 MiB up
    and below it. A scaling measured again must carry its figures into the README, and its
    kept scaling.json must be what its records say."""
    from bench.records.files import load_records
    from benchmarks.testbed_scaling import compare, compare_runs, load, timed_by

    folder = ROOT / "results" / "testbed-scaling"
    probes = load(folder)
    result = compare(probes)
    runs = compare_runs(load_records(folder)[0], probes)
    # the same fitted to each size's mean call, which the probes keep beside the median
    means = compare([timed_by(p, "time_mean_s") for p in probes])
    kept = json.loads((folder / "scaling.json").read_text())
    for key in ("all_sizes", "from_1_mib", "below_1_mib"):
        assert result[key] == pytest.approx(kept[key]), key
        assert means[key] == pytest.approx(kept["by_mean"][key]), key
    assert runs == pytest.approx(kept["runs"]) and len(runs) == 12

    def median(key: str) -> float:
        return statistics.median(abs(r[f"{key}_error_pct"]) for r in runs)

    worst = max(abs(r["model_error_pct"]) for r in runs)
    readme = " ".join((ROOT / "README.md").read_text().split())
    expected = (f"is {median('model'):.1f} % off (median of 12 runs, worst {worst:.1f} %",
                f"\"communication costs what it did at 2 nodes\" is {median('comm_as_at_2'):.1f}"
                " % off", f"from 1 MiB up, {result['from_1_mib']['model']:.1f} % against "
                f"{result['from_1_mib']['as_at_2']:.1f} %",
                f"Below 1 MiB it is {result['below_1_mib']['model']:.0f} % off",
                f"which predicts small messages within {means['below_1_mib']['model']:.0f} % "
                f"but large ones worse ({means['from_1_mib']['model']:.1f} %)")
    for text in expected:
        assert text in readme, text


def test_validate_predicts_runs_past_their_smallest_probe_as_the_projection_does(tmp_path):
    """`bench project --validate` on the 3- and 4-node runs of results/testbed-scaling also
    predicts each from the probe at the fewest ranks below its own (2 nodes), its all-reduce
    taken to the run's ranks by the model, as a projection past its probe is, beside
    "communication as at the probe's ranks": measured there, a ring's 4/3 and 3/2 of the
    2-node communication are what the runs took, so the model must beat that guess by a
    wide margin. Without the 2-node probes the 4-node runs are predicted from the 3-node
    one, and the 3-node runs from none."""
    import shutil

    folder = tmp_path / "scaling"
    shutil.copytree(ROOT / "results" / "testbed-scaling", folder)
    assert_ok(proc := run_bench("project", str(folder), "--validate"))
    said = " ".join(proc.stderr.split())
    assert "From a probe at fewer ranks, as it projects: 12 runs at N=3/4 from N=2" in said, said
    kept = json.loads((folder / "projection-validation.json").read_text())
    by_n = {n: [p for p in kept["points"] if p["world_size"] == n] for n in (2, 3, 4)}
    assert all(p["extrapolated_from"] is None for p in by_n[2]) and len(by_n[2]) == 6
    assert all(p["extrapolated_from"] == 2 for p in by_n[3] + by_n[4])
    assert kept["extrapolated_median_error_pct"] < 5, kept
    assert kept["comm_as_probed_median_error_pct"] > kept["extrapolated_median_error_pct"] + 10
    for path in (folder / "probes").glob("*-allreduce-2cpu-*.json"):
        path.unlink()
    assert_ok(run_bench("project", str(folder), "--validate"))
    kept = json.loads((folder / "projection-validation.json").read_text())
    assert {p["world_size"]: p["extrapolated_from"] for p in kept["points"]} == {3: None, 4: 3}
    assert kept["extrapolated_runs"] == 6, kept
