"""One rank's batches: the training loader (DataLoader + per-image transforms, or the
device-resident ``--loader gpu``), its sampler, and the exact evaluation shard."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from bench.config import RunConfig
from bench.data import CifarTensorDataset, load_split
from bench.device_loader import DeviceLoader
from strategies.base import Strategy, epoch_sampler


class EvalShard(Dataset):
    """A rank's test images; ``None`` entries are padding (served, flagged not valid)."""

    def __init__(self, base: Dataset, indices: list[int | None]) -> None:
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        image, label = self.base[0 if index is None else index]
        return image, label, index is not None


@dataclass
class Loaders:
    """What the trainer iterates: train batches (their sampler takes ``set_epoch``) and
    test batches ``(images, labels, valid)``."""

    train: Iterable
    test: Iterable
    sampler: torch.utils.data.DistributedSampler
    train_size: int
    test_size: int


def build_loaders(cfg: RunConfig, strategy: Strategy, *, micro_batch: int, eval_batch: int,
                  workers: int, augment: bool) -> Loaders:
    """This rank's loaders. Augmentation differs per rank (and per loader worker),
    deterministically: torch's RNG is seeded here from the run's seed and the rank."""
    aug_seed = cfg.seed * 1_000_003 + 1 + strategy.rank
    torch.manual_seed(aug_seed)
    train_images = load_split(cfg.data, "train", cfg.data_dir, cfg.seed, cfg.train_limit)
    test_images = load_split(cfg.data, "test", cfg.data_dir, cfg.seed, cfg.test_limit)
    eval_indices = strategy.eval_indices(len(test_images))
    if cfg.loader == "gpu":
        train = DeviceLoader(
            train_images, strategy.device, micro_batch, train=True, augment=augment,
            seed=cfg.seed, world_size=strategy.world_size, rank=strategy.rank,
            aug_seed=aug_seed, channels_last=cfg.channels_last,
        )
        test = DeviceLoader(
            test_images, strategy.device, eval_batch, train=False, indices=eval_indices,
            channels_last=cfg.channels_last,
        )
        return Loaders(train, test, train.sampler, len(train_images), len(test_images))
    pin = strategy.device.type == "cuda"
    train_set = CifarTensorDataset(train_images, augment=augment)
    sampler = strategy.train_sampler(train_set, cfg.seed)
    train = DataLoader(
        train_set, batch_size=micro_batch, sampler=sampler, drop_last=True,
        num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(aug_seed),
    )
    test = DataLoader(
        EvalShard(CifarTensorDataset(test_images, augment=False), eval_indices),
        batch_size=eval_batch, shuffle=False, num_workers=workers, pin_memory=pin,
        persistent_workers=workers > 0,
    )
    return Loaders(train, test, sampler, len(train_images), len(test_images))


def global_order_digest(dataset, seed: int, epoch: int, world_size: int, per_rank: int) -> str:
    """SHA-1 of the sequence of global batches (each as a sorted set of sample indices).
    Equal digests mean two runs trained on exactly the same batches in the same order."""
    per_rank_indices = []
    for rank in range(world_size):
        sampler = epoch_sampler(dataset, seed, world_size, rank)
        sampler.set_epoch(epoch)
        per_rank_indices.append(list(sampler))
    steps = len(per_rank_indices[0]) // per_rank
    digest = hashlib.sha1()
    for step in range(steps):
        batch = sorted(
            i for idx in per_rank_indices for i in idx[step * per_rank : (step + 1) * per_rank]
        )
        digest.update(",".join(map(str, batch)).encode() + b";")
    return digest.hexdigest()
