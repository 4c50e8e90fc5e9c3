"""Horovod under horovodrun (Gloo). Needs `make horovod`; skipped with that reason otherwise."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import FAST, assert_ok, only_record, run_bench

from strategies.horovod import HorovodStrategy

REASON = HorovodStrategy("horovod").requires("cpu")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"horovod unavailable: {REASON}")


def _run(cifar_dir, out, *extra: str):
    return run_bench(
        "run", "--strategy", "horovod", "--gpus", "2", "--cpu", "--epochs", "2",
        "--data", "cifar100", "--data-dir", str(cifar_dir), "--no-download",
        "--output", str(out), *FAST, *extra, timeout=600,
    )


def test_horovod_two_ranks_two_epochs(cifar_dir, tmp_path):
    assert_ok(_run(cifar_dir, tmp_path))
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["launcher"] == "horovodrun"
    assert rec["world_size"] == 2 and rec["processes"] == 2
    assert rec["norm"] == "per-replica-bn"
    assert rec["replicas_identical"] is True  # parameters identical across ranks
    for epoch in rec["per_epoch"]:
        assert epoch["test_images"] == 10  # exact eval: hvd.allreduce asked to Sum
        assert epoch["train_images"] == 256
    # Same seed, same global batches as every other strategy.
    assert len({e["data_order_sha1"] for e in rec["per_epoch"]}) == 2


def test_horovod_fp16_compression_is_recorded(cifar_dir, tmp_path):
    assert_ok(_run(cifar_dir, tmp_path, "--hvd-compression", "fp16", "--epochs", "1"))
    rec = only_record(tmp_path)
    assert rec["config"]["hvd_compression"] == "fp16"
    assert any("compression: fp16" in n for n in rec["notes"])


def test_horovod_is_importable_when_built():
    assert importlib.util.find_spec("horovod.torch") is not None


def test_horovod_compile_warm_up(cifar_dir, tmp_path):
    # The warm-up's backward has no step: Horovod refuses a bare zero_grad() there.
    assert_ok(_run(cifar_dir, tmp_path, "--compile", "--epochs", "1"))
    rec = only_record(tmp_path)
    assert rec["compile"] is True and rec["compile_time_s"] > 0
