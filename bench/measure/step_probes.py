"""Steps after the timed epochs, the final evaluation and the replica check (so that no
recorded figure changes).

The input pipeline's ceiling: K batches drawn from the run's own training loader and moved
onto the device with no model, i.e. the most img/s the pipeline can feed. Exposed
communication: K more training steps with gradient synchronisation switched off, timed like
the epoch steps. The median of each step's slowest rank is the step's compute (plus whatever
communication cannot be switched off, e.g. SyncBatchNorm's statistics); what the overlap with
backward did not hide is ``1 - compute_step_s / step_time_p50_s``. ``--profile-steps``:
ordinary steps under torch.profiler, for a trace."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from bench.data.loaders import draw_seconds, endless, unchanged_randomness
from bench.measure.across_ranks import sync_devices
from bench.measure.grad_timeline import GradientTimeline, TimelineProbe
from bench.measure.timing import step_intervals, step_mark
from bench.tools.faults import slow_probe_steps_from_env, slow_probe_steps_note

PROBE_WARMUP = 2  # first steps after switching synchronisation off, not counted
ALONE_WARMUP = 3  # the rank-alone copy's first synced steps: PowerSGD compresses from its 3rd
ONE_RANK_TIMELINE_STEPS = 5  # one process: steps run only for the gradient timeline
# (step, last micro-step) -> the context of that micro-step's forward and backward
StepContext = Callable[[int, bool], contextlib.AbstractContextManager]


def probe_steps_planned(steps: int, world_size: int, comm_hook: str, compiled: bool) -> int:
    """The steps ``compute_only_steps`` and ``hook_work`` take for a probe of ``steps``, their
    warm-ups included: what a run's expected length adds after its epochs. (A strategy
    that cannot switch its synchronisation off takes none: the count is then high.)"""
    if not steps:
        return 0
    if world_size < 2:
        return PROBE_WARMUP + min(steps, ONE_RANK_TIMELINE_STEPS)
    hooked = comm_hook != "none" and not compiled
    return PROBE_WARMUP + steps + (2 * (ALONE_WARMUP + steps) if hooked else 0)


@dataclass(frozen=True)
class CommProbe:
    steps: int  # timed steps (after PROBE_WARMUP)
    compute_step_s: float | None  # median of each compute-only step's slowest rank
    note: str | None  # why there is no figure, or what still communicates
    timeline: GradientTimeline | None = None  # rank 0: when each gradient was ready
    hook_work_s: float | None = None  # slowest rank's per-step work of a comm hook


def compute_only_steps(trainer, steps: int) -> CommProbe:
    """Run ``steps`` (+ warm-up) steps of the run's own shape without gradient sync on every
    rank (collective: all ranks take part) and return the median over those steps of the
    slowest rank's time for each, with rank 0's gradient timeline. A synchronised step waits
    for whichever rank is slowest at that step: on a noisy host that is a different rank
    each time, and the slowest rank's own median (2-5 % less on 2 CPU ranks) would count
    that wait as communication. One process has nothing to switch off: a few steps measure
    its timeline only."""
    s, parts = trainer.strategy, trainer.parts
    probe = TimelineProbe(parts.model, s.device.type == "cuda") if s.rank == 0 else None
    try:
        if s.world_size < 2:
            extra_steps(trainer, min(steps, ONE_RANK_TIMELINE_STEPS), "gradient timeline",
                        timeline=probe)
            return CommProbe(0, None, "one process: no gradient communication to switch off",
                             probe and probe.result)
        sync_off = s.gradient_sync_off(parts.model, parts.optimizer)
        if isinstance(sync_off, str):
            return CommProbe(0, None, sync_off)
        delay = slow_probe_steps_from_env()  # a test hook: 0
        with sync_off.context:
            times = extra_steps(trainer, steps, "comm probe", timeline=probe,
                                step_context=_slow_in_turn(delay, s.rank, s.world_size)
                                if delay else None)
    finally:
        if probe is not None:
            probe.remove()
    hook = hook_work(trainer, steps)
    slowest = torch.tensor([*times, math.nan if hook is None else hook],
                           dtype=torch.float64, device=s.device)
    s.all_reduce(slowest, "max")
    *lockstep, work = slowest.tolist()
    notes = [sync_off.note] + ([slow_probe_steps_note(delay)] if delay else [])
    return CommProbe(steps, statistics.median(lockstep), "; ".join(filter(None, notes)) or None,
                     probe and probe.result, None if math.isnan(work) else work)


def _slow_in_turn(delay_s: float, rank: int, world_size: int) -> StepContext:
    """Rank ``step mod world_size`` waits ``delay_s`` in each step's last micro-step."""

    @contextlib.contextmanager
    def in_turn(step: int, last_micro: bool):
        if last_micro and step % world_size == rank:
            time.sleep(delay_s)
        yield

    return in_turn


