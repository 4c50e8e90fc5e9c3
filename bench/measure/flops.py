"""Model FLOPs utilisation: the training FLOPs of one image, counted once per run with torch's
``FlopCounterMode`` (forward and backward of the run's model at its width, on the meta device:
shapes only, nothing computed), against the device's dense peak for the run's precision."""

from __future__ import annotations

import json
import os
import tempfile

from bench.config.run_config import default_data_dir
from bench.models.registry import ModelSpec


def train_flops_per_image(spec: ModelSpec | None = None) -> int:
    """Forward + backward FLOPs of one image of the spec's size through its model (the
    full-width ResNet-18 CIFAR at 32 px by default; multiply-add = 2 FLOPs; the optimizer
    step is not counted)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    spec = spec or ModelSpec()
    batch = 2  # training-mode BatchNorm wants more than one value per channel
    # Built on CPU then moved: building under torch.device("meta") takes seconds.
    with torch.random.fork_rng(devices=[]):
        model = spec.build().to("meta").train()
    images = torch.empty(batch, 3, spec.image_size, spec.image_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(images).sum().backward()
    return counter.get_total_flops() // batch


def cached_train_flops_per_image(spec: ModelSpec) -> int:
    """``train_flops_per_image``, kept per model (width, classes, image size) and torch (and
    torchvision) version beside the dataset cache: the count itself is instant, but
    FlopCounterMode's first use costs ~2 s of imports, which every run would otherwise pay.
    A user's own model is counted every time (its code may have changed)."""
    import torch

    from bench.models.registry import stable
    from bench.records.environment import torchvision_version

    if not stable(spec.name):
        return train_flops_per_image(spec)
    path = default_data_dir().parent / "flops.json"
    key = f"{spec.key()} torch={torch.__version__} torchvision={torchvision_version()}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict) or not isinstance(known.get(key), int):
        known = known if isinstance(known, dict) else {}
        known[key] = train_flops_per_image(spec)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump(known, out, indent=1)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: count again next time
    return known[key]


