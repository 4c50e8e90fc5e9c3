"""Memory per rank, by parts: what this rank's model, gradients and optimizer hold, counted
from the tensors the strategy really keeps (a DDP replica whole; ZeRO-1's optimizer state
and FSDP's shards as this rank's share; apex O2's fp32 master weights as the optimizer's),
beside the peak and the baseline the interpreter and torch took before the model existed.
What the peak holds beyond the three parts is activations and workspace."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

_baseline: dict[str, int] = {}


def _rss_bytes() -> int:
    """This process's resident set now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def mark_baseline(device: torch.device | None = None) -> None:
    """Before the model exists: the resident set (CPU) or the allocated bytes (CUDA) that
    are not the run's, subtracted from its peak."""
    _baseline["cpu"] = _rss_bytes()
    if device is not None and device.type == "cuda":
        _baseline["cuda"] = torch.cuda.memory_allocated(device)


def cap_gpu_memory(device: torch.device) -> None:
    """``bench fit --gpu-memory GiB`` (BENCH_GPU_MEMORY_GIB): this rank may allocate that
    much of its GPU, no more ("would it fit on a 24 GB card")."""
    gib = os.environ.get("BENCH_GPU_MEMORY_GIB")
    if not gib or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, float(gib) * 2**30 / total), device)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP2), else the tensor."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _bytes(tensors) -> int:
    """Bytes of the distinct storages among ``tensors`` (a view counted once)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        t = _local(t)
        try:
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr())
            size = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            key, size = (str(t.device), id(t)), t.numel() * t.element_size()
        if key in seen or size == 0:
            continue
        seen.add(key)
        total += size
    return total


def _state_tensors(optimizer: Any):
    """Every tensor the optimizer keeps: its state (momentum, ...), the local optimizer's
    under ZeroRedundancyOptimizer (this rank's shard), and parameters of its own that the
    model does not hold (apex O2's fp32 master weights)."""
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
    for opt in (optimizer, inner) if inner is not None else (optimizer,):
        for state in getattr(opt, "state", {}).values():
            if isinstance(state, dict):
                yield from (v for v in state.values() if isinstance(v, torch.Tensor)
                            and v.dim() > 0)


def held(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (see module)."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    ids = {id(_local(p)) for p in params} | {id(p) for p in params}
    masters = [p for group in getattr(optimizer, "param_groups", [])
               for p in group.get("params", []) if id(p) not in ids]
    state = list(_state_tensors(optimizer)) + masters
    return {"parameters": _bytes(params), "gradients": _bytes(grads),
            "optimizer_state": _bytes(state)}


def memory_parts(parts: dict[str, int], device: torch.device) -> dict[str, Any]:
    """The record's ``memory_parts``: the held parts, this rank's peak less its baseline
    (CUDA: peak allocated, and peak reserved beside it; CPU: peak resident set), and the
    rest of that peak as activations and workspace (never below zero)."""
    import resource

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - _baseline.get("cuda", 0)
        reserved = torch.cuda.max_memory_reserved(device)
        how = "CUDA peak allocated (since the model existed), parts counted from tensors"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _baseline.get(
            "cpu", 0)
        reserved = None
        how = ("CPU peak resident set less the interpreter-and-torch baseline measured "
               "before the model existed; parts counted from tensors")
    held_total = sum(parts.values())
    return {**parts, "peak": max(peak, 0), "reserved": reserved,
            "baseline": _baseline.get("cuda" if device.type == "cuda" else "cpu"),
            "activations_and_workspace": max(0, peak - held_total), "how": how}