def hook_work(trainer, steps: int) -> float | None:
    """What the strategy computes per step beside its communication (a comm hook's own
    work, which gradient sync off skips): the model wrapped again over this rank alone
    (``Strategy.alone``) takes ``steps`` pairs of steps, one with gradient sync on and one
    with it off, in turn; the median of each pair's difference. The copy's first step
    synchronises: DDP records a static graph (``--static-graph``) in its first iteration,
    and one under no_sync failed torch's internal assert. Paired steps, because a
    host's speed drifts by more than a hook's few ms between two phases (a compute-only
    step measured 112 to 171 ms minutes apart on 2 CPU cores). None where there is no such
    work, or under --compile (the copy is not compiled). Collective."""
    s, parts = trainer.strategy, trainer.parts
    if trainer.cfg.compile:
        return None
    solo = s.alone(parts.model)
    if solo is None or isinstance(s.gradient_sync_off(solo, parts.optimizer), str):
        return None  # (a copy whose sync cannot be switched off has no pairs to take)

    def sync_off_at_odd_steps(step: int, last_micro: bool) -> contextlib.AbstractContextManager:
        if step % 2 == 0 and last_micro:  # as in training: only the last micro-step syncs
            return contextlib.nullcontext()
        return s.gradient_sync_off(solo, parts.optimizer).context  # a fresh one each time

    trainer.parts = replace(parts, model=solo, forward=solo)
    try:
        times = extra_steps(trainer, 2 * steps, "comm hook alone", warmup=2 * ALONE_WARMUP,
                            step_context=sync_off_at_odd_steps)
    finally:
        trainer.parts = parts
    return max(0.0, statistics.median(on - off for on, off in zip(times[::2], times[1::2])))


def loader_alone(trainer, steps: int) -> float:
    """The img/s the run's input pipeline feeds at most: ``steps`` micro-batches drawn from
    its own training loader (same workers, transforms and pinning; ``--loader gpu``: the
    device-side crop and flip) and moved onto the device as the loop moves them, with no
    model, after a warm-up that lets every worker deliver. Collective: every rank draws at
    once (ranks on one machine share its cores, as they do in training); the result is
    the rate of all ranks at the slowest rank's pace."""
    s, parts = trainer.strategy, trainer.parts
    trainer.beat("loader probe (waiting for the other ranks)")
    s.barrier()
    with unchanged_randomness(trainer.loaders.train):
        seconds = draw_seconds(endless(trainer.loaders.train), workers=trainer.workers,
                               steps=steps,
                               move=lambda images, labels: parts.to_device(images, labels,
                                                                           s.device),
                               sync=lambda: sync_devices(s), beat=trainer.beat)
    slowest = torch.tensor([seconds], dtype=torch.float64, device=s.device)
    s.all_reduce(slowest, "max")
    return steps * trainer.split.micro * s.world_size / slowest.item()


def profile_steps(trainer, steps: int, trace: Path) -> None:
    """``--profile-steps K``: K ordinary steps (gradient sync on) under torch.profiler after
    the timed epochs; this rank's trace goes to ``trace`` (Chrome trace format: Perfetto,
    TensorBoard). Collective: every rank takes the steps."""
    if trainer.strategy.device.type != "cuda":
        # A CUDA build of torch on a machine without a driver: Kineto would print
        # "gpuGetDeviceCount failed" although no GPU activity is asked for (its level 4,
        # ERROR), and from torch 2.14 "USDT: ... profiler_start" and "profiler_stop" on
        # every rank (its top level, 5). Nothing it says concerns a trace of CPU activity.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if trainer.strategy.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=False) as prof:
        extra_steps(trainer, steps, "profile", warmup=0)
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))


def extra_steps(trainer, steps: int, what: str, warmup: int = PROBE_WARMUP,
                timeline: TimelineProbe | None = None,
                step_context: StepContext | None = None) -> list[float]:
    """``warmup`` + ``steps`` training steps of the run's shape (same micro-batches, precision
    and optimizer) after the epochs, timed between step boundaries like the epoch steps;
    returns this rank's step times (warm-up excluded). ``timeline`` marks the measured
    steps' backward and gradients; its ``result`` is set from their boundaries.
    ``step_context(step, last_micro)`` wraps each micro-step's forward and backward."""
    s, parts, cfg = trainer.strategy, trainer.parts, trainer.cfg
    cuda = s.device.type == "cuda"
    parts.model.train()
    trainer.beat(f"{what} (waiting for the other ranks)")
    s.barrier()
    marks = []
    with unchanged_randomness(trainer.loaders.train):
        batches = endless(trainer.loaders.train)
        for step in range(warmup + steps):
            trainer.beat(f"{what} step {step + 1}")
            if step == warmup:
                marks.append(step_mark(cuda))
            parts.model.zero_grad(set_to_none=True)  # not the optimizer's (Horovod checks)
            for micro in range(cfg.grad_accum):
                last = micro == cfg.grad_accum - 1
                images, labels = next(batches)[:2]
                with step_context(step, last) if step_context else contextlib.nullcontext():
                    loss = parts.training_loss(trainer.criterion, images, labels, s.device)
                    if timeline is not None and step >= warmup and last:
                        timeline.last_backward_starts()
                    s.backward(loss / cfg.grad_accum, parts.optimizer, parts.precision)
            if timeline is not None:
                timeline.step_done()
            s.step(parts.optimizer, parts.precision)
            if step >= warmup:
                marks.append(step_mark(cuda))  # step boundaries, as in the timed epochs
    if cuda:
        torch.cuda.synchronize()
    if timeline is not None:
        timeline.result = timeline.timeline(marks)
    return step_intervals(marks, cuda)
