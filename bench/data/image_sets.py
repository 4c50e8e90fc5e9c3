"""Datasets: real CIFAR-100 (official files), synthetic CIFAR-shaped data, and a writer for
small sets in the exact ``cifar-100-python`` format."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from bench.tools.errors import ConfigError
from bench.tools.folders import looked_up, missing_folders, remove_created

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_ARCHIVE = "cifar-100-python.tar.gz"
CIFAR100_ARCHIVE_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
CIFAR100_FOLDER = "cifar-100-python"
CIFAR100_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
NUM_CLASSES = 100
SYNTHETIC_SIZES = {"train": 50_000, "test": 10_000}


@dataclass
class ImageSet:
    """Images as uint8 N x S x S x 3 (HWC, like the CIFAR files) and int64 labels."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, limit: int | None) -> ImageSet:
        if limit is None or limit >= len(self):
            return self
        return ImageSet(self.images[:limit], self.labels[:limit])


# --------------------------------------------------------------------------- CIFAR-100 files


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cifar100_present(root: Path) -> bool:
    folder = Path(root) / CIFAR100_FOLDER
    return all((folder / name).is_file() for name in CIFAR100_MD5)


def cifar100_url() -> str:
    """The archive's URL: the official one, or a mirror named by ``$BENCH_CIFAR100_URL``."""
    return os.environ.get("BENCH_CIFAR100_URL") or CIFAR100_URL


def download_cifar100(root: Path) -> None:
    """Download and unpack the archive; its md5 must be the official one."""
    from torchvision.datasets.utils import download_and_extract_archive

    root = Path(root).absolute()
    created: list[Path] = []
    try:
        created = missing_folders(root)
        root.mkdir(parents=True, exist_ok=True)
        download_and_extract_archive(
            cifar100_url(), str(root), filename=CIFAR100_ARCHIVE, md5=CIFAR100_ARCHIVE_MD5
        )
    except Exception as exc:  # network errors come in many types
        with contextlib.suppress(OSError):  # a symlink loop cannot even be looked at
            (root / CIFAR100_ARCHIVE).unlink(missing_ok=True)  # no half-downloaded archive
        remove_created(created)  # nor the folders this attempt made
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"CIFAR-100 is not in {root} and could not be downloaded ({reason}); put "
            f"{CIFAR100_FOLDER}/ there (--data-dir) or use --data synthetic"
        ) from None


def is_official_cifar100(root: Path) -> bool:
    """True when the three files carry the md5 sums of the official release."""
    folder = Path(root) / CIFAR100_FOLDER
    return all(_md5(folder / name) == md5 for name, md5 in CIFAR100_MD5.items())


# What the official files (and ``write_cifar100_format``'s) need to rebuild their numpy arrays;
# a pickle naming anything else is not a CIFAR-100 file, and is never run.
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


class _ForbiddenObject(Exception):
    pass


