"""Horovod under horovodrun (Gloo). Needs `make horovod`; skipped with that reason otherwise."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from conftest import (
    FAST,
    NO_PROBE,
    PROBE,
    USER_MODELS,
    assert_comm_probe,
    assert_ok,
    only_record,
    run_bench,
)

from strategies.horovod import HorovodStrategy

REASON = HorovodStrategy("horovod").requires("cpu")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"horovod unavailable: {REASON}")


# what FAST runs with the model a user writes instead of ResNet-18 (x0.125)
TINY_CNN = ["--model", "user_models:tiny_cnn", "--batch-size", "32", "--no-progress", *NO_PROBE]


def _run(cifar_dir, out, *extra: str, model_and_size: list[str] = FAST, env=None):
    return run_bench(
        "run", "--strategy", "horovod", "--gpus", "2", "--cpu", "--epochs", "2",
        "--data", "cifar100", "--data-dir", str(cifar_dir), "--no-download",
        "--output", str(out), *model_and_size, *extra, timeout=600, env=env,
    )


def test_horovod_two_ranks_two_epochs(cifar_dir, tmp_path):
    proc = _run(cifar_dir, tmp_path, *PROBE)
    assert_ok(proc)
    # rank 0's lines as it wrote them, without horovodrun's "[0]<stdout>:" before each
    epochs = [line for line in proc.stdout.splitlines() if re.search(r"\] epoch \d", line)]
    assert len(epochs) == 2 and all(line.startswith("[horovod] epoch ") for line in epochs), (
        proc.stdout)
    rec = only_record(tmp_path)
    assert rec["status"] == "ok" and rec["launcher"] == "horovodrun"
    assert rec["world_size"] == 2 and rec["processes"] == 2
    assert rec["norm"] == "per-replica-bn"
    assert rec["replicas_identical"] is True  # parameters identical across ranks
    assert_comm_probe(rec)
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
    """The warm-up's backward has no step: Horovod refuses a bare zero_grad() there. The
    model is a tiny CNN: the warm-up is the same for any, and with torch's compile cache
    empty, as on a fresh machine, the run took 76 CPU-s with ResNet-18 (x0.125) and 39
    with it."""
    assert_ok(_run(cifar_dir, tmp_path, "--compile", "--epochs", "1", model_and_size=TINY_CNN,
                   env=USER_MODELS))
    rec = only_record(tmp_path)
    assert rec["compile"] is True and rec["compile_time_s"] > 0


def test_make_horovod_filled_a_complete_wheelhouse_that_needs_no_network():
    """`make horovod` builds from .cache/horovod-wheelhouse with the index off; a complete
    folder is all a machine without network needs: filling it again downloads nothing
    (the package index is pointed at a closed port to prove it)."""
    import subprocess
    import sys

    from conftest import ROOT

    house = ROOT / ".cache" / "horovod-wheelhouse"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not (house / f"COMPLETE-py{version}").exists():
        pytest.skip("no wheelhouse: `make horovod` has not run here")
    names = (house / f"COMPLETE-py{version}").read_text().split()
    assert any(n.startswith("horovod-0.28.1") and n.endswith(".tar.gz") for n in names)
    assert any(n.startswith("cmake-") for n in names)
    env = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INDEX": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_horovod.py"),
                           "--fill-only"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing downloaded" in done.stdout and "pip download" not in done.stdout
