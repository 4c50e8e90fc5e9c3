import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    crop_candidates,
    distinguishable_image,
    normalise,
    run_bench,
    which_crop,
)

from bench.data import image_sets as data
from bench.data.image_sets import (
    CifarTensorDataset,
    ImageSet,
    load_cifar100_split,
    prepare_cifar100,
    synthetic_split,
    write_cifar100_format,
)
from bench.tools.errors import ConfigError


def test_fixture_has_the_official_layout(cifar_dir):
    folder = cifar_dir / "cifar-100-python"
    with open(folder / "train", "rb") as fh:
        train = pickle.load(fh, encoding="latin1")
    assert {"data", "fine_labels", "coarse_labels", "filenames", "batch_label"} <= set(train)
    assert all(isinstance(k, str) for k in train)
    assert train["data"].dtype == np.uint8 and train["data"].shape == (256, 3072)
    with open(folder / "meta", "rb") as fh:
        meta = pickle.load(fh, encoding="latin1")
    assert len(meta["fine_label_names"]) == 100 and len(meta["coarse_label_names"]) == 20


def test_rows_are_red_then_green_then_blue_planes(tmp_path):
    img = np.zeros((1, 32, 32, 3), dtype=np.uint8)
    img[0, 1, 2] = (10, 20, 30)  # row 1, column 2: R, G, B
    write_cifar100_format(tmp_path, ImageSet(img, np.array([5])), ImageSet(img, np.array([5])))
    with open(tmp_path / "cifar-100-python" / "train", "rb") as fh:
        row = pickle.load(fh, encoding="latin1")["data"][0]
    pos = 1 * 32 + 2
    assert (row[pos], row[1024 + pos], row[2048 + pos]) == (10, 20, 30)
    loaded = load_cifar100_split(tmp_path, "train")
    assert np.array_equal(loaded.images, img) and loaded.labels.tolist() == [5]


def test_prepare_reports_fixture_and_sizes(cifar_dir):
    assert prepare_cifar100(cifar_dir, download=False) == ("fixture", 256, 10)


def test_corrupt_file_is_a_clear_error(tmp_path, cifar_dir):
    import shutil

    shutil.copytree(cifar_dir / "cifar-100-python", tmp_path / "cifar-100-python")
    (tmp_path / "cifar-100-python" / "train").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match=r"corrupt CIFAR-100 file .*train"):
        prepare_cifar100(tmp_path, download=False)


def test_missing_key_is_a_clear_error(tmp_path, cifar_dir):
    import shutil

    shutil.copytree(cifar_dir / "cifar-100-python", tmp_path / "cifar-100-python")
    with open(tmp_path / "cifar-100-python" / "test", "wb") as fh:
        pickle.dump({"data": np.zeros((2, 3072), np.uint8)}, fh)
    with pytest.raises(ConfigError, match="fine_labels"):
        prepare_cifar100(tmp_path, download=False)


def test_failed_download_suggests_synthetic(tmp_path, monkeypatch):
    # A loopback port that refuses connections stands in for an offline machine.
    monkeypatch.setenv("BENCH_CIFAR100_URL", "http://127.0.0.1:9/cifar-100-python.tar.gz")
    with pytest.raises(ConfigError, match="--data synthetic"):
        prepare_cifar100(tmp_path / "empty", download=True)
    assert not (tmp_path / "empty" / "cifar-100-python").exists()


def test_synthetic_is_deterministic_and_prefix_stable():
    a = synthetic_split("train", 300, seed=1)
    b = synthetic_split("train", 100, seed=1)
    assert np.array_equal(a.images[:100], b.images) and np.array_equal(a.labels[:100], b.labels)
    c = synthetic_split("train", 100, seed=2)
    assert not np.array_equal(b.images, c.images)
    test = synthetic_split("test", 100, seed=1)
    assert not np.array_equal(test.images, b.images)


