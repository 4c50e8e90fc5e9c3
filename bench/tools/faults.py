"""Test hooks that break a run for real: ``BENCH_FAULT`` makes one rank fail (raise or hang)
at a chosen step; ``BENCH_INJECT_DEFECT`` makes training silently wrong in one named way, so
that the checks meant to catch such mistakes can show that they do."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.tools.errors import ConfigError
from bench.tools.restarts import restart_count

if TYPE_CHECKING:  # torch is imported where a fault fires, not with this module
    import torch


@dataclass(frozen=True)
class Fault:
    """``KIND:RANK:STEP``, or several joined by commas, each before global optimizer step
    STEP (counted from 1) of that rank: ``raise`` (it raises), ``hang`` (it stops taking
    part), ``stop`` (it sends itself SIGSTOP, as a suspended or debugged process is),
    ``oom`` (it asks its device for 1,024 times what it holds: the allocator's own
    out-of-memory error, with its figures; CUDA's allocator refuses a request over 1 EB
    before trying, with a message that has none); ``abort`` (it raises, and once it has
    said its error dies of SIGABRT, as a rank whose gloo group aborts it in its teardown);
    ``exit`` (STEP 0: the rank exits with 1 once its run is over, its record finished, as
    a rank that crashes in its teardown). Each fires in the run's first attempt only: ranks
    that torchrun starts again (--max-restarts) run clean, as a restart after a passing
    fault would. Where a folder to keep it in is given (the run's scratch folder), a fault
    that fired is kept there and never fires again: torchrun restarts a machine's ranks for
    another machine's failure without counting an attempt."""

    events: tuple[tuple[str, int, int], ...]
    fired_in: Path | None = None

    @classmethod
    def from_env(cls, fired_in: Path | None = None) -> Fault | None:
        text = os.environ.get("BENCH_FAULT")
        if not text or restart_count():
            return None
        events = []
        for part in text.split(","):
            fields = part.strip().split(":")
            kind = fields[0]
            if (len(fields) != 3 or kind not in ("raise", "hang", "stop", "oom", "abort", "exit")
                    or not all(f.isdigit() for f in fields[1:])):
                raise ConfigError(f"BENCH_FAULT={text!r}: each fault is KIND:RANK:STEP with KIND "
                                  "raise, hang, stop, oom, abort or exit and RANK, STEP whole "
                                  "numbers (a test hook: unset it for a real run)")
            events.append((kind, int(fields[1]), int(fields[2])))
        return cls(tuple(events), fired_in)

    def exits_after_the_run(self, rank: int) -> bool:
        return ("exit", rank, 0) in self.events

    def aborts_after_its_error(self, rank: int) -> bool:
        return any(kind == "abort" and fault_rank == rank for kind, fault_rank, _ in self.events)

    def maybe_fire(self, rank: int, step: int, device: torch.device) -> None:
        for kind, fault_rank, fault_step in self.events:
            if (rank, step) != (fault_rank, fault_step):
                continue
            if self.fired_in is not None:
                fired = self.fired_in / f"fault-fired-{kind}-{rank}-{step}"
                if fired.exists():
                    continue
                fired.touch()
            if kind in ("raise", "abort"):
                raise RuntimeError(f"injected fault (BENCH_FAULT) at step {step}")
            if kind == "oom":
                import torch

                torch.empty(_beyond(device), dtype=torch.uint8, device=device)
            if kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            while kind == "hang":  # never reach the next collective
                time.sleep(60)


def _beyond(device: torch.device) -> int:
    """Bytes no allocator of ``device`` can give: 1,024 times the GPU's memory (140 TiB on an
    H200, under the 1 EB that CUDA's caching allocator refuses unasked), 4 EiB on CPU."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory << 10
    return 1 << 62


DEFECT_ENV = "BENCH_INJECT_DEFECT"
# Silent defects, each one a classic data-parallel mistake; ``bench verify --self-test`` and
# the data-order tests inject them to show that the checks catch them.
DEFECTS = {
    "sum-gradients": "gradients summed over ranks instead of averaged",
    "skip-allreduce": "the gradient all-reduce of one step skipped (DDP)",
    "bn-grouping": "BatchNorm over half of each replica's batch (grouping ignored)",
    "batch-order": "another global batch order with the same seed and weights",
    "lr-world-size": "learning rate scaled by the world size on top of the global batch",
    "no-set-epoch": "the sampler's set_epoch never called (every epoch the same order)",
    "swap-shards": "ranks take each other's shard of the sampler",
}


def defect_from_env() -> str | None:
    """The defect named by ``BENCH_INJECT_DEFECT`` (a test hook, never set by bench itself;
    a run with one says so in its record's notes)."""
    name = os.environ.get(DEFECT_ENV)
    if not name:
        return None
    if name not in DEFECTS:
        raise ConfigError(f"{DEFECT_ENV}={name!r}: one of {', '.join(DEFECTS)} (a test hook: "
                          "unset it for a real run)")
    return name


def inject_defect(name: str, parts, sampler, strategy) -> None:
    """Break one rank's training on purpose, before the first step, by wrapping the pieces
    the loop uses (the loop itself carries no defect code)."""
    world = strategy.world_size
    strategy.notes.append(f"DEFECT INJECTED ({DEFECT_ENV}={name}): {DEFECTS[name]}")
    optimizer_step = parts.optimizer.step
    if name == "sum-gradients":
        def times_world() -> None:
            for group in parts.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(world)
        synchronize = getattr(parts.optimizer, "synchronize", None)
        if synchronize is not None:
            # Horovod writes the averaged gradients in synchronize(), inside step(): scaled
            # before it, they were overwritten (under --hvd-compression fp16 the defect
            # escaped every check)
            def synchronized(*args, **kwargs):
                done = synchronize(*args, **kwargs)
                times_world()
                return done
            parts.optimizer.synchronize = synchronized
        else:
            def step(*args, **kwargs):
                times_world()
                return optimizer_step(*args, **kwargs)
            parts.optimizer.step = step
    elif name == "lr-world-size":
        def step(*args, **kwargs):
            for group in parts.optimizer.param_groups:
                group["lr"] *= world
            return optimizer_step(*args, **kwargs)
        parts.optimizer.step = step
    elif name in ("skip-allreduce", "bn-grouping"):
        parts.forward = _broken_forward(name, parts.forward, parts.model)
    elif name == "batch-order":
        set_epoch = sampler.set_epoch
        sampler.set_epoch = lambda epoch: set_epoch(epoch + 1)
    elif name == "no-set-epoch":
        sampler.set_epoch = lambda epoch: None
    elif name == "swap-shards":
        sampler.rank = world - 1 - sampler.rank


def _broken_forward(name: str, forward, model):
    calls = [0]

    import torch

    def broken(images):
        calls[0] += 1
        if name == "bn-grouping":
            half = len(images) // 2
            return torch.cat([forward(images[:half]), forward(images[half:])])
        # skip-allreduce: DDP reads this flag in forward; off for the second step only.
        model.require_backward_grad_sync = calls[0] != 2
        return forward(images)

    return broken


SLOW_COMM_ENV = "BENCH_SLOW_COMM_MS"


def slow_communication_from_env(strategy) -> None:
    """``BENCH_SLOW_COMM_MS=M`` (a test hook): every DDP gradient bucket waits M ms before
    its all-reduce, as a slow link would, so that the exposed-communication figure can be
    shown to respond to communication cost. Set before the model is wrapped: strategies
    that wrap it in torch's DDP put the wait in front of the run's comm hook (DDP takes one
    hook only) and note it in the record; others ignore it."""
    strategy.bucket_delay_s = float(os.environ.get(SLOW_COMM_ENV) or 0) / 1000


def slow_communication_note(delay_s: float) -> str:
    """The record's note of the injected wait (``bench project`` reads it back)."""
    return (f"SLOW COMMUNICATION INJECTED ({SLOW_COMM_ENV}): {delay_s * 1000:g} ms "
            "before every gradient bucket's all-reduce")


SLOW_LOADER_ENV = "BENCH_SLOW_LOADER_MS"


def slow_loader_from_env(strategy) -> float:
    """``BENCH_SLOW_LOADER_MS=M`` (a test hook): the seconds every training image of the
    ``--loader torch`` pipeline waits before it is served, as a slow disk or decoder would
    make it, so that the loader probe and the input-bound flag can be shown to respond to
    the pipeline's cost; noted in the record. 0 without it."""
    delay = float(os.environ.get(SLOW_LOADER_ENV) or 0) / 1000
    if delay:
        strategy.notes.append(f"SLOW LOADER INJECTED ({SLOW_LOADER_ENV}): {delay * 1000:g} ms "
                              "before every training image")
    return delay


SLOW_PROBE_ENV = "BENCH_SLOW_PROBE_STEP_MS"


def slow_probe_steps_from_env() -> float:
    """``BENCH_SLOW_PROBE_STEP_MS=M`` (a test hook): in the compute-only probe steps one rank
    in turn (step mod world size) waits M ms inside its step, so that every step has another
    slowest rank and a test can tell the median of each step's slowest rank (the compute
    step) from any one rank's median (half a wait less). Seconds; 0 without it."""
    return float(os.environ.get(SLOW_PROBE_ENV) or 0) / 1000


def slow_probe_steps_note(delay_s: float) -> str:
    """What the record's ``comm_probe_note`` says of the injected wait."""
    return (f"SLOW PROBE STEPS INJECTED ({SLOW_PROBE_ENV}): {delay_s * 1000:g} ms in one "
            "rank's step in turn")
