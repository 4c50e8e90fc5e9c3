"""When each gradient became ready in backward, as a record keeps it: measured by
bench.measure.grad_timeline, read by the scaling model (bench.project.scaling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GradientTimeline:
    """When each gradient became ready during backward, measured in a run's compute-only
    steps (bench.measure.grad_timeline): the big late layers of a CNN are ready early, a
    transformer's embedding last, and how much communication backward hides depends on
    exactly that. Times are fractions of the step (from its start: forward, the earlier
    micro-steps of gradient accumulation, the last micro-step's backward, the optimizer),
    scaled to the run's compute-only step. ``backward_start``: when the last micro-step's
    backward starts; ``ready``: (elements, time) of each parameter (or run of parameters,
    for models with very many) in the order backward readies them."""

    steps: int
    backward_start: float
    ready: tuple[tuple[int, float], ...]

    @property
    def backward_end(self) -> float:
        return self.ready[-1][1]

    @property
    def elements(self) -> int:
        return sum(n for n, _ in self.ready)

    def buckets(self, cap_bytes: float, element_bytes: float) -> list[tuple[float, float]]:
        """DDP's buckets as its reducer rebuilds them after the first step: gradients in the
        order they became ready, a bucket closed once it holds ``cap_bytes`` or more;
        (bytes, time its last gradient is ready)."""
        out, size = [], 0.0
        for n, when in self.ready:
            size += n * element_bytes
            if size >= cap_bytes:
                out.append((size, when))
                size = 0.0
        if size:
            out.append((size, self.backward_end))
        return out

    def to_record(self) -> dict[str, Any]:
        return {"steps": self.steps, "backward_start": round(self.backward_start, 5),
                "ready": [[n, round(when, 5)] for n, when in self.ready],
                "measured": "rank 0, median over the compute-only steps; [elements, time as "
                            "a fraction of the step] per parameter, in ready order"}

    @classmethod
    def from_record(cls, data: Any) -> GradientTimeline | None:
        """The record's timeline, or None (older records, 0 steps, malformed)."""
        try:
            ready = tuple((int(n), float(when)) for n, when in data["ready"])
            timeline = cls(int(data["steps"]), float(data["backward_start"]), ready)
        except (TypeError, KeyError, ValueError, OverflowError):  # JSON's Infinity too
            return None
        ordered = all(a[1] <= b[1] for a, b in zip(ready, ready[1:]))
        if (not ready or not ordered or min(n for n, _ in ready) < 1
                or not 0 <= timeline.backward_start <= ready[0][1] <= ready[-1][1] <= 1):
            return None
        return timeline
