import dataclasses
from pathlib import Path

import pytest

import strategies
from bench.config.run_config import RunConfig
from bench.config.strategy_parts import Topology
from bench.launch.plan import RunPlan
from bench.tools.errors import ConfigError
from bench.train.schedule import lr_at
from bench.train.scratch import Scratch
from bench.train.spec import WorkerSpec


def test_lr_scales_linearly_from_batch_128():
    assert RunConfig("ddp", batch_size=128).peak_lr == pytest.approx(0.1)
    assert RunConfig("ddp", batch_size=512).peak_lr == pytest.approx(0.4)
    assert RunConfig("ddp", batch_size=512, lr=0.05).peak_lr == pytest.approx(0.05)


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("gpus", 0, "--gpus"),
        ("epochs", -1, "--epochs"),
        ("batch_size", 0, "--batch-size"),
        ("data", "imagenet", "--data"),
        ("width", 0, "--width"),
        ("precision", "fp8", "--precision"),
        ("train_limit", 0, "--train-limit"),
        ("warmup_epochs", 5, "--warmup-epochs"),
    ],
)
def test_validation_names_the_flag(field, value, fragment):
    cfg = RunConfig("ddp", **{"epochs": 3, field: value})
    with pytest.raises(ConfigError, match=fragment):
        cfg.validate()


def test_batch_split():
    cfg = RunConfig("ddp", batch_size=128)
    assert cfg.check_batch_split(4) == 32
    with pytest.raises(ConfigError, match="multiple of 3"):
        cfg.check_batch_split(3)


def test_schedule_warms_up_then_decays_to_zero():
    total, warm, peak = 100, 10, 0.4
    lrs = [lr_at(s, total, warm, peak) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / warm)
    assert lrs[warm - 1] == pytest.approx(peak)
    assert lrs[warm] == pytest.approx(peak)
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1 :]))
    assert lr_at(total, total, warm, peak) == pytest.approx(0.0)


def test_roundtrip_dict():
    cfg = RunConfig("dp", gpus=2, seed=3, width=0.5)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_config_is_frozen_and_the_plan_derives_a_new_one():
    cfg = RunConfig("ddp-amp", gpus=2, cpu=True, data="synthetic", batch_size=32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.precision = "fp32"
    plan = RunPlan(cfg, probe_output=False)
    assert cfg.precision is None  # what was given stays as given
    assert plan.cfg.precision == "bf16"  # the strategy's CPU default, resolved by the plan
    assert plan.cfg == dataclasses.replace(cfg, precision="bf16")


def test_derive_validates_again():
    with pytest.raises(ConfigError, match="--gpus"):
        RunConfig("ddp").derive(gpus=0)


def test_each_strategy_gets_its_own_options():
    cfg = RunConfig("ddp-apex", bucket_cap_mb=10.0, apex_opt_level="O2", hvd_compression="fp16")
    apex = strategies.get("ddp-apex", cfg.strategy_options)
    assert apex.apex_options.opt_level == "O2" and apex.ddp_options.bucket_cap_mb == 10.0
    assert strategies.get("horovod", cfg.strategy_options).options.compression == "fp16"
    assert strategies.get("dp", cfg.strategy_options).record_options() is None


def test_worker_spec_survives_json(tmp_path):
    spec = WorkerSpec(
        config=RunConfig("ddp", gpus=2, cpu=True, precision="fp32", rdzv_id="x"),
        topology=Topology("cpu", gpus=2, nodes=1, timeout=30.0),
        record_path=tmp_path / "r.json", scratch=Scratch(tmp_path), workers_per_process=0,
        record={"run_id": "r", "per_epoch": []},
    )
    assert WorkerSpec.read(spec.write()) == spec
    assert spec.scratch.spec == Path(tmp_path) / "spec.json"


def test_fsdp_refuses_gloo_with_cuda_tensors():
    """FSDP2 over gloo on a shared GPU died of SIGSEGV on an H100: refused before start."""
    from bench.config.strategy_parts import Features

    fsdp = strategies.get("fsdp", RunConfig("fsdp").strategy_options)
    shared = Topology("cuda", gpus=2, backend="gloo", gpu_shared=True)
    with pytest.raises(ConfigError, match="--backend nccl"):
        fsdp.check(shared, Features("fp32"))
    fsdp.check(Topology("cuda", gpus=2, backend="nccl"), Features("fp32"))  # what it names works
    fsdp.check(Topology("cpu", gpus=2, backend="gloo"), Features("fp32"))


def test_dp_refuses_compile_on_several_gpus_only():
    """torch.compile breaks its graph at DataParallel's scatter/replicate/threads: a record of
    such a run would say 'compiled' of what mostly was not. One GPU, or the CPU's single
    replica, compile whole."""
    from bench.config.strategy_parts import Features

    dp = strategies.get("dp", RunConfig("dp").strategy_options)
    with pytest.raises(ConfigError, match="use ddp --compile, or dp on one GPU"):
        dp.check(Topology("cuda", gpus=2), Features("fp32", compile=True))
    dp.check(Topology("cuda", gpus=2), Features("fp32"))
    dp.check(Topology("cuda", gpus=1), Features("fp32", compile=True))
    dp.check(Topology("cpu", gpus=2), Features("fp32", compile=True))