def test_synthetic_difficulty_fades_the_pattern_and_caps_accuracy():
    """d = 1: 30 % of the labels are redrawn uniformly (so 0.3 * 99/100 = 29.7 % change),
    the default; d = 0 is the easy set, unchanged. A nearest-class-mean classifier, far
    above chance on the easy set, drops on the hard one and cannot beat the label cap."""
    easy, hard = (synthetic_split("train", 5000, seed=0, difficulty=d) for d in (0.0, 1.0))
    assert np.array_equal(synthetic_split("train", 5000, seed=0).images, easy.images)
    changed = (easy.labels != hard.labels).mean()
    assert changed == pytest.approx(0.297, abs=0.02)
    accuracy = {}
    for d in (0.0, 1.0):
        train = synthetic_split("train", 5000, seed=0, difficulty=d)
        test = synthetic_split("test", 500, seed=0, difficulty=d)
        x = train.images.reshape(len(train), -1).astype(np.float32)
        means = np.stack([x[train.labels == k].mean(0) for k in range(100)])
        xt = test.images.reshape(len(test), -1).astype(np.float32)
        pred = ((xt[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
        accuracy[d] = (pred == test.labels).mean()
    assert accuracy[0.0] > 0.5 and 0.02 < accuracy[1.0] < min(accuracy[0.0], 0.71)


def test_synthetic_is_learnable_by_class_means():
    train = synthetic_split("train", 5000, seed=0)
    test = synthetic_split("test", 500, seed=0)
    x = train.images.reshape(len(train), -1).astype(np.float32)
    means = np.stack([x[train.labels == k].mean(0) for k in range(100)])
    xt = test.images.reshape(len(test), -1).astype(np.float32)
    pred = ((xt[:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == test.labels).mean() > 0.5  # chance is 0.01


def test_eval_transform_is_normalisation_only():
    images = synthetic_split("test", 4, seed=0)
    out, label = CifarTensorDataset(images, augment=False)[2]
    expected = normalise(torch.from_numpy(images.images[2]).permute(2, 0, 1))
    assert torch.allclose(out, expected, atol=1e-5) and label == images.labels[2]


def test_augmentation_is_random_crop_pad4_and_flip():
    img = distinguishable_image()
    keys, stack = crop_candidates(img)
    assert len({tuple(c.flatten().tolist()) for c in stack}) == 162  # all distinguishable
    ds = CifarTensorDataset(ImageSet(img[None], np.array([0])), augment=True)
    torch.manual_seed(0)
    seen = {which_crop(ds[0][0], keys, stack) for _ in range(4000)}
    assert seen == set(keys)  # every offset, mirrored and not, and nothing else


def test_url_override(monkeypatch):
    monkeypatch.setenv("BENCH_CIFAR100_URL", "http://mirror.invalid/x.tar.gz")
    assert data.cifar100_url() == "http://mirror.invalid/x.tar.gz"
    monkeypatch.delenv("BENCH_CIFAR100_URL")
    assert data.cifar100_url() == data.CIFAR100_URL


class _Payload:
    """A pickle that runs a command when loaded: what a hostile dataset folder could hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["meta", "train"])
def test_a_dataset_folder_cannot_run_code(name, cifar_dir, tmp_path):
    hostile = tmp_path / "hostile"
    shutil.copytree(cifar_dir, hostile)
    marker = tmp_path / "ran"
    with open(hostile / "cifar-100-python" / name, "wb") as fh:
        pickle.dump({"fine_label_names": _Payload(marker), "data": _Payload(marker)}, fh,
                    protocol=2)
    proc = run_bench("run", "--strategy", "dp", "--cpu", "--data", "cifar100", "--data-dir",
                     str(hostile), "--no-download", "--epochs", "1", "--output",
                     str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "not a CIFAR-100 file (forbidden object posix.system)" in proc.stderr
    assert not marker.exists(), "the payload ran"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, entry, expected", [
    ("test", {"data": np.zeros((2, 3072), np.uint8), "fine_labels": [2**70, 1]}, "fine_labels"),
    ("test", {"data": [[300] * 3072, [0] * 3072], "fine_labels": [1, 2]}, "0..255"),
    ("test", {"data": [list(range(300)), [0]], "fine_labels": [1, 2]}, "corrupt"),
    ("meta", {"fine_label_names": 100}, "list of 100 fine_label_names"),
    ("meta", {"fine_label_names": list(range(100))}, "list of 100 fine_label_names"),
])
def test_absurd_but_valid_pickles_are_one_clear_error(name, entry, expected, tmp_path,
                                                      cifar_dir):
    """Valid pickles with absurd contents (labels past int64, pixels past 255, ragged rows,
    names that are not a list of strings) were OverflowError/TypeError tracebacks."""
    shutil.copytree(cifar_dir / "cifar-100-python", tmp_path / "cifar-100-python")
    with open(tmp_path / "cifar-100-python" / name, "wb") as fh:
        pickle.dump(entry, fh)
    with pytest.raises(ConfigError, match=expected):
        prepare_cifar100(tmp_path, download=False)


def test_a_missing_file_is_named(tmp_path, cifar_dir):
    shutil.copytree(cifar_dir / "cifar-100-python", tmp_path / "cifar-100-python")
    (tmp_path / "cifar-100-python" / "test").unlink()
    with pytest.raises(ConfigError, match=r"lacks .*cifar-100-python/test; drop --no-download"):
        prepare_cifar100(tmp_path, download=False)


def test_a_synthetic_set_beyond_its_default_size_is_recorded_and_checked_at_that_size():
    """`--data synthetic --train-limit 60000` drew 60,000 images while the record said
    50,000 (the default set's size), and 10^11 was no refusal but a MemoryError in the rank."""
    from bench.config.run_config import RunConfig
    from bench.data.datasets import image_set
    from bench.launch.preflight import prepare_data

    cfg = RunConfig("ddp", cpu=True, data="synthetic", train_limit=60_000, test_limit=12_000)
    _, train, test = prepare_data(cfg)
    assert (train, test) == (len(image_set(cfg, "train")), len(image_set(cfg, "test")))
    assert (train, test) == (60_000, 12_000)
    huge = cfg.derive(train_limit=10**11)
    with pytest.raises(ConfigError, match="lower --train-limit"):
        prepare_data(huge)


def test_a_run_waits_for_another_preparing_the_data_instead_of_downloading_too(tmp_path,
                                                                              monkeypatch):
    """Under Slurm each task is its own `bench run`: all of them downloaded CIFAR-100 into one
    shared folder at once. Now one prepares it (a lock beside the folder) while the others
    wait, then find it there. Here the first holds the lock while it writes the files; the
    second, whose download could only fail (its mirror does not exist), waits and reads them."""
    import subprocess
    import sys

    from bench.data.image_sets import prepare_cifar100

    root = tmp_path / "cifar"
    first = subprocess.Popen([sys.executable, "-c", f"""
import time
from bench.data.image_sets import preparing_alone, synthetic_split, write_cifar100_format
with preparing_alone({str(root)!r}):
    print("locked", flush=True)
    time.sleep(1.5)
    write_cifar100_format({str(root)!r}, synthetic_split("train", 64, seed=1),
                          synthetic_split("test", 8, seed=1))
"""], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "locked"
    monkeypatch.setenv("BENCH_CIFAR100_URL", (tmp_path / "no-such-mirror.tar.gz").as_uri())
    assert prepare_cifar100(root) == ("fixture", 64, 8)
    assert first.wait(timeout=60) == 0
