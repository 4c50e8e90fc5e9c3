"""Measures when each gradient becomes ready during backward, in the compute-only steps after
the epochs (rank 0), as a ``bench.records.gradient_timeline.GradientTimeline`` for the record."""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch import nn

from bench.measure.timing import step_mark
from bench.records.gradient_timeline import GradientTimeline

MAX_POINTS = 1024  # a record keeps at most this many (elements, time) points


class TimelineProbe:
    """Marks, for each measured step, when the last micro-step's backward starts and when
    each parameter's gradient has been accumulated (post-accumulate-grad hooks: CUDA events
    on GPU, so nothing waits for the device)."""

    def __init__(self, model: nn.Module, cuda: bool) -> None:
        self.cuda = cuda
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sizes = [p.numel() for p in self.params]
        self.backward_marks: list[Any] = []
        self.ready_marks: list[dict[int, Any]] = []
        self.armed = False
        self.result: GradientTimeline | None = None  # set by extra_steps when they end
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(i))
                        for i, p in enumerate(self.params)]

    def _hook(self, index: int):
        def ready(_param: torch.Tensor) -> None:
            if self.armed:
                self.ready_marks[-1].setdefault(index, step_mark(self.cuda))
        return ready

    def last_backward_starts(self) -> None:
        """Called before the last micro-step's backward of a measured step."""
        self.backward_marks.append(step_mark(self.cuda))
        self.ready_marks.append({})
        self.armed = True

    def step_done(self) -> None:
        self.armed = False

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def timeline(self, step_marks: list[Any]) -> GradientTimeline | None:
        """The median timeline over the measured steps; ``step_marks`` are their boundaries
        (one more than the steps). None when some gradient never fired its hook (a strategy
        that accumulates gradients elsewhere, e.g. sharded)."""
        steps = len(self.backward_marks)
        if steps == 0 or len(step_marks) != steps + 1 or any(
                len(marks) != len(self.params) for marks in self.ready_marks):
            return None
        if self.cuda:
            torch.cuda.synchronize()
        backward, ready = [], [[] for _ in self.params]
        for k in range(steps):
            start, end = step_marks[k], step_marks[k + 1]
            length = _seconds(start, end, self.cuda)
            if length <= 0:
                return None
            backward.append(_seconds(start, self.backward_marks[k], self.cuda) / length)
            for i, mark in self.ready_marks[k].items():
                ready[i].append(_seconds(start, mark, self.cuda) / length)
        when = [statistics.median(times) for times in ready]
        order = sorted(range(len(self.params)), key=lambda i: when[i])
        points = [(self.sizes[i], when[i]) for i in order]
        start = min(statistics.median(backward), points[0][1])
        return GradientTimeline(steps, start, merge(points))


def merge(points: list[tuple[int, float]], limit: int = MAX_POINTS
          ) -> tuple[tuple[int, float], ...]:
    """At most ``limit`` (elements, time) points: runs of consecutive parameters merged,
    each at its last one's time (a bucket is never taken as ready before its last
    gradient)."""
    if len(points) <= limit:
        return tuple(points)
    cuts = sorted({round(len(points) * (k + 1) / limit) for k in range(limit)})
    merged, begin = [], 0
    for end in cuts:
        merged.append((sum(n for n, _ in points[begin:end]), points[end - 1][1]))
        begin = end
    return tuple(merged)


def _seconds(start: Any, end: Any, cuda: bool) -> float:
    return start.elapsed_time(end) / 1000 if cuda else end - start
