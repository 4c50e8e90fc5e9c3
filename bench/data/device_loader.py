"""``--loader gpu``: the whole dataset held on the rank's device as uint8, random crop (pad 4
at 32 px) and horizontal flip done batch-wide on the device,
normalisation fused into the conversion.
No DataLoader, no worker processes. Each rank draws its shard exactly as
``DistributedSampler`` would (same seed, ``set_epoch``, drop_last), so the global batches are
the same as with ``--loader torch``. On CPU the same pipeline runs on CPU tensors."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from bench.data.image_sets import CIFAR100_MEAN, CIFAR100_STD, ImageSet, crop_padding
from strategies.base import epoch_sampler


def random_crop_flip(padded: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
                     flip: torch.Tensor, size: int = 32) -> torch.Tensor:
    """Crop ``size`` x ``size`` windows at per-image offsets from a padded batch
    (B x C x H x W) and mirror the images where ``flip`` is set: one gather over each
    flattened plane."""
    batch, channels, height, width = padded.shape
    steps = torch.arange(size, device=padded.device)
    rows = top[:, None] + steps  # B x size
    cols = left[:, None] + steps
    cols = torch.where(flip[:, None], cols.flip(-1), cols)
    flat = (rows[:, :, None] * width + cols[:, None, :]).reshape(batch, 1, size * size)
    planes = padded.reshape(batch, channels, height * width)
    crops = planes.gather(2, flat.expand(batch, channels, size * size))
    return crops.reshape(batch, channels, size, size)


class DeviceLoader:
    """Iterates device-resident uint8 data: training batches ``(images, labels, indices)``
    (the sample indices served), test batches ``(images, labels, valid)``."""

    def __init__(self, images: ImageSet, device: torch.device, batch_size: int, *,
                 train: bool, augment: bool = True, seed: int = 0, world_size: int = 1,
                 rank: int = 0,
                 aug_seed: int = 0, indices: list[int | None] | None = None,
                 channels_last: bool = False) -> None:
        chw = torch.from_numpy(images.images).permute(0, 3, 1, 2).contiguous()
        self.augment = train and augment
        self.size = chw.shape[-1]
        self.pad = crop_padding(self.size)
        pixels = torch.nn.functional.pad(chw, (self.pad,) * 4) if self.augment else chw
        self.pixels = pixels.to(device)
        self.labels = torch.from_numpy(images.labels).to(device)
        self.device, self.batch_size, self.train = device, batch_size, train
        self.channels_last = channels_last
        self.mean = (torch.tensor(CIFAR100_MEAN, device=device) * 255).view(1, 3, 1, 1)
        self.inv_std = 1.0 / (torch.tensor(CIFAR100_STD, device=device) * 255).view(1, 3, 1, 1)
        self.sampler = epoch_sampler(range(len(images)), seed, world_size, rank) if train else None
        self.indices = indices
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(aug_seed)

    def __len__(self) -> int:
        count = len(self.sampler) if self.sampler is not None else len(self.indices or [])
        if self.train:
            return count // self.batch_size
        return -(-count // self.batch_size)

    def _normalise(self, batch: torch.Tensor) -> torch.Tensor:
        out = (batch.float() - self.mean) * self.inv_std
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last else out

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self.train:
            order = torch.tensor(list(self.sampler), device=self.device)
            for k in range(len(self)):
                idx = order[k * self.batch_size : (k + 1) * self.batch_size]
                if not self.augment:
                    yield self._normalise(self.pixels[idx]), self.labels[idx], idx
                    continue
                n = idx.numel()
                offsets = torch.randint(0, 2 * self.pad + 1, (2, n), device=self.device,
                                        generator=self.generator)
                flip = torch.rand(n, device=self.device, generator=self.generator) < 0.5
                crops = random_crop_flip(self.pixels[idx], offsets[0], offsets[1], flip,
                                         self.size)
                yield self._normalise(crops), self.labels[idx], idx
            return
        indices = self.indices or []
        for k in range(len(self)):
            part = indices[k * self.batch_size : (k + 1) * self.batch_size]
            valid = torch.tensor([i is not None for i in part], device=self.device)
            idx = torch.tensor([0 if i is None else i for i in part], device=self.device)
            yield self._normalise(self.pixels[idx]), self.labels[idx], valid
