"""--cpu-syncbn: BatchNorm over the global batch for CPU ranks (strategies/cpu_syncbn.py),
where torch's SyncBatchNorm needs an accelerator: the same numbers as BatchNorm over the
whole batch in one process, a DDP run that trains like that process, and a refusal where
no torch DDP wraps the model."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_bench

from bench.tools.ports import free_port

CHECK = Path(__file__).with_name("syncbn_shared_check.py")


def test_two_cpu_ranks_normalise_like_one_process_over_the_whole_batch():
    """Two gloo ranks holding half a batch each, two training steps, float64: output,
    input and parameter gradients and running statistics within 1e-5 of BatchNorm over the
    whole batch (measured: <= 5e-14); per-replica BatchNorm in the same script is far off,
    so the check can fail."""
    synced = subprocess.run([sys.executable, str(CHECK), str(free_port()), "--cpu"],
                            capture_output=True, text=True, timeout=300)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert synced.stdout.count("max |syncbn(2 ranks, cpu)") == 5, synced.stdout
    alone = subprocess.run([sys.executable, str(CHECK), str(free_port()), "--cpu",
                            "--per-replica"], capture_output=True, text=True, timeout=300)
    assert alone.returncode == 1, alone.stdout + alone.stderr
    assert "mean: differs between ranks" in alone.stdout, alone.stdout


def test_a_bf16_batch_is_normalised_as_torch_normalises_it():
    """Under autocast BatchNorm gets a convolution's bf16 output. Seen: bench's SyncBN
    rounded the mean and 1/std to bf16 before normalising, returned float32, and its
    weight and bias gradients were 3.6 % off the exact ones. Each output element must be
    the exact normalisation correctly rounded to bf16, as torch's BatchNorm's are (the
    script checks that control too), the gradients within 1e-5."""
    proc = subprocess.run([sys.executable, str(CHECK), str(free_port()), "--cpu", "--bf16"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("output torch.bfloat16, 0 of 4608 elements not correctly "
                             "rounded") == 2, proc.stdout


def test_bench_verify_holds_bf16_with_cpu_syncbn_to_its_tolerance_and_catches_a_defect():
    """Seen: ``bench verify --cpu --cpu-syncbn`` failed a correct ddp-amp at its default
    10 steps (parameters 7.6e-5 against 5e-5): its reference normalised the whole batch
    in one forward pass, and bf16 rounding noise between the two grew with the steps past
    the smallest defect's distance (1.3e-4). The unbroken strategy must pass and the
    BatchNorm-grouping defect still be caught."""
    proc = run_bench("verify", "--self-test", "--strategies", "ddp-amp", "--cpu", "--gpus", "2",
                     "--steps", "10", "--cpu-syncbn", "--defects", "bn-grouping", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2/2 as expected" in proc.stdout, proc.stdout


def test_bf16_with_cpu_syncbn_compiles(tmp_path):
    """Seen: every ddp-amp --cpu-syncbn --compile run failed in its first step, in
    Inductor's code for the statistics' float64 var_mean of a bf16 input ("Welford
    reduction does not support VectorizedN (N>2)"). The statistics are left uncompiled."""
    from conftest import USER_MODELS, assert_ok

    assert_ok(run_bench("run", "--strategy", "ddp-amp", "--cpu", "--gpus", "2", "--cpu-syncbn",
                        "--compile", "--model", "user_models:shortcut_cnn", "--data",
                        "synthetic", "--train-limit", "64", "--test-limit", "16",
                        "--batch-size", "16", "--epochs", "1", "--no-progress",
                        "--comm-probe-steps", "0", "--output", str(tmp_path), env=USER_MODELS))


def test_ddp_with_cpu_syncbn_trains_like_one_process_over_the_global_batch():
    """bench verify's reference is one plain process with the strategy's BatchNorm grouping:
    with --cpu-syncbn the record says syncbn, so the reference normalises over the global
    batch, and ddp and ddp-zero match it to float64 rounding."""
    proc = run_bench("verify", "--strategies", "ddp,ddp-zero", "--cpu", "--gpus", "2",
                     "--steps", "3", "--width", "0.125", "--batch-size", "64",
                     "--image-size", "16", "--cpu-syncbn", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.split()[:1] in (["ddp"], ["ddp-zero"])]
    assert [(r[1], r[3]) for r in rows] == [("pass", "syncbn")] * 2, proc.stdout


@pytest.mark.parametrize("strategy", ["horovod", "fsdp", "dp"])
def test_cpu_syncbn_is_refused_where_no_torch_ddp_wraps_the_model(strategy, tmp_path):
    proc = run_bench("run", "--strategy", strategy, "--cpu", "--gpus", "2", "--cpu-syncbn",
                     "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--cpu-syncbn is a torch DDP option" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_cpu_syncbn_row_is_its_own_row_and_says_so():
    """Seen on the first runs with --cpu-syncbn: the report merged them with per-replica
    rows of the same strategy and N as repeats (the norm was not part of a row's key).
    Another norm is another row, and a CPU SyncBN row says so in its options."""
    from report_records import record

    from bench.report import summary_table

    plain = {**record("a", "ddp", 2, [5.0, 2.0], [0.1, 0.2]), "norm": "per-replica-bn"}
    synced = {**record("b", "ddp", 2, [5.0, 3.0], [0.1, 0.2]), "norm": "syncbn",
              "ddp_options": {"cpu_syncbn": True}}
    table = summary_table([plain, synced])
    assert sorted(zip(table["options"], table["runs"])) == [("cpu syncbn", 1), ("—", 1)]


def test_the_bf16_reference_cuts_every_kind_of_convolution_as_the_ranks_do():
    """Under bf16 with --cpu-syncbn, verify's reference runs each weighted layer once per
    rank's share (bench/train/rank_chunks.py), so that its weight gradients round as the
    ranks' do; at 2 ranks nothing is left to round otherwise and the parameters agree to the
    bit. Seen: a transposed convolution was run over the whole batch (only Conv2d was cut),
    and a model with one differed by 4.2e-7."""
    from conftest import USER_MODELS

    proc = run_bench("verify", "--strategies", "ddp-amp", "--cpu", "--gpus", "2", "--cpu-syncbn",
                     "--model", "user_models:transposed_cnn", env=USER_MODELS, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = re.search(r"^ddp-amp +pass +bf16 +syncbn +\S+ \(\S+\) +(\S+) \(", proc.stdout, re.M)
    assert row and float(row.group(1)) < 1e-9, proc.stdout


def test_batchnorm_without_weight_and_bias_synchronises():
    """Seen: --cpu-syncbn on a BatchNorm with affine=False failed at its first backward
    ("returned a gradient different than None at position 3"): it gave a bias gradient for
    a bias there is none of. bench verify then holds it to the plain loop, in float64 and
    under bf16 cut by rank."""
    from conftest import USER_MODELS

    proc = run_bench("verify", "--strategies", "ddp,ddp-amp", "--cpu", "--gpus", "2",
                     "--cpu-syncbn", "--steps", "3", "--model", "user_models:plain_batchnorm",
                     env=USER_MODELS, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^ddp +pass +fp32 +syncbn ", proc.stdout, re.M), proc.stdout
    assert re.search(r"^ddp-amp +pass +bf16 +syncbn ", proc.stdout, re.M), proc.stdout