class _CifarUnpickler(pickle.Unpickler):
    """Admits dicts, lists, str, bytes, numbers and the numpy array reconstruction only."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_GLOBALS:
            raise _ForbiddenObject(f"{module}.{name}")
        return super().find_class(module, name)


def _load_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            entry = _CifarUnpickler(fh, encoding="latin1").load()
    except _ForbiddenObject as exc:
        raise ConfigError(
            f"not a CIFAR-100 file (forbidden object {exc}): {path}; point --data-dir at the "
            "official files, or use --data synthetic"
        ) from None
    except Exception as exc:
        raise ConfigError(
            f"corrupt CIFAR-100 file {path} ({type(exc).__name__}); delete {path.parent} "
            f"to download it again, or use --data synthetic"
        ) from None
    if not isinstance(entry, dict):
        raise ConfigError(f"corrupt CIFAR-100 file {path} (not a dict); delete {path.parent}")
    return entry


def load_cifar100_split(root: Path, split: str) -> ImageSet:
    """Read ``root/cifar-100-python/{train,test}`` and check its shape and labels."""
    path = Path(root) / CIFAR100_FOLDER / split
    if not path.is_file():
        raise ConfigError(f"CIFAR-100 file {path} is missing; fix --data-dir or delete the folder")
    entry = _load_pickle(path)
    def field(key: str, convert):
        try:
            return convert(entry[key])
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            why = "missing" if isinstance(exc, KeyError) else f"bad: {exc}"
            raise ConfigError(f"corrupt CIFAR-100 file {path} ({key} {why}); delete "
                              f"{path.parent}") from None

    def pixels(value) -> np.ndarray:
        raw = np.asarray(value)
        if raw.dtype != np.uint8 and (raw.dtype.kind not in "iu" or raw.size == 0
                                      or raw.min() < 0 or raw.max() > 255):
            raise ValueError("pixels are not integers in 0..255")
        return raw.astype(np.uint8)

    data = field("data", pixels)
    labels = field("fine_labels", lambda v: np.asarray(v, dtype=np.int64))
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels) or len(labels) == 0:
        raise ConfigError(
            f"corrupt CIFAR-100 file {path} (data shape {data.shape}, {len(labels)} labels); "
            f"delete {path.parent}"
        )
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise ConfigError(f"corrupt CIFAR-100 file {path} (labels outside 0..99)")
    # Each row is 1024 red, then 1024 green, then 1024 blue values.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return ImageSet(np.ascontiguousarray(images), labels)


def check_cifar100_meta(root: Path) -> None:
    entry = _load_pickle(Path(root) / CIFAR100_FOLDER / "meta")
    names = entry.get("fine_label_names")
    if (not isinstance(names, list) or len(names) != NUM_CLASSES
            or not all(isinstance(n, str) for n in names)):
        raise ConfigError(
            f"corrupt CIFAR-100 meta in {root} (expected a list of 100 fine_label_names); "
            "delete it"
        )


PREPARE_WAIT_S = 1800.0  # how long a process waits for another one preparing the data


@contextlib.contextmanager
def preparing_alone(root: Path, wait_s: float = PREPARE_WAIT_S):
    """One process at a time prepares the data of ``root``: Slurm's tasks are each their own
    `bench run`, and several of them downloading into one shared folder overwrote each
    other's archive (and a failed checksum deleted the archive another was unpacking). An
    exclusive lock on a file beside ``root`` (its parent must exist), waited for at most
    ``wait_s`` seconds."""
    import fcntl
    import time

    root = Path(root).absolute()
    if not root.parent.is_dir():  # nothing to share yet: the download makes the folders
        yield
        return
    lock_path = root.parent / f".{root.name}.bench-prepare.lock"
    try:
        handle = open(lock_path, "a+")  # noqa: SIM115 (held across the yield)
    except OSError:  # a read-only parent: no lock to take, nothing can be downloaded there
        yield
        return
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"another process has been preparing the data in {root} for more "
                        f"than {wait_s:.0f} s ({lock_path} is locked); wait for it or "
                        "point --data-dir elsewhere") from None
                time.sleep(0.5)
        yield
    finally:
        handle.close()  # releases the lock


def prepare_cifar100(root: Path, download: bool = True) -> tuple[str, int, int]:
    """Make sure the dataset is on disk and readable. Returns the kind, ``cifar100``
    (official md5s) or ``fixture`` (the right format, other content), and the train and test
    sizes. Raises ConfigError."""
    root = Path(root)
    looked_up(root.expanduser(), "--data-dir", root)
    if not cifar100_present(root):
        if not download:
            folder = root / CIFAR100_FOLDER
            missing = [n for n in CIFAR100_MD5 if not (folder / n).is_file()]
            what = (f"CIFAR-100 is not in {root}" if len(missing) == len(CIFAR100_MD5) else
                    f"CIFAR-100 in {root} lacks {', '.join(str(folder / n) for n in missing)}")
            raise ConfigError(f"{what}; drop --no-download or fix --data-dir")
        with preparing_alone(root):
            if not cifar100_present(root):  # another process may have made it meanwhile
                download_cifar100(root)
    check_cifar100_meta(root)
    train = len(load_cifar100_split(root, "train"))
    test = len(load_cifar100_split(root, "test"))
    return ("cifar100" if is_official_cifar100(root) else "fixture"), train, test


def write_cifar100_format(root: Path, train: ImageSet, test: ImageSet) -> Path:
    """Write ``root/cifar-100-python/{train,test,meta}`` exactly as the official files are laid
    out (Python pickles with str keys). Used to drive the real loader on small sets."""
    folder = Path(root) / CIFAR100_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for split, images in (("train", train), ("test", test)):
        rows = images.images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
        entry = {
            "filenames": [f"img_{i:05d}.png" for i in range(len(images))],
            "batch_label": f"{split} batch 1 of 1",
            "fine_labels": [int(v) for v in images.labels],
            "coarse_labels": [int(v) // 5 for v in images.labels],
            "data": np.ascontiguousarray(rows, dtype=np.uint8),
        }
        with open(folder / split, "wb") as fh:
            pickle.dump(entry, fh, protocol=2)
    meta = {
        "fine_label_names": [f"class_{i:02d}" for i in range(NUM_CLASSES)],
        "coarse_label_names": [f"superclass_{i:02d}" for i in range(NUM_CLASSES // 5)],
    }
    with open(folder / "meta", "wb") as fh:
        pickle.dump(meta, fh, protocol=2)
    return folder


# --------------------------------------------------------------------------- synthetic data


def _images_per_chunk(image_size: int) -> int:
    """Images worked on at once when drawing or resizing a set: ~4 M values, so a large set
    at a large size never holds more than that in float."""
    return max(1, 2**22 // (image_size * image_size * 3))


def synthetic_split(split: str, size: int, seed: int, difficulty: float = 0.0,
                    image_size: int = 32, classes: int = NUM_CLASSES) -> ImageSet:
    """Deterministic, learnable CIFAR-like data: each class has a fixed low-frequency
    colour pattern (4 x 4 blocks, enlarged to the image size); images are that pattern plus
    noise. The first k images do not depend on ``size``, so limits take a prefix of the same
    stream; at 32 px and 100 classes it is the set bench has always drawn.

    ``difficulty`` (0..1) keeps accuracy from saturating, so that strategies can differ in
    it: each class has 1 + 3·d patterns instead of one (an image shows one of them, so a
    class is no single template), the pattern fades (amplitude 50 -> 20) into stronger noise
    (30 -> 60) and is shifted by up to 4·d pixels per 32 per image, and a fraction 0.3·d of
    the labels (train and test) is replaced by a random class, which caps top-1 near
    1 - 0.3·d·(1 - 1/classes) (70 % at d = 1)."""
    protos = np.random.default_rng([seed, 0]).normal(size=(classes, 4, 4, 3))
    stream = 1 if split == "train" else 2
    labels = np.random.default_rng([seed, stream, 0]).integers(0, classes, size=size)
    blocks = protos[labels]  # 4 x 4 x 3 per image: the class signature, blocky once enlarged
    modes = 1 + round(3 * difficulty)
    if modes > 1:  # pattern k of a class; the first is the easy set's
        extra = np.random.default_rng([seed, 0, 1]).normal(size=(classes, modes - 1, 4, 4, 3))
        mode = np.random.default_rng([seed, stream, 5]).integers(0, modes, size=size)
        alt = extra[labels, np.maximum(mode - 1, 0)]
        blocks = np.where((mode > 0)[:, None, None, None], alt, blocks)
    shifts = np.zeros((size, 2), dtype=np.int64)
    if difficulty > 0:
        reach = round(4 * difficulty * image_size / 32)
        shifts = np.random.default_rng([seed, stream, 2]).integers(-reach, reach + 1,
                                                                   size=(size, 2))
        flip = np.random.default_rng([seed, stream, 3]).random(size) < 0.3 * difficulty
        other = np.random.default_rng([seed, stream, 4]).integers(0, classes, size=size)
        labels = np.where(flip, other, labels)
    # The noise is drawn in chunks of images from one stream (the same values as one draw),
    # so that a large set at a large size never holds more than a chunk in float64.
    noise_stream = np.random.default_rng([seed, stream, 1])
    images = np.empty((size, image_size, image_size, 3), dtype=np.uint8)
    chunk = _images_per_chunk(image_size)
    pixel = np.arange(image_size)
    for start in range(0, size, chunk):
        part = slice(start, min(size, start + chunk))
        # enlarged from the 4 x 4 blocks and rolled by the shift, in one gather
        rows = (pixel[None, :] - shifts[part, :1]) % image_size * 4 // image_size
        cols = (pixel[None, :] - shifts[part, 1:]) % image_size * 4 // image_size
        index = np.arange(part.stop - part.start)[:, None, None]
        signal = blocks[part][index, rows[:, :, None], cols[:, None, :]]
        signal *= 50.0 * (1 - 0.6 * difficulty)
        noise = noise_stream.normal(size=(part.stop - part.start, image_size, image_size, 3))
        noise *= 30.0 * (1 + difficulty)
        noise += signal
        noise += 128.0
        images[part] = np.clip(noise, 0, 255).astype(np.uint8)
    return ImageSet(images, labels.astype(np.int64))


def resized(images: ImageSet, size: int) -> ImageSet:
    """The set at ``size`` x ``size`` (bilinear, antialiased when shrinking): CIFAR-100 for a
    model that wants larger images. Unchanged at its own size."""
    if images.images.shape[1] == size:
        return images
    out = np.empty((len(images), size, size, 3), dtype=np.uint8)
    chunk = _images_per_chunk(size)
    for start in range(0, len(images), chunk):
        part = torch.from_numpy(images.images[start : start + chunk]).permute(0, 3, 1, 2)
        scaled = torch.nn.functional.interpolate(part.float(), size=(size, size),
                                                 mode="bilinear", antialias=True,
                                                 align_corners=False)
        out[start : start + chunk] = scaled.round().clamp(0, 255).to(torch.uint8).permute(
            0, 2, 3, 1).numpy()
    return ImageSet(out, images.labels)


# --------------------------------------------------------------------------- torch datasets


def crop_padding(image_size: int) -> int:
    """The random crop's zero padding: 4 pixels at CIFAR's 32, the same share elsewhere."""
    return max(1, image_size // 8)


class CifarTensorDataset(Dataset):
    """Serves normalised float images; with ``augment`` a random S x S crop of the image
    zero-padded by S/8 (4 at 32 px) and a horizontal flip with probability 1/2 (torchvision's
    RandomCrop(32, padding=4) + RandomHorizontalFlip semantics). Randomness comes from
    torch's RNG, seeded per rank and per loader worker."""

    def __init__(self, images: ImageSet, augment: bool) -> None:
        chw = torch.from_numpy(images.images).permute(0, 3, 1, 2).contiguous()
        self.augment = augment
        self.size = chw.shape[-1]
        self.pad = crop_padding(self.size)
        pad = (self.pad,) * 4
        self.pixels = torch.nn.functional.pad(chw, pad) if augment else chw
        self.labels = torch.from_numpy(images.labels)
        self.mean = torch.tensor(CIFAR100_MEAN).view(3, 1, 1) * 255
        self.inv_std = 1.0 / (torch.tensor(CIFAR100_STD).view(3, 1, 1) * 255)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.pixels[index]
        if self.augment:
            top, left = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
            img = img[:, top : top + self.size, left : left + self.size]
            if torch.rand(()) < 0.5:
                img = img.flip(-1)
        return (img.float() - self.mean) * self.inv_std, self.labels[index]
