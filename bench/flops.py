"""Model FLOPs utilisation: the training FLOPs of one image, counted once per run with torch's
``FlopCounterMode`` (forward and backward of the run's model at its width, on the meta device:
shapes only, nothing computed), against the device's dense peak for the run's precision."""

from __future__ import annotations

import json
import os
import tempfile

from bench.config import default_data_dir
from bench.models import ModelSpec

# Dense (no sparsity) peak TFLOP/s by precision, from the vendors' datasheets and
# architecture whitepapers (tensor-core rates with FP32 accumulation, as autocast uses):
# A100: NVIDIA A100 datasheet; H100 SXM / PCIe: H100 datasheet; H200: H200 datasheet (SXM,
# the H100 SXM compute); L4, L40S: their datasheets; V100 SXM2 / PCIe: V100 datasheet;
# RTX 2080 Ti: Turing whitepaper (FP16 with FP32 accumulate); RTX 3090: Ampere GA102
# whitepaper; RTX 4090: Ada Lovelace whitepaper. Matched against torch's device name, the
# most specific entry first; a device or precision not listed gives no MFU (None).
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100 NVL", {}),  # not in the table: no MFU rather than a wrong one
    ("H200 NVL", {}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),  # SXM
    ("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("V100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2
    ("2080 Ti", {"fp16": 53.8, "fp32": 13.4}),
    ("3090", {"bf16": 35.6, "fp16": 35.6, "tf32": 35.6, "fp32": 35.6}),
    ("4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
]
# What each precision label of a record computes in.
COMPUTE_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16",
                 "apex-O1": "fp16", "apex-O2": "fp16", "apex-O3": "fp16", "apex-O0": "fp32"}


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

    from bench.models import stable
    from bench.results import torchvision_version

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


def peak_tflops(device_name: str | None, precision: str) -> float | None:
    """The device's dense peak for a run's precision label, or None when not known."""
    if not device_name:
        return None
    dtype = COMPUTE_DTYPE.get(precision)
    for key, peaks in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peaks.get(dtype) if dtype else None
    return None
