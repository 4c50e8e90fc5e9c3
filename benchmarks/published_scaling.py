"""`bench project`'s model against published scaling results, beside the two obvious
guesses it must beat. Each point is predicted from the publication's own 1-GPU step time,
the model's parameter count and the published hardware's link rates (no measured gradient
timeline: gradients ready evenly over backward), and compared with the published multi-GPU
step time. The null models: "no communication" (the 1-GPU step) and "no overlap" (the
1-GPU step plus every gradient byte all-reduced after backward, by the same NCCL model).

    python benchmarks/published_scaling.py

Sources:
- PyTorch's DDP benchmark (pytorch/pytorch benchmarks/distributed/ddp/README.md): 8 DGX-1
  machines, V100 SXM2 with NVLink 2, 4 x 100 Gb/s InfiniBand per machine, batch 32 per GPU,
  torch 1.4, default 25 MB buckets; p50 seconds per iteration with DDP on 1 GPU (the
  wrapper's own cost included, as in a bench record's compute-only step), on 8 GPUs (one
  machine) and on 16 GPUs (two).
- NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 (README, "Training performance: NVIDIA
  DGX A100 (8x A100 80GB)"): batch 256 per GPU, img/s on 1 and 8 GPUs, TF32 and AMP.
- TensorFlow's benchmarks (tensorflow/docs site/en/r1/guide/performance/benchmarks.md,
  "Details for NVIDIA DGX-1 (NVIDIA Tesla P100)", May 2017, synthetic data): the two models
  it ran with `variable_update=replicated` and NCCL all-reduce, VGG16 (batch 64 and 32 per
  GPU) and AlexNet (batch 512), img/s on 1, 2, 4 and 8 P100s of one DGX-1. (The others ran
  with a parameter server on the CPU, which the model does not describe.) TensorFlow
  all-reduces each variable when its gradient is ready; the model buckets them as DDP would.
  These are the points where communication costs: up to 29 % over the 1-GPU step.

The Horovod paper's 512-GPU figures (Sergeev & Del Balso, 2018) are not reproduced: the
paper gives efficiencies but not the single-GPU step times the model starts from."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.project.scaling import (  # noqa: E402
    NETWORKS,
    Network,
    Workload,
    allreduce_s,
    even_buckets,
    project,
)

# V100 SXM2: NVLink 2, 300 GB/s bidirectional per GPU (V100 datasheet); DGX-1: 4 x 100 Gb/s
# EDR InfiniBand per machine (as the DDP benchmark's README says). x 0.8 as for the presets.
DGX1_V100 = Network("v100-nvlink-4xedr", 150 * 0.8, 4 * 12.5 * 0.8, "nvlink",
                    "DGX-1 V100: NVLink 2 (V100 datasheet); 4 x 100 Gb/s InfiniBand per machine")
# P100 SXM2: NVLink 1, four links of 20 GB/s each way, 160 GB/s bidirectional per GPU (P100
# datasheet); one machine only here.
DGX1_P100 = Network("p100-nvlink1", 80 * 0.8, 4 * 12.5 * 0.8, "nvlink",
                    "DGX-1 P100: NVLink 1 (P100 datasheet)")
DGX_A100 = NETWORKS["a100-nvlink-hdr"]
BUCKET_25MB = 25 * 2**20

# torchvision's parameter counts (AlexNet: the same five convolutions and three dense layers
# as tf_cnn_benchmarks' AlexNet)
PARAMETERS = {"resnet50": 25_557_032, "resnet101": 44_549_160,
              "resnext50_32x4d": 25_028_904, "resnext101_32x8d": 88_791_336,
              "vgg16": 138_357_544, "alexnet": 61_100_840}
# "communication costs" where the published step is this much over the 1-GPU one
COSTLY = 0.15


def _error_pct(predicted: float, published: float) -> float:
    return 100 * (predicted - published) / published


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

    def _workload(self) -> Workload:
        return Workload("ddp", self.one_gpu_step_s, 4 * PARAMETERS[self.model], BUCKET_25MB)

    def predicted_step_s(self, network: Network | None = None) -> float:
        net = network or self.network
        return project(self._workload(), self.gpus, self.gpus_per_node, net).step_s

    def no_overlap_step_s(self, network: Network | None = None) -> float:
        """The null model that sends every gradient byte after backward, bucket by bucket."""
        net, work = network or self.network, self._workload()
        nodes = -(-self.gpus // self.gpus_per_node)
        return self.one_gpu_step_s + sum(allreduce_s(size, self.gpus, nodes, net)
                                         for size in even_buckets(work.gradient_bytes,
                                                                  work.bucket_bytes))

    @property
    def communication_share(self) -> float:
        """How much longer the published step is than the 1-GPU one (what there is to see)."""
        return self.step_s / self.one_gpu_step_s - 1

    @property
    def error_pct(self) -> float:
        return _error_pct(self.predicted_step_s(), self.step_s)

    @property
    def no_communication_error_pct(self) -> float:
        return _error_pct(self.one_gpu_step_s, self.step_s)

    @property
    def no_overlap_error_pct(self) -> float:
        return _error_pct(self.no_overlap_step_s(), self.step_s)


_DDP_BENCH = "PyTorch DDP benchmark, V100"
_DLE = "NVIDIA DLE ResNet-50, A100 80GB"
_TF = "TensorFlow benchmarks, P100 (DGX-1)"


def _ddp_bench(model: str, one: float, eight: float, sixteen: float) -> list[Published]:
    return [Published(_DDP_BENCH, model, "fp32", DGX1_V100, 8, one, n, step)
            for n, step in ((8, eight), (16, sixteen))]


def _dle(precision: str, one_img_s: float, eight_img_s: float) -> Published:
    return Published(_DLE, "resnet50", precision, DGX_A100, 8, 256 / one_img_s, 8,
                     256 * 8 / eight_img_s)


def _tf(model: str, batch: int, img_s: tuple[float, float, float, float]) -> list[Published]:
    """img/s on 1, 2, 4 and 8 GPUs at ``batch`` per GPU: steps of batch x N / img/s."""
    one = batch / img_s[0]
    return [Published(_TF, model, f"fp32, batch {batch}", DGX1_P100, 8, one, n,
                      batch * n / rate) for n, rate in zip((2, 4, 8), img_s[1:])]


POINTS = (
    *_ddp_bench("resnet50", 0.100, 0.104, 0.104),
    *_ddp_bench("resnet101", 0.171, 0.179, 0.179),
    *_ddp_bench("resnext50_32x4d", 0.147, 0.157, 0.157),
    *_ddp_bench("resnext101_32x8d", 0.425, 0.447, 0.450),
    _dle("TF32", 938, 7248),
    _dle("AMP", 2470, 16621),
    *_tf("vgg16", 64, (154, 295, 584, 1081)),
    *_tf("vgg16", 32, (144, 281, 549, 820)),
    *_tf("alexnet", 512, (2987, 5658, 10509, 17822)),
)


def costly(points=POINTS) -> list[Published]:
    """The points where communication costs (the published step ≥ 15 % over the 1-GPU one):
    the only ones where a model can be told from "no communication"."""
    return [p for p in points if p.communication_share >= COSTLY]


def fitted_network(point: Published) -> Network:
    """The per-GPU bus bandwidth at which the model reproduces ``point``: what a probe of
    that machine would have told it (found by bisection; the model's step falls as the
    bandwidth grows)."""
    lo, hi = 0.01, point.network.intra_busbw_gbps
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        net = Network(f"fitted to {point.model} N={point.gpus}", mid, mid, point.network.intra_hop,
                      f"the bus bandwidth that reproduces {point.source} {point.model} "
                      f"{point.precision} at {point.gpus} GPUs")
        if point.predicted_step_s(net) > point.step_s:
            lo = mid
        else:
            hi = mid
    return net


def table(points=POINTS, network: Network | None = None) -> str:
    lines = ["| source | model | precision | GPUs | 1-GPU step | published step | over 1 GPU "
             "| predicted | error | no comm. | no overlap |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        predicted = p.predicted_step_s(network)
        lines.append(
            f"| {p.source} | {p.model} | {p.precision} | {p.gpus} | "
            f"{1000 * p.one_gpu_step_s:.1f} ms | {1000 * p.step_s:.1f} ms | "
            f"{100 * p.communication_share:+.0f} % | {1000 * predicted:.1f} ms | "
            f"{_error_pct(predicted, p.step_s):+.1f} % | {p.no_communication_error_pct:+.1f} % | "
            f"{_error_pct(p.no_overlap_step_s(network), p.step_s):+.1f} % |")
    return "\n".join(lines)


def _median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values)


def summary(points=POINTS, network: Network | None = None) -> str:
    """Median |error| of the model and of each null model, over all points and over those
    where communication costs."""
    out = []
    for name, chosen in (("all points", list(points)), ("where communication costs "
                                                        f"(≥ {100 * COSTLY:.0f} %)",
                                                        costly(points))):
        if not chosen:
            continue
        model = [_error_pct(p.predicted_step_s(network), p.step_s) for p in chosen]
        none = [p.no_communication_error_pct for p in chosen]
        serial = [_error_pct(p.no_overlap_step_s(network), p.step_s) for p in chosen]
        out.append(f"{name} ({len(chosen)}): median |error| model {_median_abs(model):.1f} %, "
                   f"no communication {_median_abs(none):.1f} %, no overlap "
                   f"{_median_abs(serial):.1f} %")
    return "\n".join(out)


if __name__ == "__main__":
    print("From the links' rates (vendor figures x 0.8):\n")
    print(table())
    print()
    print(summary())
    anchor = next(p for p in POINTS if p.source == _TF and p.model == "vgg16"
                  and p.precision.endswith("64") and p.gpus == 8)
    fitted = fitted_network(anchor)
    rest = [p for p in POINTS if p.source == _TF and p is not anchor]
    print(f"\nThe TensorFlow points with the bus bandwidth fitted to {anchor.model} "
          f"{anchor.precision} at {anchor.gpus} GPUs ({fitted.intra_busbw_gbps:.1f} GB/s, "
          f"as a probe of that machine would measure it), the other {len(rest)} predicted:\n")
    print(table(rest, fitted))
    print()
    print(summary(rest, fitted))
