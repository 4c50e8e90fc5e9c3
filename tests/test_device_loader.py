"""--loader gpu: same shards as DistributedSampler, torchvision crop/flip semantics, and the
speed flags recorded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    USER_MODELS,
    assert_ok,
    crop_candidates,
    distinguishable_image,
    only_record,
    run_bench,
    which_crop,
)
from torch.utils.data import DataLoader, DistributedSampler

from bench.data.device_loader import DeviceLoader, random_crop_flip
from bench.data.image_sets import CifarTensorDataset, ImageSet
from bench.data.loaders import Indexed, unchanged_randomness
from bench.report import summary_table
from strategies.base import order_seed

N = 100  # label i marks image i, so the labels show which images a rank drew


def _indexed_set() -> ImageSet:
    return ImageSet(np.zeros((N, 32, 32, 3), np.uint8), np.arange(N, dtype=np.int64))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_shards_match_distributed_sampler(world):
    cpu = torch.device("cpu")
    for epoch in (0, 1):
        drawn = []
        for rank in range(world):
            loader = DeviceLoader(_indexed_set(), cpu, 8, train=True, seed=5, world_size=world,
                                  rank=rank, aug_seed=rank)
            loader.sampler.set_epoch(epoch)
            labels = [int(v) for _, y, _ in loader for v in y]
            # DistributedSampler's shards of the permutation the run draws for (5, epoch)
            ref = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=True,
                                     seed=order_seed(5, epoch), drop_last=True)
            expected = list(ref)[: len(loader) * 8]
            assert labels == expected
            drawn.append(labels)
        flat = [i for d in drawn for i in d]
        assert len(flat) == len(set(flat))  # no overlap between ranks


def test_crop_flip_hand_checked():
    padded = torch.zeros(1, 1, 40, 40, dtype=torch.uint8)
    padded[0, 0, 4, 4] = 255  # the image's top-left pixel after 4-pixel padding
    zero, four = torch.tensor([0]), torch.tensor([4])
    same = random_crop_flip(padded, four, four, torch.tensor([False]))
    assert same[0, 0, 0, 0] == 255 and same.sum() == 255  # offset (4,4): the image itself
    shifted = random_crop_flip(padded, zero, zero, torch.tensor([False]))
    assert shifted[0, 0, 4, 4] == 255  # offset (0,0): image moved down-right by 4
    mirrored = random_crop_flip(padded, zero, zero, torch.tensor([True]))
    assert mirrored[0, 0, 4, 27] == 255  # then mirrored: column 4 -> 31 - 4


def test_augmentation_matches_torchvision_semantics():
    img = distinguishable_image()
    keys, stack = crop_candidates(img)
    loader = DeviceLoader(ImageSet(img[None].repeat(64, 0), np.zeros(64, np.int64)),
                          torch.device("cpu"), 64, train=True, aug_seed=0)
    seen = set()
    for _ in range(60):  # all of them come within ~15 batches (coupon collector: ~n ln n)
        for out in next(iter(loader))[0]:
            seen.add(which_crop(out, keys, stack))
        if seen >= set(keys):
            break
    assert seen == set(keys)  # every offset, mirrored and not, and nothing else


def test_speed_flags_are_recorded_and_change_no_batch(tmp_path):
    """The GPU loader (batch-wide crop/flip) with channels_last, foreach SGD and compile (whose
    warm-up draws a batch before the timed epochs) serves the same global batches, epoch by
    epoch, as the DataLoader with none of them. Compiled in the CUDA-graph mode, a CPU run
    says that no CUDA graph ran, and its report row says so too. The model is a tiny CNN:
    what it is does not change the batches, and with torch's compile cache empty, as on a
    fresh machine, the compiled run took 68 CPU-s with ResNet-18 (x0.125) and 12 with it;
    the GPU check's fastest-path item compiles ResNet-18 under DDP on CPU
    (tests/test_gpu_check.py)."""
    common = ["--strategy", "ddp", "--gpus", "2", "--cpu", "--epochs", "2", "--data",
              "synthetic", "--train-limit", "256", "--test-limit", "10", "--model",
              "user_models:tiny_cnn", "--batch-size", "32", "--no-progress",
              "--comm-probe-steps", "0"]
    assert_ok(run_bench("run", *common, "--loader", "torch", "--output", str(tmp_path / "torch"),
                        env=USER_MODELS))
    assert_ok(run_bench("run", *common, "--loader", "gpu", "--channels-last", "--optimizer-impl",
                        "foreach", "--compile", "reduce-overhead", "--output",
                        str(tmp_path / "fast"), env=USER_MODELS, timeout=600))
    plain, fast = only_record(tmp_path / "torch"), only_record(tmp_path / "fast")
    assert fast["loader"] == "gpu" and fast["channels_last"] is True
    assert fast["optimizer_impl"] == "foreach" and fast["compile"] is True
    assert fast["compile_time_s"] > 0 and plain["compile"] is False
    assert fast["compile_mode"] == "reduce-overhead" and plain["compile_mode"] is None
    assert fast["cudagraphs"] == "not on CPU (CUDA graphs need a GPU)"
    assert plain["cudagraphs"] is None
    rows = summary_table([plain, fast])
    assert set(rows["options"]) == {"—", "gpu loader, channels_last, compile reduce-overhead "
                                         "(no CUDA graphs), foreach SGD"}
    assert fast["cudnn_benchmark"] is None  # CPU run: not applicable
    assert [e["test_images"] for e in fast["per_epoch"]] == [10, 10]
    assert fast["replicas_identical"] is True
    assert ([e["data_order_sha1"] for e in plain["per_epoch"]]
            == [e["data_order_sha1"] for e in fast["per_epoch"]])


@pytest.mark.parametrize("loader", ["torch", "gpu"])
def test_a_warm_up_batch_leaves_the_augmentation_stream_alone(loader):
    """--compile draws one batch before the timed epochs; epoch 1 must still see the crops
    and flips it would have seen without it."""
    images = ImageSet(np.stack([distinguishable_image()] * 16), np.arange(16, dtype=np.int64))

    def build():
        torch.manual_seed(123)
        if loader == "gpu":
            return DeviceLoader(images, torch.device("cpu"), 8, train=True, aug_seed=123)
        return DataLoader(Indexed(CifarTensorDataset(images, augment=True)), batch_size=8,
                          generator=torch.Generator().manual_seed(123))

    plain = next(iter(build()))[0]
    warmed = build()
    with unchanged_randomness(warmed):
        next(iter(warmed))
    assert torch.equal(next(iter(warmed))[0], plain)
    unguarded = build()
    next(iter(unguarded))
    assert not torch.equal(next(iter(unguarded))[0], plain)  # the guard is what matters
