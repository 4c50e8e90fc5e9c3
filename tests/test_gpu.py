"""CUDA paths: NCCL, SyncBatchNorm, fp16 + GradScaler, CUDA timing and memory.
Skipped (with the reason) where no GPU is visible."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import FAST, assert_ok, only_record, run_bench

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _run(tmp_path, *args: str):
    return run_bench(
        "run", *args, "--epochs", "2", "--data", "synthetic", "--train-limit", "512",
        "--test-limit", "100", "--output", str(tmp_path), *FAST,
    )


def _two_ranks() -> list[str]:
    """Two ranks: one GPU each where there are two, else both on cuda:0 over gloo."""
    return ["--gpus", "2"] + ([] if _gpus() >= 2 else ["--backend", "gloo"])


def test_ddp_on_cuda_uses_nccl(tmp_path):
    world = min(2, _gpus())
    proc = _run(tmp_path, "--strategy", "ddp", "--gpus", str(world))
    assert_ok(proc)
    rec = only_record(tmp_path)
    assert rec["device"] == "cuda" and rec["env"]["gpus"] and rec["env"]["nccl"]
    assert rec["backend"] == "nccl"
    assert rec["per_epoch"][-1]["test_images"] == 100
    # CUDA max-allocated memory of a small model is far below a CPU process's RSS.
    assert 0 < rec["per_epoch"][-1]["peak_mem_bytes"] < 4 * 2**30
    # Every epoch's timed window has the GPUs' clocks (NVML comes with the driver), and the
    # epoch's line shows them.
    assert rec["gpu_clocks"].startswith("nvml"), rec["gpu_clocks"]
    for entry in rec["per_epoch"]:
        clocks = entry["gpu_clocks"]
        assert clocks["samples"] >= 1 and 0 < clocks["sm_mhz_median"] <= clocks["sm_mhz_max"]
        assert 0 < clocks["temperature_c_max"] < 120 and 0 < clocks["util_pct_median"] <= 100
    assert proc.stdout.count(" MHz ") == len(rec["per_epoch"]), proc.stdout
    assert 0 < rec["summary"]["gpu_clock_share"] <= 1 and "% of max" in proc.stdout
    assert all(enforced > 0 and default > 0 for enforced, default in rec["gpu_power_limits_w"])
    # the energy counter (Volta and newer): each epoch's joules, the run's images per joule,
    # within what the GPUs' power limits allow over the epoch's time
    for entry in rec["per_epoch"]:
        limit_w = max(e for e, _ in rec["gpu_power_limits_w"]) * rec["world_size"]
        assert 0 < entry["gpu_clocks"]["energy_j"] <= 1.1 * limit_w * entry["train_time_s"]
    assert rec["summary"]["images_per_joule"] > 0 and " img/J" in proc.stdout
    # the input pipeline alone (pinned workers, copies to the GPU): training cannot have
    # been fed faster than it can feed, give or take noise
    trained = rec["summary"]["median_images_per_s"]
    assert rec["loader_probe_steps"] == 30
    assert all(0 <= e["input_wait_s"] <= e["train_time_s"] for e in rec["per_epoch"])
    assert rec["loader_alone_images_per_s"] >= 0.8 * trained, (rec["loader_alone_images_per_s"],
                                                               trained)


def test_ddp_on_cuda_syncs_batchnorm_across_two_ranks(tmp_path):
    assert_ok(_run(tmp_path, "--strategy", "ddp", *_two_ranks()))
    rec = only_record(tmp_path)
    assert rec["world_size"] == 2 and rec["norm"] == "syncbn" and rec["replicas_identical"]
    assert all(e["gpu_clocks"]["samples"] >= 1 for e in rec["per_epoch"])  # reduced over ranks


def test_ddp_no_syncbn_flag_is_recorded(tmp_path):
    assert_ok(_run(tmp_path, "--strategy", "ddp-spawn", *_two_ranks(), "--no-syncbn"))
    assert only_record(tmp_path)["norm"] == "per-replica-bn"


def test_dp_on_cuda(tmp_path):
    world = min(2, _gpus())
    assert_ok(_run(tmp_path, "--strategy", "dp", "--gpus", str(world)))
    rec = only_record(tmp_path)
    assert rec["world_size"] == world and rec["processes"] == 1 and rec["device"] == "cuda"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_on_cuda(precision, tmp_path):
    assert_ok(_run(tmp_path, "--strategy", "ddp", "--gpus", "1", "--precision", precision))
    rec = only_record(tmp_path)
    assert rec["precision"] == precision
    assert all(e["train_loss"] == e["train_loss"] for e in rec["per_epoch"])  # not NaN


def test_too_many_gpus_names_cpu(tmp_path):
    proc = run_bench("run", "--strategy", "ddp", "--gpus", str(_gpus() + 1),
                     "--data", "synthetic", "--output", str(tmp_path))
    assert proc.returncode == 2 and "--cpu" in proc.stderr


def test_cuda_out_of_memory_is_one_line_naming_the_batch(tmp_path):
    """torch's CUDA allocator refusing 4 EiB (BENCH_FAULT oom) on the rank's GPU: the record
    and the last line say how many images the GPU held at once and the fix, from torch's
    own message (its figures: what was asked, what was free)."""
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "1", "--epochs", "1",
                     "--data", "synthetic", "--train-limit", "512", "--test-limit", "100",
                     "--output", str(tmp_path), *FAST, env={"BENCH_FAULT": "oom:0:2"})
    assert proc.returncode == 1, proc.stderr
    rec = only_record(tmp_path)
    assert rec["error"].startswith("rank 0: out of memory on cuda:0: tried to allocate "), rec
    assert " free of " in rec["error"] and "; 32 images per GPU at once: lower --batch-size, " \
        "or keep it and add --grad-accum 2" in rec["error"], rec["error"]
    assert "OutOfMemoryError" in rec["error_traceback"]
    assert "Traceback" not in proc.stderr, proc.stderr


def test_fp16_uses_a_grad_scaler(tmp_path):
    assert_ok(_run(tmp_path / "fp16", "--strategy", "ddp-amp", "--gpus", "1"))  # fp16 default
    rec = only_record(tmp_path / "fp16")
    steps = sum(1 for _ in rec["per_epoch"]) * rec["steps_per_epoch"]
    # The scaler ran: its scale is a power of two, and it skipped fewer steps than ran.
    assert rec["precision"] == "fp16" and rec["loss_scale"] > 0
    assert math.log2(rec["loss_scale"]).is_integer()
    assert 0 <= rec["scaler_skipped_steps"] < steps
    assert_ok(_run(tmp_path / "bf16", "--strategy", "ddp-amp", "--gpus", "1",
                   "--precision", "bf16"))
    bf16 = only_record(tmp_path / "bf16")
    assert bf16["loss_scale"] is None and bf16["scaler_skipped_steps"] is None


def test_apex_o1_on_cuda(tmp_path):
    from strategies.apex import apex_problem

    problem = apex_problem()
    if problem:
        pytest.skip(f"NVIDIA apex unavailable: {problem}")
    assert_ok(_run(tmp_path, "--strategy", "ddp-apex", "--gpus", str(min(2, _gpus()))))
    rec = only_record(tmp_path)
    assert rec["precision"] == "apex-O1" and rec["status"] == "ok"


def test_horovod_on_cuda(tmp_path):
    """With one GPU this shows the NCCL build trains and records per-replica BN; it cannot
    show hvd.SyncBatchNorm, which needs 2 ranks with a GPU each (next test)."""
    from strategies.horovod import HorovodStrategy

    reason = HorovodStrategy("horovod").requires("cuda")
    if reason:
        pytest.skip(f"horovod with NCCL unavailable: {reason}")
    world = min(2, _gpus())
    assert_ok(_run(tmp_path, "--strategy", "horovod", "--gpus", str(world)))
    rec = only_record(tmp_path)
    assert rec["norm"] == ("syncbn" if world > 1 else "per-replica-bn")
    assert rec["replicas_identical"] is True


def test_horovod_syncbn_across_two_gpus(tmp_path):
    from strategies.horovod import HorovodStrategy

    if _gpus() < 2:
        pytest.skip("needs 2 GPUs: Horovod's NCCL build cannot put 2 ranks on one GPU")
    reason = HorovodStrategy("horovod").requires("cuda")
    if reason:
        pytest.skip(f"horovod with NCCL unavailable: {reason}")
    assert_ok(_run(tmp_path, "--strategy", "horovod", "--gpus", "2"))
    assert only_record(tmp_path)["norm"] == "syncbn"


def test_compile_reduce_overhead_replays_cuda_graphs(tmp_path):
    """The fastest path with CUDA graphs: the record says whether inductor really replayed
    them (it skips a graph it cannot capture, with its reason), and the report's row names
    the mode."""
    assert_ok(_run(tmp_path, "--strategy", "ddp-amp", "--precision", "bf16", "--loader", "gpu",
                   "--channels-last", "--optimizer-impl", "fused", "--compile",
                   "reduce-overhead"))
    rec = only_record(tmp_path)
    assert rec["compile_mode"] == "reduce-overhead" and rec["cudagraphs"] == "used", rec
    assert rec["replicas_identical"] and math.isfinite(rec["per_epoch"][-1]["train_loss"])


def test_tf32_is_explicit_and_labelled(tmp_path):
    assert_ok(_run(tmp_path / "default", "--strategy", "ddp", "--gpus", "1"))
    default = only_record(tmp_path / "default")
    assert default["allow_tf32"] is True and default["precision"] == "tf32"
    assert_ok(_run(tmp_path / "off", "--strategy", "ddp", "--gpus", "1", "--tf32", "off"))
    off = only_record(tmp_path / "off")
    assert off["allow_tf32"] is False and off["precision"] == "fp32"


def test_dp_replicas_compute_in_the_runs_dtype():
    """nn.DataParallel re-enters autocast per replica thread without the dtype (fp16 on
    CUDA): under a bf16 run every replica must still compute in bf16."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs: DataParallel replicates only over several")
    from strategies.dp import autocast_in_replicas

    seen = []
    model = torch.nn.Linear(8, 8).cuda()
    model.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    autocast_in_replicas(model, "cuda", torch.bfloat16)
    net = torch.nn.DataParallel(model, device_ids=[0, 1])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        net(torch.randn(4, 8, device="cuda"))
    assert seen and set(seen) == {torch.bfloat16}, seen


