"""--model: ResNet-18 CIFAR stays the default; a torchvision model and a user's factory train
under the strategies, start from the same weights, and name their workload; what cannot be
built is refused in one line."""

from __future__ import annotations

import time

import pytest
from conftest import USER_MODELS, assert_ok, only_record, run_bench

from strategies.horovod import HorovodStrategy

TINY = ["--cpu", "--gpus", "2", "--epochs", "1", "--data", "synthetic", "--train-limit", "64",
        "--test-limit", "16", "--batch-size", "16", "--no-progress", "--comm-probe-steps", "0"]
HOROVOD = HorovodStrategy("horovod").requires("cpu")


@pytest.mark.parametrize("strategy", [
    "dp", "ddp", "fsdp",
    pytest.param("horovod", marks=pytest.mark.skipif(
        HOROVOD is not None, reason=f"horovod unavailable: {HOROVOD}"))])
def test_a_user_factory_trains_under_each_strategy(strategy, tmp_path):
    assert_ok(run_bench("run", "--strategy", strategy, "--model", "user_models:tiny_cnn",
                        *TINY, "--output", str(tmp_path), env=USER_MODELS))
    rec = only_record(tmp_path)
    # 3*16*9+16 + 16*32*9+32 + 32*100+100 parameters, counted by hand
    assert rec["model"] == {"name": "user_models:tiny_cnn", "width": 1.0,
                            "parameters": 448 + 4640 + 3300, "batchnorm_layers": 0,
                            "num_classes": 100, "image_size": 32}
    assert rec["initial_param_fingerprint"] == rec["initial_reference_fingerprint"]
    assert any("has no BatchNorm" in note for note in rec["notes"]), rec["notes"]
    assert rec["norm"] == "none"  # not "syncbn" or "per-replica-bn": there is none
    if strategy == "fsdp":  # its units, each a stage of `bench project`'s pipeline: the two
        # convolutions and the classifier (the root holds no parameter of its own)
        assert rec["gradient_buckets"] == [4 * 448, 4 * 4640, 4 * 3300], rec["gradient_buckets"]
    assert not any("per replica" in note for note in rec["notes"]), rec["notes"]
    report = run_bench("report", "--results", str(tmp_path), "--format", "csv", "--no-write")
    assert "user_models:tiny_cnn" in report.stdout


def test_a_torchvision_model_trains_with_random_weights(tmp_path):
    """ResNet-50 at 32x32 (adaptive pooling), 100 classes: torchvision's 25,557,032
    parameters less the 1,000-class head plus a 100-class one."""
    assert_ok(run_bench("run", "--strategy", "ddp", "--model", "torchvision:resnet50",
                        "--image-size", "32", *TINY, "--output", str(tmp_path), timeout=600))
    rec = only_record(tmp_path)
    assert rec["model"]["parameters"] == 25_557_032 - 2048 * 1000 - 1000 + 2048 * 100 + 100
    assert rec["model"]["batchnorm_layers"] == 53
    assert rec["initial_param_fingerprint"] == rec["initial_reference_fingerprint"]
    assert rec["replicas_identical"] is True
    report = run_bench("report", "--results", str(tmp_path), "--format", "csv", "--no-write")
    assert "batch 16, resnet50" in report.stdout


