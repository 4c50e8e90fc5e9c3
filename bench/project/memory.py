"""Memory per rank at scale, from a run's memory_parts: a replicated strategy keeps its
parameters, gradients and optimizer state whole at any N; ZeRO-1 divides the optimizer
state by N, FSDP all three; activations and workspace stay at the measured per-rank figure
(the per-rank batch is held, as the step-time projection holds it)."""

from __future__ import annotations

from typing import Any

# What each strategy shards over its ranks (the others replicate all three).
SHARDED = {"ddp-zero": ("optimizer_state",),
           "fsdp": ("parameters", "gradients", "optimizer_state")}
PARTS = ("parameters", "gradients", "optimizer_state")


def memory_at(rec: dict[str, Any], gpus: int) -> float | None:
    """Bytes one rank holds at ``gpus`` ranks; None for a record without memory_parts."""
    parts = rec.get("memory_parts")
    if not isinstance(parts, dict) or not all(
            isinstance(parts.get(k), (int, float)) for k in (*PARTS, "activations_and_workspace")):
        return None
    measured = rec.get("world_size") or 1
    sharded = SHARDED.get(str(rec.get("strategy")), ())
    held = sum(parts[k] * (measured / gpus if k in sharded else 1.0) for k in PARTS)
    return held + parts["activations_and_workspace"]


def fits_from(rec: dict[str, Any], gpus: list[int], budget: float) -> str | None:
    """Where a run's ranks fit in ``budget`` bytes over the GPU counts asked: 'at every N',
    'from N=K on' (sharding), or 'at no N up to M'; None without memory_parts."""
    found = [(n, memory_at(rec, n)) for n in sorted(gpus)]
    if any(m is None for _, m in found):
        return None
    fitting = [n for n, m in found if m <= budget]
    if len(fitting) == len(found):
        return "fits at every N"
    if not fitting:
        return f"fits at no N up to {found[-1][0]:,}"
    return f"fits from N={min(fitting):,} on"
