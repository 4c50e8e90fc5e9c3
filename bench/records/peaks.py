"""Dense peak TFLOP/s per device and precision (vendors' datasheets): the denominator of
the record's model FLOPs utilisation."""

from __future__ import annotations

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


def peak_tflops(device_name: str | None, precision: str) -> float | None:
    """The device's dense peak for a run's precision label, or None when not known."""
    if not device_name:
        return None
    dtype = COMPUTE_DTYPE.get(precision)
    for key, peaks in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peaks.get(dtype) if dtype else None
    return None
