"""Data for any model: the synthetic set at any image size and class count (the 32-px,
100-class set unchanged), CIFAR-100 resized, and the user's own images as an ImageFolder,
which trains (bench verify, float64) and evaluates exactly; what cannot work is one line."""

from __future__ import annotations

import hashlib
import math
import os
import re
import time

import numpy as np
import pytest
from conftest import USER_MODELS, assert_ok, only_record, records, run_bench
from PIL import Image

from bench.data.image_sets import ImageSet, resized, synthetic_split
from bench.launch.summary import forks_can_deadlock

TINY = ["--cpu", "--gpus", "2", "--epochs", "1", "--no-progress", "--comm-probe-steps", "0"]
FOLDER_CLASSES = ("cat", "dog", "fish")
FOLDER_TRAIN, FOLDER_VAL = 8, 5  # per class: 24 training, 15 evaluation images


def _sha1(images: ImageSet) -> str:
    return hashlib.sha1(images.images.tobytes() + images.labels.tobytes()).hexdigest()


@pytest.mark.parametrize("difficulty, sha1", [
    (0.0, "5950ee26c68c2a90a760d4ee4dd51c7ec82ab4d4"),
    (1.0, "b32ebcf06f28624c6894d9d3d0dd530f0bc5f773"),
])
def test_the_32px_100_class_synthetic_set_is_the_one_bench_always_drew(difficulty, sha1):
    """Digests of the set as bench drew it before any size or class count existed (so the
    README's table and older records keep their data)."""
    assert _sha1(synthetic_split("train", 64, 7, difficulty)) == sha1


def test_the_synthetic_set_at_another_size_and_class_count():
    big = synthetic_split("train", 300, 3, 1.0, image_size=72, classes=10)
    assert big.images.shape == (300, 72, 72, 3) and big.images.dtype == np.uint8
    assert set(big.labels.tolist()) == set(range(10))
    # a limit takes a prefix of the same stream, also across the noise's chunks
    head = synthetic_split("train", 17, 3, 1.0, image_size=72, classes=10)
    assert np.array_equal(head.images, big.images[:17])
    assert np.array_equal(head.labels, big.labels[:17])
    # learnable: the class means differ far more than the noise of a mean over ~30 images
    easy = synthetic_split("train", 300, 3, 0.0, image_size=72, classes=10)
    means = np.stack([easy.images[easy.labels == c].mean(0) for c in range(10)])
    assert np.abs(means[0] - means[1]).mean() > 15


def test_cifar_is_resized_for_larger_models_and_unchanged_at_32():
    small = synthetic_split("test", 8, 0)
    assert resized(small, 32) is small
    large = resized(small, 64)
    assert large.images.shape == (8, 64, 64, 3)
    assert np.array_equal(large.labels, small.labels)
    # bilinear upsampling keeps each image's mean colour
    assert np.abs(large.images.mean((1, 2)) - small.images.mean((1, 2))).max() < 2


def test_a_torchvision_model_at_another_size_and_class_count(tmp_path):
    assert_ok(run_bench("run", "--strategy", "ddp", "--model", "torchvision:resnet18",
                        "--data", "synthetic", "--image-size", "64", "--synthetic-classes",
                        "10", "--train-limit", "64", "--test-limit", "16", "--batch-size",
                        "16", *TINY, "--output", str(tmp_path)))
    rec = only_record(tmp_path)
    # torchvision's 11,689,512 parameters less the 1,000-class head plus a 10-class one
    assert rec["model"]["parameters"] == 11_689_512 - 512 * 1000 - 1000 + 512 * 10 + 10
    assert rec["model"]["num_classes"] == 10 and rec["model"]["image_size"] == 64
    assert rec["initial_param_fingerprint"] == rec["initial_reference_fingerprint"]
    # Hand count of multiply-adds at 64 px: the 7x7 stem at 32x32 (9.63 M), layer1's four
    # 3x3 64->64 convs at 16x16 (37.75 M), layers 2-4 33.55 M each (their strides keep
    # channels x pixels even), the 10-class head 5 k: 148.04 M forward; backward twice
    # that, less the stem's input gradient (images need none); 2 FLOPs per multiply-add.
    forward = 9.634e6 + 37.749e6 + 3 * 33.554e6 + 5120
    assert rec["train_flops_per_image"] == pytest.approx(2 * (3 * forward - 9.634e6),
                                                         rel=1e-3)
    report = run_bench("report", "--results", str(tmp_path), "--format", "csv", "--no-write")
    assert "synthetic d=1 10 classes 64 img 64px, batch 16, resnet18" in report.stdout


