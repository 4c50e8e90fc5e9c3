"""What one rank learns about all of them, by collectives outside the timed region: the
slowest rank's times and memory, the GPUs' clocks, whether the replicas hold the same
parameters, and global means."""

from __future__ import annotations

import dataclasses
import resource
from typing import Any

import torch
from torch import nn

from bench.measure.gpu_clocks import (
    VECTOR_LENGTH,
    energy_slots,
    from_vector,
    to_vector,
    total_energy,
)
from bench.models.parameters import params_sha1
from bench.records.run_record import EvalStats, TrainStats
from strategies.base import Strategy


def sync_devices(strategy: Strategy) -> None:
    if strategy.device.type == "cuda":
        for device in strategy.process_devices():
            torch.cuda.synchronize(device)


def peak_memory(strategy: Strategy) -> int:
    """The largest GPU's max-allocated bytes; on CPU this process's peak RSS."""
    if strategy.device.type == "cuda":
        return max(torch.cuda.max_memory_allocated(d) for d in strategy.process_devices())
    # ru_maxrss is in KiB on Linux: the peak resident set of this process so far.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter gathered whole; others as they are. Collective."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


@torch.no_grad()
def initial_fingerprint(strategy: Strategy, model: nn.Module) -> tuple[str, bool | None]:
    """SHA-1 of rank 0's parameters as set up (broadcasts included, before any step), and
    whether every rank holds the same (None where parameters are sharded). Collective."""
    sha1 = params_sha1(full_tensor(p) for p in strategy.eval_module(model).parameters())
    mine = torch.tensor([float(int(sha1[:12], 16))], dtype=torch.float64,
                        device=strategy.device)  # 48 bits: exact in float64
    high, low = mine.clone(), -mine
    strategy.all_reduce(high, "max")
    strategy.all_reduce(low, "max")
    same = bool(torch.equal(high, -low)) if strategy.replicates_parameters else None
    return sha1, same


# Elements of a parameter a fingerprint pass holds in float64 at once (32 MiB).
FINGERPRINT_CHUNK = 1 << 22


@torch.no_grad()
def replica_fingerprint(strategy: Strategy, model: nn.Module) -> tuple[bool | None, list[float]]:
    """Whether every rank ends with bit-identical parameters, checked through three float64
    fingerprints whose max and min over ranks must agree (None where parameters are sharded,
    so that gathering them makes them equal by construction). Collective.

    The parameters are read a chunk at a time: a float64 copy of them all, concatenated,
    with weights and products beside it, takes ten times the model's fp32 bytes, and killed
    a run of a 128 M-parameter model after its training had fitted."""
    local = torch.zeros(3, dtype=torch.float64, device=strategy.device)
    with strategy.exact_arithmetic():  # apex O1 would sum float64 in float32
        offset = 0  # the position of the parameter's first element among all of them
        for p in strategy.eval_module(model).parameters():
            flat = full_tensor(p.detach()).reshape(-1)
            for start in range(0, flat.numel(), FINGERPRINT_CHUNK):
                x = flat[start:start + FINGERPRINT_CHUNK].to(local.device, torch.float64)
                first = offset + start + 1
                weights = torch.arange(first, first + x.numel(), dtype=torch.float64,
                                       device=x.device)
                local += torch.stack([x.sum(), (x * x).sum(), (x * weights).sum()])
            offset += flat.numel()
    high, low = local.clone(), -local
    strategy.all_reduce(high, "max")
    strategy.all_reduce(low, "max")
    identical = bool(torch.equal(high, -low)) if strategy.replicates_parameters else None
    return identical, high.tolist()


def global_mean(strategy: Strategy, local_sum: torch.Tensor, local_count: int) -> float:
    """Sum over ranks of ``local_sum`` divided by the summed counts. Collective."""
    pair = torch.stack([local_sum, torch.tensor(float(local_count), device=strategy.device,
                                                dtype=local_sum.dtype)])
    strategy.all_reduce(pair, "sum")
    return (pair[0] / pair[1]).item()


def slowest_rank(strategy: Strategy, train: TrainStats, evaluation: EvalStats,
                 clocks: dict[str, Any] | None = None
                 ) -> tuple[TrainStats, EvalStats, int, dict[str, Any] | None]:
    """Times, input wait and peak memory of the slowest rank (a step is as slow as the
    slowest; the rank that waited longest for its batches) and, on
    CUDA, the GPU clocks of the epoch over all ranks (the lowest, the hottest) and the
    energy all their GPUs took. Collective."""
    cuda = strategy.device.type == "cuda"
    memory = peak_memory(strategy) if (cuda or strategy.is_main) else 0
    gpus = (to_vector(clocks) + energy_slots(clocks, strategy.rank, strategy.world_size)
            if cuda else [])
    times = torch.tensor(
        [train.train_time_s, evaluation.eval_time_s, float(memory),
         train.step_time_p50_s, train.step_time_p90_s, train.input_wait_s, *gpus],
        device=strategy.device, dtype=torch.float64,
    )
    strategy.all_reduce(times, "max")
    train = dataclasses.replace(train, train_time_s=times[0].item(),
                                step_time_p50_s=times[3].item(),
                                step_time_p90_s=times[4].item(), input_wait_s=times[5].item())
    evaluation = dataclasses.replace(evaluation, eval_time_s=times[1].item())
    clocks = from_vector(times[6:6 + VECTOR_LENGTH].tolist()) if cuda else None
    if clocks is not None:
        clocks["energy_j"] = total_energy(times[6 + VECTOR_LENGTH:].tolist())
    return train, evaluation, int(times[2].item()), clocks
