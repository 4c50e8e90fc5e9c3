"""Gradient accumulation and DDP's knobs: recorded, and really used."""

from __future__ import annotations

import json
import re

import pytest
import torch.multiprocessing as mp
from conftest import FAST, assert_ok, only_record, run_bench
from ddp_grad_check import knobs_main

from bench.tools.ports import free_port

KNOBS = {"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True, "static_graph": True,
         "find_unused_parameters": True, "broadcast_buffers": False}
DEFAULTS = {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": False, "static_graph": False,
            "find_unused_parameters": False, "broadcast_buffers": True}


@pytest.mark.parametrize("knobs", [KNOBS, DEFAULTS], ids=["set", "defaults"])
def test_knobs_change_what_ddp_is_built_with(knobs, tmp_path):
    mp.spawn(knobs_main, args=(2, free_port(), str(tmp_path), knobs), nprocs=2, join=True)
    seen = json.loads((tmp_path / "knobs.json").read_text())
    assert seen["bucket_bytes_cap"] == int(knobs["bucket_cap_mb"] * 1024 * 1024)
    for name in ("gradient_as_bucket_view", "static_graph", "find_unused_parameters",
                 "broadcast_buffers"):
        assert seen[name] == knobs[name], name


def _run(cifar_dir, out, *extra):
    return run_bench(
        "run", "--strategy", "ddp", "--gpus", "2", "--cpu", "--epochs", "1", "--data",
        "cifar100", "--data-dir", str(cifar_dir), "--no-download", "--output", str(out),
        *FAST, *extra,
    )


def test_knobs_are_recorded(cifar_dir, tmp_path):
    proc = _run(cifar_dir, tmp_path, "--bucket-cap-mb", "5", "--gradient-as-bucket-view",
                "--static-graph", "--find-unused-parameters", "--no-broadcast-buffers")
    assert_ok(proc)
    # torch 2.14 deprecates the argument broadcast_buffers, once per rank and wrap
    assert "FutureWarning" not in proc.stderr, proc.stderr
    rec = only_record(tmp_path)
    assert rec["ddp_options"] == {**KNOBS, "comm_hook": "none", "powersgd_rank": 1,
                                  "cpu_syncbn": False}
    assert rec["grad_accum"] == 1
    assert rec["replicas_identical"] is True


def test_static_graph_with_grad_accum_is_refused(cifar_dir, tmp_path):
    proc = _run(cifar_dir, tmp_path, "--static-graph", "--grad-accum", "2")
    assert proc.returncode == 2 and "--static-graph" in proc.stderr


def test_grad_accum_is_recorded(cifar_dir, tmp_path):
    proc = _run(cifar_dir, tmp_path, "--grad-accum", "4", "--find-unused-parameters")
    assert_ok(proc)
    # DDP's C++ warning that no parameter went unused, logged by every rank: shown once
    assert proc.stderr.count("did not find any unused parameters") == 1, proc.stderr
    rec = only_record(tmp_path)
    assert rec["ddp_options"]["find_unused_parameters"] is True
    assert rec["grad_accum"] == 4 and rec["global_batch"] == 32
    assert rec["per_rank_batch"] == 16 and rec["micro_batch_per_replica"] == 4
    assert rec["bn_batch_size"] == 4
    assert rec["per_epoch"][0]["train_images"] == 256  # 8 optimizer steps x 32
    assert rec["replicas_identical"] is True


def test_grad_accum_trains_like_the_full_batch():
    """K=4 with a quarter of the per-rank batch per micro-step trains as K=1 with the full
    batch (BatchNorm, whose statistics see the micro-batch, reproduced by the reference)."""
    proc = run_bench("verify", "--cpu", "--gpus", "2", "--steps", "3", "--width", "0.125",
                     "--batch-size", "64", "--image-size", "16", "--grad-accum", "4",
                     "--strategies", "ddp,dp",
                     timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r"^(ddp|dp)\s+pass .*x 4 micro", proc.stdout, re.M)) == 2


def test_grad_accum_must_divide_the_per_rank_batch(tmp_path):
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "2", "--cpu", "--data",
                     "synthetic", "--batch-size", "36", "--grad-accum", "4",
                     "--output", str(tmp_path))
    assert proc.returncode == 2 and "x 4 micro-batches" in proc.stderr


def test_static_graph_with_a_comm_hook_measures_the_hook(cifar_dir, tmp_path):
    """The hook's own work is measured on a copy of the model over its rank alone, whose
    first step must synchronise: a static graph is recorded in DDP's first iteration, and
    one under no_sync failed torch's internal assert after the epochs had trained."""
    assert_ok(_run(cifar_dir, tmp_path, "--static-graph", "--ddp-comm-hook", "bf16",
                   "--comm-probe-steps", "4"))
    rec = only_record(tmp_path)
    assert rec["ddp_options"]["static_graph"] is True
    assert rec["ddp_options"]["comm_hook"] == "bf16"
    assert isinstance(rec["hook_work_s"], float) and rec["hook_work_s"] >= 0
