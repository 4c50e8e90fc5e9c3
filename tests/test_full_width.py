"""The real ResNet-18 (width 1.0, 11.2 M parameters) through the whole harness."""

from conftest import assert_ok, only_record, run_bench


def test_real_resnet18_trains_one_epoch(cifar_dir, tmp_path):
    proc = run_bench(
        "run", "--strategy", "ddp", "--gpus", "2", "--cpu", "--epochs", "1",
        "--data", "cifar100", "--data-dir", str(cifar_dir), "--no-download",
        "--train-limit", "64", "--batch-size", "32", "--no-progress", "--output", str(tmp_path),
        "--comm-probe-steps", "2",  # the probe's path at full width; its default 20 took 11 s
    )
    assert_ok(proc)
    rec = only_record(tmp_path)
    # 20 BatchNorm layers: the stem, two per basic block (8), three in downsample shortcuts
    assert rec["model"] == {"name": "resnet18-cifar", "width": 1.0, "parameters": 11_220_132,
                            "batchnorm_layers": 20, "num_classes": 100, "image_size": 32}
    assert rec["per_epoch"][0]["train_images"] == 64
    assert rec["per_epoch"][0]["train_loss"] > 0
