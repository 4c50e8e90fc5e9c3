"""Step timing shared by the timed epochs and the steps after them: marks at step boundaries
(CUDA events on GPU, so the timed loop never waits for the device; the clock on CPU) and the
intervals between them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
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


class InputWait:
    """The host seconds a loop spent waiting for its next batch (the clock around each
    ``next``, the iterator's start included): how long the input pipeline kept the loop
    waiting. No device sync: on GPU a wait that the device's queue of work covered counts
    too, so a GPU-bound loop waits little (its host blocks on the device, not here) and an
    input-bound one most of the time."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def batches(self, loader: Iterable) -> Iterator:
        start = time.perf_counter()
        items = iter(loader)
        while True:
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                now = time.perf_counter()
                self.seconds += now - start
            yield item
            start = time.perf_counter()
