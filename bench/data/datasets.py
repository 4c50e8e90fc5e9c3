"""Which images a run trains on, at which size and with how many classes, whatever the data
(CIFAR-100, synthetic, an ImageFolder): the one place the loaders, ``bench verify``, the
FLOP count and the same-start fingerprint ask."""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import Dataset

from bench.config.run_config import RunConfig
from bench.data.image_sets import (
    NUM_CLASSES,
    SYNTHETIC_SIZES,
    CifarTensorDataset,
    ImageSet,
    crop_padding,
    load_cifar100_split,
    resized,
    synthetic_split,
)
from bench.models.registry import ModelSpec
from bench.tools.errors import ConfigError


def num_classes(cfg: RunConfig) -> int:
    """100 for CIFAR-100, ``--synthetic-classes`` for the synthetic set, the folders of an
    ImageFolder."""
    if cfg.data == "imagefolder":
        from bench.data.imagefolder import folder_classes

        return len(folder_classes(cfg.data_dir))
    return cfg.synthetic_classes if cfg.data == "synthetic" else NUM_CLASSES


def model_spec(cfg: RunConfig) -> ModelSpec:
    """The run's model: name, width, classes (from the data) and image size."""
    return ModelSpec(cfg.model, cfg.width, num_classes(cfg), cfg.input_size)


def _limit(cfg: RunConfig, split: str) -> int | None:
    return cfg.train_limit if split == "train" else cfg.test_limit


def image_set(cfg: RunConfig, split: str) -> ImageSet:
    """One split as uint8 images at the run's size, cut to its limit (CIFAR-100 resized when
    the run's size is not 32). An ImageFolder is decoded per item instead (``dataset``)."""
    limit = _limit(cfg, split)
    if cfg.data == "synthetic":
        return synthetic_split(split, limit or SYNTHETIC_SIZES[split], cfg.seed,
                               cfg.synthetic_difficulty, cfg.input_size, cfg.synthetic_classes)
    if cfg.data == "imagefolder":
        raise ConfigError("--data imagefolder decodes images per item: use --loader torch")
    return resized(load_cifar100_split(Path(cfg.data_dir), split).head(limit), cfg.input_size)


def dataset(cfg: RunConfig, split: str, augment: bool) -> Dataset:
    """One split as a torch Dataset of ``(normalised image, label)``; ``augment``: random
    crop and flip (the standard ones of the data: CIFAR's or ImageNet's)."""
    if cfg.data == "imagefolder":
        from bench.data.imagefolder import FolderImages

        return FolderImages(cfg.data_dir, split, cfg.input_size, augment, _limit(cfg, split))
    return CifarTensorDataset(image_set(cfg, split), augment=augment)


def memory_bytes(cfg: RunConfig, train: int, test: int) -> int:
    """What one process holds of a set kept in memory as uint8 (CIFAR-100, synthetic; the
    training copy padded for the random crop); 0 for an ImageFolder (decoded per item)."""
    if cfg.data == "imagefolder":
        return 0
    size = cfg.input_size
    padded = size + 2 * crop_padding(size)
    # the array loaded plus its tensor (padded for training), held side by side
    return train * 3 * (size * size + padded * padded) + test * 3 * size * size * 2


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_memory(cfg: RunConfig, train: int, test: int, processes: int) -> None:
    """Refuse, before anything is written, a set that the machine's processes cannot hold."""
    per_process = memory_bytes(cfg, train, test)
    need = per_process * processes
    have = physical_memory()
    if have is None:
        return
    if need > 0.8 * have:
        per = per_process / 2**30
        fits = max(1, int(train * 0.8 * have / need) // cfg.batch_size * cfg.batch_size)
        raise ConfigError(
            f"{train + test} images at {cfg.input_size} px take {per:,.1f} GiB in "
            + ("its one process" if processes == 1 else f"each of its {processes} processes")
            + f", more than this machine's {have / 2**30:.0f} GiB holds; "
            f"lower --train-limit (e.g. {fits}) or --image-size"
        )
