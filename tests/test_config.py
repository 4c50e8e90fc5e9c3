import pytest

from bench.config import RunConfig
from bench.errors import ConfigError
from bench.worker import lr_at


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
    cfg = RunConfig("ddp", epochs=3)
    setattr(cfg, field, value)
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