def test_syncbn_with_two_ranks_sharing_one_gpu_equals_whole_batch_bn():
    """--backend gloo puts several ranks on one GPU: SyncBatchNorm there must still act
    as BatchNorm over the global batch (output, input grad, parameter grads, running
    stats within 1e-5, in float64)."""
    import subprocess
    import sys
    from pathlib import Path

    from bench.tools.ports import free_port

    script = Path(__file__).with_name("syncbn_shared_check.py")
    proc = subprocess.run([sys.executable, str(script), str(free_port())],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("max |syncbn") == 5


def test_ranks_sharing_a_gpu_are_recorded_and_marked(tmp_path):
    gpus = _gpus() + 1  # one more rank than GPUs: two share cuda:0
    assert_ok(_run(tmp_path, "--strategy", "ddp", "--gpus", str(gpus), "--backend", "gloo"))
    rec = only_record(tmp_path)
    assert rec["gpu_shared"] is True and rec["backend"] == "gloo" and rec["norm"] == "syncbn"
    # each rank would count the shared GPU's energy: none is recorded
    assert all(e["gpu_clocks"]["energy_j"] is None for e in rec["per_epoch"]), rec["per_epoch"]
    report = run_bench("report", "--results", str(tmp_path))
    # the table marks the row; the sentence why goes with the report's other notes (stderr)
    assert "(shared)" in report.stdout and "shared GPUs" in report.stdout, report.stdout
    assert "not comparable" in report.stderr, report.stderr
