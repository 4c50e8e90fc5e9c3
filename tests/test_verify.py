"""bench verify: every CPU-capable strategy trains like one plain process; and the check is
sharp enough to fail on the mistakes it exists to catch."""

from __future__ import annotations

import re

from conftest import run_bench

from bench.config import RunConfig
from bench.verify import TOLERANCE, Layout, compare, reference

STEPS = 8


def test_verify_passes_for_every_cpu_strategy():
    proc = run_bench("verify", "--cpu", "--gpus", "2", "--steps", str(STEPS), "--width",
                     "0.125", "--batch-size", "64", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {m.group(1): m.group(2) for m in re.finditer(r"^(\S+)\s+(pass|FAIL|skipped)",
                                                          proc.stdout, re.M)}
    for name in ("dp", "ddp", "ddp-spawn", "ddp-launch", "ddp-amp", "fsdp"):
        assert lines.get(name) == "pass", proc.stdout
    assert lines.get("ddp-apex") == "skipped"
    assert re.search(r"\d+ passed, 0 failed", proc.stdout)


def _base(**kw) -> RunConfig:
    values = dict(cpu=True, data="synthetic", width=0.125, batch_size=64, epochs=1,
                  warmup_epochs=0.0, lr=0.001, train_limit=STEPS * 64)
    return RunConfig("ddp", **{**values, **kw})


def test_check_fails_on_summed_gradients():
    # Summing instead of averaging gradients over 2 ranks doubles the step.
    ok_losses, ok_params = reference(_base(), STEPS, Layout(processes=2))
    bad_losses, bad_params = reference(_base(lr=0.002), STEPS, Layout(processes=2))
    loss_diff, param_diff = compare(bad_losses, bad_params, ok_losses, ok_params)
    assert max(loss_diff, param_diff) > 3 * TOLERANCE["fp32"]


def test_check_fails_when_bn_grouping_is_ignored():
    # A per-replica-BN strategy compared with a full-batch reference would be flagged: this is
    # why the reference reproduces the grouping.
    whole = reference(_base(), STEPS, Layout())
    shards = reference(_base(), STEPS, Layout(processes=2))
    assert max(compare(*shards, *whole)) > 3 * TOLERANCE["fp32"]


def test_check_fails_on_a_different_data_order():
    ok = reference(_base(), STEPS, Layout(processes=2))
    other = reference(_base(seed=1), STEPS, Layout(processes=2))
    assert compare(*other, *ok)[0] > 3 * TOLERANCE["fp32"]
