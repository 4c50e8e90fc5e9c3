"""One rank's batches: the training loader (DataLoader + per-image transforms, or the
device-resident ``--loader gpu``), its sampler, and the exact evaluation shard."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bench.config.run_config import RunConfig
from bench.data.datasets import dataset, image_set
from bench.data.device_loader import DeviceLoader
from bench.data.image_sets import ImageSet
from bench.tools.faults import slow_loader_from_env
from bench.tools.lifetime import die_with_parent
from strategies.base import Strategy


class Indexed(Dataset):
    """A training set whose items also carry their sample index, so that the loop can
    prove which samples it was served (``data_order_sha1``). ``delay_s``: a test hook's
    wait per image (BENCH_SLOW_LOADER_MS)."""

    def __init__(self, base: Dataset, delay_s: float = 0.0) -> None:
        self.base, self.delay_s = base, delay_s

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        image, label = self.base[index]
        return image, label, index


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


def quiet_worker_count_warning() -> None:
    """torch's DataLoader warns, twice for each loader and rank, in 300 characters, when
    its workers outnumber the cores this process may use; ``bench run`` says it once
    (its start's summary) and ``bench loader`` shows what they cost."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning,
                            message=r"This DataLoader will create \d+ worker processes in total")


@dataclass
class Loaders:
    """What the trainer iterates: train batches ``(images, labels, indices)`` (their sampler
    takes ``set_epoch``) and test batches ``(images, labels, valid)``."""

    train: Iterable
    test: Iterable
    sampler: torch.utils.data.DistributedSampler
    train_size: int
    test_size: int


def build_loaders(cfg: RunConfig, strategy: Strategy, *, micro_batch: int, eval_batch: int,
                  workers: int, augment: bool) -> Loaders:
    """This rank's loaders. Augmentation differs per rank (and per loader worker),
    deterministically: torch's RNG is seeded here from the run's seed and the rank."""
    aug_seed = seed_augmentation(cfg, strategy.rank)
    if cfg.loader == "gpu":
        train_images, test_images = image_set(cfg, "train"), image_set(cfg, "test")
        eval_indices = strategy.eval_indices(len(test_images))
        train = device_training_loader(cfg, strategy, train_images, micro_batch=micro_batch,
                                       augment=augment, aug_seed=aug_seed)
        test = DeviceLoader(
            test_images, strategy.device, eval_batch, train=False, indices=eval_indices,
            channels_last=cfg.channels_last,
        )
        return Loaders(train, test, train.sampler, len(train_images), len(test_images))
    pin = strategy.device.type == "cuda"
    train_set, test_set = dataset(cfg, "train", augment), dataset(cfg, "test", False)
    eval_indices = strategy.eval_indices(len(test_set))
    train = training_loader(cfg, strategy, train_set, micro_batch=micro_batch,
                            workers=workers, aug_seed=aug_seed)
    test = DataLoader(
        EvalShard(test_set, eval_indices),
        batch_size=eval_batch, shuffle=False, num_workers=workers, pin_memory=pin,
        persistent_workers=workers > 0, worker_init_fn=dying_with_this_process(),
        timeout=stuck_worker_timeout(cfg, workers),
    )
    return Loaders(train, test, train.sampler, len(train_set), len(test_set))


def stuck_worker_timeout(cfg: RunConfig, workers: int) -> float:
    """How long a rank waits for a batch from its loader workers: the run's --timeout. A
    worker that hangs (blocked on a file, or deadlocked in its fork) would otherwise keep its
    rank waiting for ever, where no collective times out; under a launcher its watchdog
    ends the run a little later, naming only the phase."""
    return cfg.timeout if workers > 0 else 0


def seed_augmentation(cfg: RunConfig, rank: int) -> int:
    """Seed torch's RNG for this rank's augmentation (distinct per rank, the same in every
    run of the seed) and return the seed, which the training loader's generator takes."""
    aug_seed = cfg.seed * 1_000_003 + 1 + rank
    torch.manual_seed(aug_seed)
    return aug_seed


def device_training_loader(cfg: RunConfig, strategy: Strategy, images: ImageSet, *,
                           micro_batch: int, augment: bool, aug_seed: int) -> DeviceLoader:
    """This rank's ``--loader gpu`` training batches: the whole set on its device, the
    crop and flip drawn batch-wide there."""
    return DeviceLoader(
        images, strategy.device, micro_batch, train=True, augment=augment, seed=cfg.seed,
        world_size=strategy.world_size, rank=strategy.rank, aug_seed=aug_seed,
        channels_last=cfg.channels_last,
    )


