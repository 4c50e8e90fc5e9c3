"""Step timing shared by the timed epochs and the steps after them: marks at step boundaries
(CUDA events on GPU, so the timed loop never waits for the device; the clock on CPU) and the
intervals between them."""

from __future__ import annotations

import time
from typing import Any

import torch


def step_mark(cuda: bool) -> Any:
    """A step boundary: a CUDA event (no host sync) on GPU, the clock on CPU."""
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def step_intervals(marks: list[Any], cuda: bool) -> list[float]:
    """Seconds between consecutive marks (on GPU, after the device has been synchronised)."""
    if cuda:
        return [a.elapsed_time(b) / 1000 for a, b in zip(marks, marks[1:])]
    return [b - a for a, b in zip(marks, marks[1:])]
