"""``--data imagefolder --data-dir DIR``: the user's own images, laid out as ImageNet's are:
``DIR/train/CLASS/*.jpg`` and ``DIR/val/CLASS/*.jpg`` (torchvision's ``ImageFolder``: the
classes are the sorted folder names, the same in both splits).

Training images get the standard ImageNet augmentation (a random resized crop to the run's
image size and a horizontal flip), evaluation images a resize to 8/7 of the size and a center
crop (224 from 256); both are normalised with ImageNet's mean and standard deviation. Images
are decoded per item by the DataLoader's workers, so only ``--loader torch`` serves them."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from bench.tools.errors import ConfigError
from bench.tools.folders import looked_up

SPLIT_FOLDERS = {"train": "train", "test": "val"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_LAYOUT = "DIR/train/CLASS/*.jpg and DIR/val/CLASS/*.jpg"


def _classes(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def folder_classes(root: str | Path) -> list[str]:
    """The class names (the training split's folders); one line naming the fix when the
    layout is not ImageNet's or the splits disagree."""
    root = Path(root)
    looked_up(root.expanduser(), "--data-dir", root)
    found = {}
    for split, name in SPLIT_FOLDERS.items():
        folder = root / name
        if not folder.is_dir():
            raise ConfigError(f"--data imagefolder: {folder} is not a folder; lay the images "
                              f"out as {_LAYOUT} (--data-dir DIR)")
        found[split] = _classes(folder)
        if not found[split]:
            raise ConfigError(f"--data imagefolder: {folder} has no class folders; lay the "
                              f"images out as {_LAYOUT}")
    if found["train"] != found["test"]:
        only = sorted(set(found["train"]) ^ set(found["test"]))
        raise ConfigError(f"--data imagefolder: train/ and val/ must hold the same class "
                          f"folders (differ in {', '.join(only[:5])}"
                          f"{' ...' if len(only) > 5 else ''})")
    if len(found["train"]) < 2:
        raise ConfigError(f"--data imagefolder: {root / 'train'} has one class; a classifier "
                          "needs at least 2")
    return found["train"]


def _samples(root: Path, split: str) -> list[tuple[str, int]]:
    """(path, class index) of every image of a split (_walk)."""
    return _walk(root, split)[0]


def _walk(root: Path, split: str) -> tuple[list[tuple[str, int]], Counter[str]]:
    """(path, class index) of every image of a split, in torchvision ImageFolder's order
    (classes sorted, then each class folder walked, folders and files sorted), following
    links as it does, but never into a folder reached before: a link back up the tree (a
    loop) or a second way into one folder would serve its images again and again (a
    40-image tree trained as 840), so it is refused in one line. And the files left out, by
    extension (a .gif or .avif is no image torchvision's ImageFolder reads; hidden files
    are not counted)."""
    folder = root / SPLIT_FOLDERS[split]
    classes = folder_classes(root)
    extensions = _extensions()
    samples = []
    skipped: Counter[str] = Counter()
    seen: dict[tuple[int, int], str] = {}  # every folder of the split, by device and inode
    for index, name in enumerate(classes):
        walked = []
        try:
            for here, _dirs, files in os.walk(folder / name, followlinks=True,
                                              onerror=_raise):
                info = os.stat(here)
                first = seen.setdefault((info.st_dev, info.st_ino), here)
                if first != here:
                    raise ConfigError(f"--data imagefolder: {here} is {first} again (a link "
                                      "that loops or leads into a folder read already); "
                                      "remove the link")
                walked.append((here, files))
        except OSError as exc:
            raise ConfigError(f"--data imagefolder: cannot read {folder / name} "
                              f"({exc.strerror or exc})") from None
        for here, files in sorted(walked):
            samples.extend((os.path.join(here, f), index) for f in sorted(files)
                           if f.lower().endswith(extensions))
            skipped.update(os.path.splitext(f)[1].lower() or "no extension" for f in files
                           if not f.lower().endswith(extensions) and not f.startswith("."))
    if not samples:
        raise ConfigError(f"--data imagefolder: no images in {folder} (extensions "
                          f"{', '.join(extensions)})")
    return samples, skipped


def _raise(exc: OSError) -> None:
    raise exc


def _extensions() -> tuple[str, ...]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return IMG_EXTENSIONS


def chosen(count: int, limit: int | None) -> np.ndarray:
    """Which images a limit keeps: the first ``limit`` of one fixed permutation (the folder
    order is class by class; a prefix of it would hold only the first classes). Without a
    limit, all of them in folder order."""
    if limit is None or limit >= count:
        return np.arange(count)
    return np.random.default_rng(0).permutation(count)[:limit]


def sizes_and_left_out(root: str | Path) -> tuple[int, int, str | None]:
    """Images in the train and val splits (before any limit), and one line naming the files
    of either that are not images ImageFolder reads, by extension (None: none). They were
    left out without a word: a folder with .gif files among its .png trained on what was
    left. Each split walked once (ImageNet's is 1.28 M files)."""
    (train, train_out), (test, test_out) = (_walk(Path(root), split) for split in SPLIT_FOLDERS)
    counts = {"train": train_out, "val": test_out}
    if not train_out and not test_out:
        return len(train), len(test), None
    where = ", ".join(f"{sum(c.values())} in {name}/" for name, c in counts.items() if c)
    kinds = (train_out + test_out).most_common()
    note = (f"--data imagefolder: left out {where} (not images torchvision reads: "
            + ", ".join(f"{ext} {n}" for ext, n in kinds[:6])
            + (", ..." if len(kinds) > 6 else "")
            + "); convert the images among them to .png or .jpg to train on them")
    return len(train), len(test), note


class FolderImages(Dataset):
    """One split's images, decoded and transformed per item: ``(image, label)``."""

    def __init__(self, root: str | Path, split: str, image_size: int, augment: bool,
                 limit: int | None = None) -> None:
        from torchvision import transforms

        samples = _samples(Path(root), split)
        self.samples = [samples[i] for i in chosen(len(samples), limit)]
        normalise = [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        if augment:
            self.transform = transforms.Compose([
                transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                *normalise])
        else:
            self.transform = transforms.Compose([
                transforms.Resize(round(image_size * 8 / 7)), transforms.CenterCrop(image_size),
                *normalise])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from torchvision.datasets.folder import default_loader

        path, label = self.samples[index]
        from PIL import Image

        try:
            image = default_loader(path)
        except OSError as exc:  # a truncated or non-image file: name it (PIL's own message
            # repeats the path inside a file object's repr)
            raise ConfigError(f"--data imagefolder: cannot decode {path} "
                              f"({type(exc).__name__}); remove it") from None
        except Image.DecompressionBombError as exc:  # PIL refuses to decode it at all
            pixels = re.search(r"\((\d+) pixels\)", str(exc))
            raise ConfigError(f"--data imagefolder: {path} is too large to decode "
                              f"({f'{int(pixels.group(1)):,} pixels, ' if pixels else ''}"
                              "over PIL's decompression-bomb limit); shrink or remove it"
                              ) from None
        return self.transform(image), label
