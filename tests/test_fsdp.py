"""fsdp (FSDP2 fully_shard) on CPU with gloo: real ranks under torchrun."""

from __future__ import annotations

import pytest
from conftest import FAST, PROBE, assert_comm_probe, assert_ok, only_record, run_bench

from bench.records.schema import EPOCH_FIELDS, RECORD_FIELDS

# Same seed, same data, fp32: FSDP's reduce-scatter + all-gather and DDP's all-reduce must
# give the same parameters up to summation order.
PARAM_TOLERANCE = 1e-6


def _run(strategy, gpus, cifar_dir, out, *extra):
    return run_bench(
        "run", "--strategy", strategy, "--gpus", str(gpus), "--cpu", "--epochs", "2",
        "--data", "cifar100", "--data-dir", str(cifar_dir), "--no-download",
        "--output", str(out), *FAST, *extra,
    )


def test_fsdp_two_ranks_match_ddp(cifar_dir, tmp_path):
    assert_ok(_run("fsdp", 2, cifar_dir, tmp_path / "fsdp", "--seed", "3", *PROBE))
    assert_ok(_run("ddp", 2, cifar_dir, tmp_path / "ddp", "--seed", "3", *PROBE))
    fsdp, ddp = only_record(tmp_path / "fsdp"), only_record(tmp_path / "ddp")
    assert not [f for f in RECORD_FIELDS if f not in fsdp]
    assert all(not [f for f in EPOCH_FIELDS if f not in e] for e in fsdp["per_epoch"])
    assert fsdp["status"] == "ok" and fsdp["launcher"] == "torchrun"
    assert fsdp["norm"] == "per-replica-bn"
    assert fsdp["replicas_identical"] is None  # sharded: nothing is replicated to compare
    assert fsdp["initial_replicas_identical"] is None
    assert fsdp["initial_param_fingerprint"] == ddp["initial_param_fingerprint"]
    assert_comm_probe(fsdp)
    assert_comm_probe(ddp)
    # parameters gathered once and kept for the probe: nothing on the wire in its steps
    assert fsdp["comm_probe_note"] is None, fsdp["comm_probe_note"]
    assert [e["test_images"] for e in fsdp["per_epoch"]] == [10, 10]
    for a, b in zip(fsdp["param_fingerprint"], ddp["param_fingerprint"]):
        assert a == pytest.approx(b, rel=PARAM_TOLERANCE)
    assert [e["data_order_sha1"] for e in fsdp["per_epoch"]] == [
        e["data_order_sha1"] for e in ddp["per_epoch"]
    ]
    # memory by parts: a DDP replica holds the model whole (4 bytes a parameter; SGD's
    # momentum as much again), an FSDP rank half of each (its shards, padding aside)
    whole = 4 * ddp["model"]["parameters"]
    mem = ddp["memory_parts"]
    assert mem["parameters"] == mem["gradients"] == mem["optimizer_state"] == whole, mem
    assert mem["peak"] > 3 * whole and mem["activations_and_workspace"] == mem["peak"] - 3 * whole
    for part in ("parameters", "gradients", "optimizer_state"):
        assert 0.5 * whole <= fsdp["memory_parts"][part] < 0.52 * whole, fsdp["memory_parts"]


def test_fsdp_uneven_test_shards_are_padded_not_counted(cifar_dir, tmp_path):
    assert_ok(_run("fsdp", 3, cifar_dir, tmp_path, "--batch-size", "30", "--epochs", "1"))
    assert only_record(tmp_path)["per_epoch"][0]["test_images"] == 10


def test_fsdp_bf16_uses_fsdp_mixed_precision(cifar_dir, tmp_path):
    assert_ok(_run("fsdp", 2, cifar_dir, tmp_path, "--precision", "bf16", "--epochs", "1"))
    rec = only_record(tmp_path)
    assert rec["precision"] == "bf16"
    assert any("MixedPrecisionPolicy" in n for n in rec["notes"])