@pytest.mark.parametrize("args, says", [
    (["--model", "torchvision:resnet5000"], "did you mean"),
    (["--model", "resnet50"], "torchvision:NAME or package.module:function"),
    (["--model", "no_such_package.models:net"], "cannot import no_such_package.models"),
    (["--model", "user_models:missing"], "has no function missing"),
    (["--model", "torchvision:resnet50", "--width", "0.5"], "--width scales resnet18-cifar"),
    (["--model", "torchvision:vit_b_16", "--image-size", "40"],
     "cannot take 40x40 images (AssertionError: Input shape indivisible by patch size!)"),
    # the factory fails, not the image size (it said `cannot take 32x32 images`)
    (["--model", "user_models:takes_a_config"], "--model user_models:takes_a_config: building "
     "it with 100 classes failed (TypeError: 'int' object is not subscriptable)"),
    (["--model", "user_models:ten_logits"], "not logits of shape (1, 100)"),
    # logits in evaluation, auxiliary outputs in training: passed the check (evaluation
    # mode only), then failed with a traceback counting its FLOPs; the line alone on stderr
    # (torchvision's FutureWarning about its initialisation no longer printed)
    (["--model", "user_models:with_auxiliary_heads", "--image-size", "64"], "maps a batch "
     "of 2 images in training to GoogLeNetOutputs, not logits of shape (2, 100); it must "
     "return one logit per class (auxiliary outputs: build it with aux_logits=False"),
    (["--model", "user_models:no_parameters"], "has no parameters: there is nothing to train"),
    (["--model", "user_models:on_meta"], "makes its parameters on the meta device (shapes "
     "without values); build them on the CPU"),
])
def test_a_model_that_cannot_be_built_is_one_line(args, says, tmp_path):
    proc = run_bench("run", "--strategy", "ddp", *args, *TINY, "--output", str(tmp_path),
                     env=USER_MODELS)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("arch, size", [("googlenet", 64), ("inception_v3", None)])
def test_torchvisions_models_with_auxiliary_heads_are_built_without_them(arch, size):
    """`--model torchvision:googlenet` was refused (its training output holds two auxiliary
    classifiers' logits: "build it with aux_logits=False in your own factory"), and
    torchvision:inception_v3 at the default 224 px could not even be built (its auxiliary
    head's 5x5 kernel meets 3x3 there), though any torchvision model is said to run. Both
    are built without those heads: one logit per class in either mode, at the default
    size."""
    import torch

    from bench.models.registry import ModelSpec, check_model_builds, default_image_size

    spec = ModelSpec(f"torchvision:{arch}", image_size=size or default_image_size(
        f"torchvision:{arch}"))
    check_model_builds(spec)  # refused before, in one line naming the factory
    model = spec.build().train()
    assert not any("aux" in name for name, _ in model.named_modules())
    logits = model(torch.zeros(2, 3, spec.image_size, spec.image_size))
    logits.sum().backward()  # every parameter takes part: DDP finds none unused
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("factory", ["hangs_in_every_rank", "hangs_in_rank_1"])
def test_a_factory_that_never_returns_in_a_rank_is_bounded_by_the_timeout(factory, tmp_path):
    """Every rank stuck in the user's factory reached no collective that could time out, and
    had not beaten yet: the run waited for ever. Now --timeout bounds it."""
    started = time.monotonic()
    proc = run_bench("run", "--strategy", "ddp", "--model", f"user_models:{factory}", *TINY,
                     "--timeout", "5", "--output", str(tmp_path), env=USER_MODELS, timeout=120)
    assert time.monotonic() - started < 60, "not bounded by --timeout"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    rec = only_record(tmp_path)
    assert rec["status"] == "failed" and rec["error"].startswith("timeout: rank "), rec["error"]
    assert "build: model and data" in rec["error"] or "start-up" in rec["error"], rec["error"]


def test_a_factory_that_returns_no_module_is_one_line(tmp_path):
    proc = run_bench("run", "--strategy", "ddp", "--model", "user_models:not_a_module", *TINY,
                     "--output", str(tmp_path), env=USER_MODELS)
    assert proc.returncode == 2 and "not an nn.Module" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_a_parameter_the_loss_never_uses_names_the_option_that_lets_ddp_train(tmp_path):
    """Seen: a model with a layer its forward never calls failed at step 2 with torch's
    eight lines and their traceback, which name ``find_unused_parameters=True``, a keyword
    no bench user types. The failure is one line naming the parameters (the spare layer's
    weight and bias: 6 and 7 of the model's 8, counted by hand) and bench's option, which
    then trains."""
    proc = run_bench("run", "--strategy", "ddp", "--model", "user_models:spare_layer", *TINY,
                     "--output", str(tmp_path / "plain"), env=USER_MODELS)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("parameters 6, 7 (model.parameters() order) took no part in the loss; run with "
            "--find-unused-parameters [in train epoch 1 step 2]") in proc.stderr, proc.stderr
    assert_ok(run_bench("run", "--strategy", "ddp", "--model", "user_models:spare_layer",
                        *TINY, "--find-unused-parameters", "--output", str(tmp_path / "found"),
                        env=USER_MODELS))