def write_imagefolder(root, seed: int = 0) -> None:
    """DIR/{train,val}/CLASS/*.png|jpg: learnable images of varied sizes and aspect ratios."""
    per = {"train": FOLDER_TRAIN, "val": FOLDER_VAL}
    rng = np.random.default_rng(seed)
    for split, count in per.items():
        pixels = synthetic_split("train" if split == "train" else "test", 200, seed, 0.0,
                                 image_size=40, classes=len(FOLDER_CLASSES))
        for c, name in enumerate(FOLDER_CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            chosen = np.flatnonzero(pixels.labels == c)[:count]
            for k, i in enumerate(chosen):
                size = tuple(int(v) for v in rng.integers(24, 64, size=2))
                image = Image.fromarray(pixels.images[i]).resize(size)
                image.save(folder / f"img{k}.{'jpg' if k % 3 == 0 else 'png'}")
    (root / "train" / "cat" / "notes.txt").write_text("not an image: skipped")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagefolder")
    write_imagefolder(root)
    return root


def test_an_imagefolder_trains_and_evaluates_every_image_once(image_folder, tmp_path):
    """15 evaluation images over 2 ranks (one padded slot): each counted once."""
    assert_ok(run_bench("run", "--strategy", "ddp", "--data", "imagefolder", "--data-dir",
                        str(image_folder), "--model", "user_models:tiny_cnn", "--batch-size",
                        "8", *TINY, "--epochs", "2", "--output", str(tmp_path), env=USER_MODELS))
    rec = only_record(tmp_path)
    assert rec["dataset"] == "imagefolder"
    assert (rec["train_size"], rec["test_size"]) == (3 * FOLDER_TRAIN, 3 * FOLDER_VAL)
    assert rec["model"]["num_classes"] == 3 and rec["model"]["image_size"] == 32
    for epoch in rec["per_epoch"]:
        assert epoch["test_images"] == 15 and epoch["train_images"] == 24
        correct = epoch["top1"] * 15  # a fraction: a whole number of the 15 images
        assert math.isclose(correct, round(correct), abs_tol=1e-6), epoch["top1"]


def test_files_an_imagefolder_does_not_read_are_named_not_dropped_in_silence(tmp_path):
    """torchvision's ImageFolder reads no .gif: a folder with GIFs among its PNGs trained on
    the rest, and nothing said so (a quarter of a set left out, found by its train_size).
    One line names what was left out, by split and extension, once the run is sure to
    start; bad input stays one line."""
    root = tmp_path / "images"
    write_imagefolder(root)  # and train/cat/notes.txt
    for split, count in (("train", 3), ("val", 1)):
        for k in range(count):
            Image.new("P", (30, 30)).save(root / split / "dog" / f"moving{k}.gif")
    proc = run_bench("run", "--strategy", "ddp", "--data", "imagefolder", "--data-dir",
                     str(root), "--model", "user_models:tiny_cnn", "--batch-size", "8",
                     *TINY, "--epochs", "1", "--output", str(tmp_path / "out"), env=USER_MODELS)
    assert_ok(proc)
    said = " ".join(proc.stderr.split())
    assert ("bench: --data imagefolder: left out 4 in train/, 1 in val/ (not images "
            "torchvision reads: .gif 4, .txt 1); convert the images among them to .png or "
            ".jpg to train on them") in said, proc.stderr
    rec = only_record(tmp_path / "out")
    assert (rec["train_size"], rec["test_size"]) == (3 * FOLDER_TRAIN, 3 * FOLDER_VAL)
    bad = run_bench("run", "--strategy", "ddp", "--data", "imagefolder", "--data-dir",
                    str(root), "--batch-size", "800", *TINY, "--output", str(tmp_path / "x"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


def test_an_imagefolder_trains_exactly_like_one_plain_process(image_folder):
    proc = run_bench("verify", "--strategies", "ddp,fsdp", "--gpus", "2", "--steps", "2",
                     "--batch-size", "8", "--cpu", "--data", "imagefolder", "--data-dir",
                     str(image_folder), "--model", "user_models:tiny_cnn", env=USER_MODELS)
    assert_ok(proc)
    assert proc.stdout.count(" pass ") == 2, proc.stdout


def test_an_imagefolder_limit_keeps_every_class(image_folder):
    from bench.data.imagefolder import FolderImages

    images = FolderImages(image_folder, "train", 32, augment=False, limit=9)
    assert len(images) == 9 and len({label for _, label in images.samples}) == 3
    image, label = images[0]
    assert label in (0, 1, 2)
    assert tuple(image.shape) == (3, 32, 32)


def _bad_folder(tmp_path, kind: str):
    root = tmp_path / "images"
    write_imagefolder(root)
    if kind == "no val":
        for path in sorted((root / "val").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (root / "val").rmdir()
    elif kind == "other classes":
        (root / "val" / "fish").rename(root / "val" / "bird")
    elif kind == "loop":  # a link back up the tree: its images again and again
        (root / "train" / "cat" / "again").symlink_to(root / "train")
    elif kind == "second way":  # one class's folder linked into another
        (root / "train" / "dog" / "cats").symlink_to(root / "train" / "cat")
    return root


@pytest.mark.parametrize("kind, args, says", [
    ("no val", [], "images/val is not a folder; lay the images out as DIR/train/CLASS/*.jpg"),
    ("other classes", [], "must hold the same class folders (differ in bird, fish)"),
    ("loop", [], "(a link that loops or leads into a folder read already); remove the link"),
    ("second way", [], "(a link that loops or leads into a folder read already); remove"),
    ("fine", ["--loader", "gpu"], "an ImageFolder is decoded per image: use --loader torch"),
    ("fine", ["--synthetic-classes", "5"], "--synthetic-classes applies to --data synthetic"),
    ("fine", ["--image-size", "4"], "--image-size must lie in 8..1024"),
])
def test_imagefolder_bad_input_is_one_line(kind, args, says, tmp_path):
    root = _bad_folder(tmp_path, kind)
    proc = run_bench("run", "--strategy", "ddp", "--data", "imagefolder", "--data-dir",
                     str(root), "--batch-size", "8", *TINY, *args, "--output",
                     str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr and not (tmp_path / "out" / "runs").exists()


def test_images_that_do_not_decode_fail_the_run_in_one_line(tmp_path):
    """Found only when a rank reads one: the run fails (exit 1, its record says why) with the
    file and the fix, as bad input is said, and no traceback (before: the rank's traceback,
    then `rank 0: ConfigError: ...` with PIL's message repeating the path in a repr)."""
    root = tmp_path / "images"
    write_imagefolder(root)
    for image in (root / "train" / "cat").glob("img*"):  # a third of the set: the first
        image.write_bytes(b"not an image")  # batch holds one
    proc = run_bench("run", "--strategy", "ddp", "--data", "imagefolder", "--data-dir",
                     str(root), "--batch-size", "8", *TINY, "--output", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = only_record(tmp_path / "out")["error"]
    assert re.fullmatch(rf"rank [01]: --data imagefolder: cannot decode {root}/train/cat/"
                        r"img\d+\.(jpg|png) \(UnidentifiedImageError\); remove it \[in train "
                        r"epoch 1 step 1\]", error), error  # not "waiting for the other ranks"
    assert proc.stderr.strip().splitlines()[-1].startswith(f"bench: run failed: {error}")


def test_a_decompression_bomb_fails_the_run_in_one_line_naming_it(tmp_path):
    """An image whose header claims more pixels than PIL will decode (a decompression
    bomb): a traceback naming no file, before; now the file, its size and the fix."""
    root = tmp_path / "images"
    write_imagefolder(root)
    bomb = tmp_path / "bomb.png"
    Image.new("1", (14_000, 14_000)).save(bomb)  # 196 M pixels in a few kilobytes
    for image in (root / "train" / "cat").glob("img*"):
        image.write_bytes(bomb.read_bytes())
    proc = run_bench("run", "--strategy", "ddp", "--data", "imagefolder", "--data-dir",
                     str(root), "--batch-size", "8", *TINY, "--output", str(tmp_path / "out"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    error = only_record(tmp_path / "out")["error"]
    assert re.fullmatch(rf"rank [01]: --data imagefolder: {root}/train/cat/img\d+\.(jpg|png) "
                        r"is too large to decode \(196,000,000 pixels, over PIL's "
                        r"decompression-bomb limit\); shrink or remove it \[in train epoch 1 "
                        r"step 1\]", error), error


def test_a_loader_worker_that_never_serves_fails_the_run_after_its_timeout(tmp_path):
    """A worker can hang for good: blocked on a file (here an evaluation image that is a
    named pipe nobody writes), or deadlocked at its fork (CPython < 3.11.10, gh-112275: a
    two-Slurm-task test hung so for 34 minutes). No collective times out there, and nn.
    DataParallel, like a Slurm task, runs without a launcher's watchdog: the run waited for
    ever. It now fails after --timeout, naming the loader and the phase."""
    root = tmp_path / "images"
    write_imagefolder(root)
    stuck = sorted((root / "val" / "cat").glob("img*"))[0]
    stuck.unlink()
    os.mkfifo(stuck)
    start = time.monotonic()
    proc = run_bench("run", "--strategy", "dp", "--data", "imagefolder", "--data-dir",
                     str(root), "--model", "user_models:tiny_cnn", "--batch-size", "8",
                     "--workers", "1", "--timeout", "6", *TINY, "--output",
                     str(tmp_path / "out"), env=USER_MODELS, timeout=120)
    assert proc.returncode == 1, proc.stderr
    error = only_record(tmp_path / "out")["error"]
    assert error == ("timeout: rank 0: its DataLoader workers served no batch for 6 s "
                     "(--timeout): one is stuck [in eval batch 1]"), error
    assert time.monotonic() - start < 60
    # the Pythons whose fork can hang a worker for good say so as the run starts
    assert ("gh-112275" in proc.stderr) == forks_can_deadlock(), proc.stderr
    assert [forks_can_deadlock(v) for v in ((3, 11, 7), (3, 11, 10), (3, 10, 14), (3, 9, 20),
                                            (3, 12, 0), (3, 13, 1))] == [
        True, False, True, False, False, False]


def test_a_set_the_machine_cannot_hold_is_refused_before_anything_runs(tmp_path):
    """ResNet-50's default 224 px over the whole 60,000-image synthetic set: ~21 GiB per
    process on a machine given 2 of them (this one has 24 GiB; a larger one is asked for
    more processes)."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    processes = max(2, math.ceil(memory / 20e9))
    proc = run_bench("run", "--strategy", "ddp", "--model", "torchvision:resnet50", "--data",
                     "synthetic", "--cpu", "--gpus", str(processes), "--batch-size",
                     str(processes * 4), "--output", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "lower --train-limit" in proc.stderr and "224 px" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_sweep_of_another_image_folder_is_not_done_already(tmp_path):
    """A sweep's combinations are done where the output holds their ok records, by a key of
    the recipe that left out where the data lies: right for CIFAR-100, wrong for an
    ImageFolder, whose folder is the data. A sweep over a second folder into the same
    output skipped every run as done, and its rows were the first folder's."""
    for name in ("flowers", "cars"):
        write_imagefolder(tmp_path / name)
    for name in ("flowers", "cars"):
        proc = run_bench("sweep", "--strategies", "ddp", "--gpus", "1", "--data", "imagefolder",
                         "--data-dir", str(tmp_path / name), "--model", "user_models:tiny_cnn",
                         "--batch-size", "8", "--cpu", "--epochs", "1", "--no-progress",
                         "--comm-probe-steps", "0", "--output", str(tmp_path / "out"),
                         env=USER_MODELS)
        assert proc.returncode == 0, proc.stderr
    found = sorted(r["data_dir"] for r in records(tmp_path / "out"))
    assert found == [str(tmp_path / "cars"), str(tmp_path / "flowers")], found
