"""`bench project`'s model against published scaling results: each point is predicted from
the publication's own 1-GPU step time, the model's parameter count and the published
hardware's link rates (no measured gradient timeline: gradients ready evenly over
backward), and compared with the published multi-GPU step time.

    python benchmarks/published_scaling.py

Sources:
- PyTorch's DDP benchmark (pytorch/pytorch benchmarks/distributed/ddp/README.md): 8 DGX-1
  machines, V100 SXM2 with NVLink 2, 4 x 100 Gb/s InfiniBand per machine, batch 32 per GPU,
  torch 1.4, default 25 MB buckets; p50 seconds per iteration with DDP on 1 GPU (the
  wrapper's own cost included, as in a bench record's compute-only step), on 8 GPUs (one
  machine) and on 16 GPUs (two).
- NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 (README, "Training performance: NVIDIA
  DGX A100 (8x A100 80GB)"): batch 256 per GPU, img/s on 1 and 8 GPUs, TF32 and AMP.

The Horovod paper's 512-GPU figures (Sergeev & Del Balso, 2018) are not reproduced: the
paper gives efficiencies but not the single-GPU step times the model starts from."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.project.scaling import NETWORKS, Network, Workload, project  # noqa: E402

# V100 SXM2: NVLink 2, 300 GB/s bidirectional per GPU (V100 datasheet); DGX-1: 4 x 100 Gb/s
# EDR InfiniBand per machine (as the DDP benchmark's README says). x 0.8 as for the presets.
DGX1_V100 = Network("v100-nvlink-4xedr", 150 * 0.8, 4 * 12.5 * 0.8, "nvlink",
                    "DGX-1 V100: NVLink 2 (V100 datasheet); 4 x 100 Gb/s InfiniBand per machine")
DGX_A100 = NETWORKS["a100-nvlink-hdr"]
BUCKET_25MB = 25 * 2**20

# torchvision's parameter counts
PARAMETERS = {"resnet50": 25_557_032, "resnet101": 44_549_160,
              "resnext50_32x4d": 25_028_904, "resnext101_32x8d": 88_791_336}


@dataclass(frozen=True)
class Published:
    source: str
    model: str
    precision: str
    network: Network
    gpus_per_node: int
    one_gpu_step_s: float  # published, on one GPU
    gpus: int
    step_s: float  # published, at ``gpus``

    def predicted_step_s(self) -> float:
        work = Workload("ddp", self.one_gpu_step_s, 4 * PARAMETERS[self.model], BUCKET_25MB)
        return project(work, self.gpus, self.gpus_per_node, self.network).step_s

    @property
    def error_pct(self) -> float:
        return 100 * (self.predicted_step_s() - self.step_s) / self.step_s


_DDP_BENCH = "PyTorch DDP benchmark, V100"
_DLE = "NVIDIA DLE ResNet-50, A100 80GB"


def _ddp_bench(model: str, one: float, eight: float, sixteen: float) -> list[Published]:
    return [Published(_DDP_BENCH, model, "fp32", DGX1_V100, 8, one, n, step)
            for n, step in ((8, eight), (16, sixteen))]


def _dle(precision: str, one_img_s: float, eight_img_s: float) -> Published:
    return Published(_DLE, "resnet50", precision, DGX_A100, 8, 256 / one_img_s, 8,
                     256 * 8 / eight_img_s)


POINTS = (
    *_ddp_bench("resnet50", 0.100, 0.104, 0.104),
    *_ddp_bench("resnet101", 0.171, 0.179, 0.179),
    *_ddp_bench("resnext50_32x4d", 0.147, 0.157, 0.157),
    *_ddp_bench("resnext101_32x8d", 0.425, 0.447, 0.450),
    _dle("TF32", 938, 7248),
    _dle("AMP", 2470, 16621),
)


def table() -> str:
    lines = ["| source | model | precision | GPUs | 1-GPU step | published step | predicted "
             "| error |", "|---|---|---|---|---|---|---|---|"]
    for p in POINTS:
        lines.append(f"| {p.source} | {p.model} | {p.precision} | {p.gpus} | "
                     f"{1000 * p.one_gpu_step_s:.1f} ms | {1000 * p.step_s:.1f} ms | "
                     f"{1000 * p.predicted_step_s():.1f} ms | {p.error_pct:+.1f} % |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
