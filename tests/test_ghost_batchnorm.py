"""--ghost-bn G (bench/models/ghost_batchnorm.py): one forward whose BatchNorm statistics are
each G images' own is the same math as micro-batches of G through torch's own BatchNorm,
gradient accumulated (what --grad-accum does): the same losses, weights and running
statistics, step after step. In float64, so that what is compared is the math: in float32
BatchNorm over 2 images amplifies rounding (the two drift apart by 5e-4 after one SGD step,
as any two orders of the same sums would)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import USER_MODELS, run_bench
from torch import nn

from bench.models.ghost_batchnorm import GhostBatchNorm
from bench.models.registry import build_model
from bench.records.describe import speed_options


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                           weight_decay=5e-4)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_ghost_batchnorm_trains_as_micro_batches_of_torchs_batchnorm(memory_format):
    torch.manual_seed(0)
    model = build_model("resnet18-cifar", 100, 0.125, 16).double().to(
        memory_format=memory_format)
    micro, ghost = copy.deepcopy(model).train(), GhostBatchNorm.convert(
        copy.deepcopy(model), 2).train()
    assert sum(isinstance(m, GhostBatchNorm) for m in ghost.modules()) == 20
    assert not any(isinstance(m, GhostBatchNorm) for m in micro.modules())
    opt_micro, opt_ghost = _sgd(micro), _sgd(ghost)
    data = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(32, 3, 16, 16, generator=data, dtype=torch.float64).to(
            memory_format=memory_format)
        y = torch.randint(0, 100, (32,), generator=data)
        opt_micro.zero_grad()
        loss_micro = 0.0
        for i in range(16):  # 16 micro-batches of 2, the loss of each 1/16 of the batch's
            loss = F.cross_entropy(micro(x[2 * i:2 * i + 2]), y[2 * i:2 * i + 2]) / 16
            loss.backward()
            loss_micro += loss.item()
        opt_micro.step()
        opt_ghost.zero_grad()
        loss_ghost = F.cross_entropy(ghost(x), y)
        loss_ghost.backward()
        opt_ghost.step()
        assert loss_ghost.item() == pytest.approx(loss_micro, rel=1e-12)
    for (name, a), b in zip(micro.state_dict().items(), ghost.state_dict().values(),
                            strict=True):
        # weights, running means and variances, and 48 updates counted, as 48 micro-batches
        assert torch.allclose(a.double(), b.double(), rtol=1e-9, atol=1e-12), name
    # evaluation is plain BatchNorm over the running statistics
    micro.eval(), ghost.eval()
    x = torch.randn(8, 3, 16, 16, generator=data, dtype=torch.float64)
    assert torch.allclose(micro(x), ghost(x), rtol=1e-9, atol=1e-12)


def test_cumulative_running_statistics_and_a_batch_of_one_group():
    """BatchNorm without momentum averages every batch it saw: group by group here too; a
    batch that is one group is plain BatchNorm."""
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(6, momentum=None).double()
    ghost = GhostBatchNorm.convert(copy.deepcopy(plain), 4)
    x = torch.randn(12, 6, 3, 3, dtype=torch.float64)
    expected = torch.cat([plain(x[i:i + 4]) for i in range(0, 12, 4)])
    assert torch.allclose(ghost(x), expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose(ghost.running_mean, plain.running_mean, rtol=1e-12, atol=1e-14)
    assert torch.allclose(ghost.running_var, plain.running_var, rtol=1e-12, atol=1e-14)
    assert int(ghost.num_batches_tracked) == 3
    assert torch.equal(ghost(x[:4]), plain(x[:4]))
    with pytest.raises(ValueError, match="a batch of 6 does not split into groups of 4"):
        ghost(x[:6])


def test_a_ghost_batchnorm_run_is_a_row_of_its_own():
    record = {"config": {"ghost_bn": 2}, "lr": 0.1, "base_lr": 0.1, "global_batch": 128,
              "lr_reference_batch": 128}
    assert speed_options(record) == "ghost BN 2"
    assert speed_options({**record, "config": {"ghost_bn": None}}) == "—"


def test_a_model_without_batchnorm_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    proc = run_bench("run", "--strategy", "ddp", "--cpu", "--model", "user_models:tiny_cnn",
                     "--data", "synthetic", "--train-limit", "64", "--test-limit", "8",
                     "--batch-size", "32", "--ghost-bn", "2", "--output", str(out),
                     env=USER_MODELS)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "has no BatchNorm layer: drop --ghost-bn" in proc.stderr
    assert not out.exists()


def test_on_gpus_ghost_batchnorm_asks_for_per_replica_batchnorm():
    """Where the run would use SyncBatchNorm (GPUs, several replicas, a strategy that syncs:
    not DataParallel), --ghost-bn needs --no-syncbn; this machine has no GPU to run it on."""
    import strategies
    from bench.config.run_config import RunConfig
    from bench.config.strategy_parts import StrategyOptions
    from bench.tools.errors import ConfigError

    cfg = RunConfig("ddp", gpus=4, ghost_bn=2)
    with pytest.raises(ConfigError, match="SyncBatchNorm over the replicas: add --no-syncbn"):
        cfg.check_ghost_bn(32, syncs_batchnorm=True)
    cfg.derive(syncbn=False).check_ghost_bn(32, syncs_batchnorm=True)
    cfg.check_ghost_bn(32, syncs_batchnorm=False)
    assert strategies.get("ddp", StrategyOptions()).syncs_batchnorm
    assert not strategies.get("dp", StrategyOptions()).syncs_batchnorm


def test_bench_verify_checks_a_ghost_batchnorm_run_against_passes_of_g_images():
    """In float64 the reference runs each G images as a forward pass of plain BatchNorm, so
    the ranks' one-pass ghost layer is checked independently (to rounding: a reference that
    ignored the groups differs by orders of magnitude more); under bf16 it takes the ranks'
    layer. The self-test says bn-grouping does not apply where the groups already split
    each half of a replica's batch apart."""
    proc = run_bench("verify", "--cpu", "--strategies", "ddp,ddp-amp", "--steps", "4",
                     "--batch-size", "32", "--ghost-bn", "4", "--no-syncbn")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()
            if line.startswith(("ddp ", "ddp-amp "))}
    assert set(rows) == {"ddp", "ddp-amp"}, proc.stdout
    assert all("pass" in row and "ghost 4" in row for row in rows.values()), proc.stdout
    param_diff = float(rows["ddp"].split()[6])
    assert param_diff < 1e-12, proc.stdout  # float64: the same math, not a near miss


def test_bn_grouping_does_not_apply_where_ghost_groups_split_the_half_already():
    from bench.commands.verify import defect_does_not_apply
    from bench.config.run_config import RunConfig
    from bench.launch.plan import RunPlan

    def plan(ghost):
        return RunPlan(RunConfig("ddp", gpus=2, cpu=True, data="synthetic", width=0.125,
                                 batch_size=32, ghost_bn=ghost), probe_output=False)

    assert "already normalises each half" in defect_does_not_apply("bn-grouping", plan(4))
    assert defect_does_not_apply("bn-grouping", plan(16)) is None  # 16 does not split 8
    assert defect_does_not_apply("bn-grouping", plan(None)) is None