def training_loader(cfg: RunConfig, strategy: Strategy, train_set: Dataset, *,
                    micro_batch: int, workers: int, aug_seed: int) -> DataLoader:
    """This rank's ``--loader torch`` training batches ``(images, labels, indices)``: its
    shard of the epoch's global order, ``workers`` worker processes kept across epochs, pinned
    memory on CUDA."""
    return DataLoader(
        Indexed(train_set, slow_loader_from_env(strategy)), batch_size=micro_batch,
        sampler=strategy.train_sampler(train_set, cfg.seed), drop_last=True,
        num_workers=workers, pin_memory=strategy.device.type == "cuda",
        persistent_workers=workers > 0, generator=torch.Generator().manual_seed(aug_seed),
        worker_init_fn=dying_with_this_process(), timeout=stuck_worker_timeout(cfg, workers),
    )


def dying_with_this_process() -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn`` that arms each worker's death signal: torch's own
    watchdog notices a dead rank only between batches (up to 5 s on, and after an
    out-of-memory kill its workers were seen waiting a minute later)."""
    return functools.partial(_die_with, os.getpid())


def _die_with(parent: int, worker_id: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGTERM, _leave_quietly)


def _leave_quietly(signum: int, frame: object) -> NoReturn:
    """A worker's SIGTERM (to the whole process group: timeout, scancel; or its rank's own
    clean-up) ends it with exit 0: killed by the signal, it made its rank's torch raise
    'DataLoader worker ... is killed by signal: Terminated' over bench's one line. It must
    still end: a rank's multiprocessing waits for it at exit."""
    os._exit(0)


def endless(loader: Iterable) -> Iterator:
    """The loader's batches again and again (a short epoch is reused; nothing is cached)."""
    while True:
        yield from loader


def input_memory_format(cfg) -> torch.memory_format:
    """The layout a batch takes on the device: NHWC under ``--channels-last`` (as the model's
    weights), else as it came."""
    return torch.channels_last if cfg.channels_last else torch.preserve_format


def batch_to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device,
                    dtype: torch.dtype, memory_format: torch.memory_format
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch on the device in the run's dtype and memory format (without waiting):
    the last stage of the input pipeline."""
    return (images.to(device, dtype, non_blocking=True, memory_format=memory_format),
            labels.to(device, non_blocking=True))


WARMUP_PAST_WORKERS = 2  # draws after every worker has delivered once: steady state


def draw_seconds(batches: Iterator, *, workers: int, steps: int,
                 move: Callable[[torch.Tensor, torch.Tensor], object],
                 sync: Callable[[], None], beat: Callable[[str], None] | None = None) -> float:
    """Seconds this rank took to draw ``steps`` batches and ``move`` each onto the device,
    after a warm-up that lets each of its ``workers`` deliver once (steady state). ``sync``
    waits for the device (and, where ranks draw together, for the other
    ranks) before the clock starts and before it stops."""
    start, warmup = 0.0, workers + WARMUP_PAST_WORKERS
    for batch in range(warmup + steps):
        if batch == warmup:
            sync()
            start = time.perf_counter()
        if beat is not None:
            beat(f"loader probe batch {batch + 1}")
        images, labels = next(batches)[:2]
        move(images, labels)
    sync()
    return time.perf_counter() - start


@contextlib.contextmanager
def unchanged_randomness(loader):
    """Batches drawn inside (the compile warm-up's) leave the augmentation stream where it
    was: torch's global RNG and the loader's own generator are restored on the way out."""
    generator = getattr(loader, "generator", None)
    saved = torch.get_rng_state(), generator.get_state() if generator is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        if generator is not None:
            generator.set_state(saved[1])


_LANE_SALTS = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)


def _splitmix64(keys: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash of each key (uint64 arithmetic wraps, as intended)."""
    z = keys + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def served_order_lanes(indices: np.ndarray, rank: int, world_size: int) -> list[int]:
    """This rank's share of an order-sensitive multiset hash of the epoch's training sequence.

    The j-th sample a rank was served stands at position ``rank + world_size * j`` of the
    one-process sequence (how DistributedSampler deals positions out), so each served item
    is a pair (position, sample index). Summing a 36-bit hash of every pair over ranks gives
    the same lanes whatever the world size, exactly when the same samples were trained at the
    same positions; sums stay below 2**53, so a float64 all-reduce adds them exactly."""
    with np.errstate(over="ignore"):
        positions = np.uint64(rank) + np.uint64(world_size) * np.arange(len(indices),
                                                                        dtype=np.uint64)
        keys = (positions << np.uint64(32)) | indices.astype(np.uint64)
        return [int((_splitmix64(keys ^ np.uint64(salt)) >> np.uint64(28)).sum())
                for salt in _LANE_SALTS]


def order_digest(lanes: list[float], count: int) -> str:
    """The record's ``data_order_sha1`` from the lanes summed over ranks."""
    text = ",".join(str(int(v)) for v in lanes) + f";{count}"
    return hashlib.sha1(text.encode()).hexdigest()
