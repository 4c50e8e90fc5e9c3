"""The training loop of one rank, the same for every strategy and world size: train an epoch,
evaluate, record. It never names a strategy; what differs lives in the strategy object."""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bench.config.run_config import COMPILE_LIMIT_S, RunConfig
from bench.data.loaders import Loaders, order_digest, served_order_lanes, unchanged_randomness
from bench.measure.across_ranks import (
    initial_fingerprint,
    replica_fingerprint,
    slowest_rank,
    sync_devices,
)
from bench.measure.gpu_clocks import INTERVAL_S, ClockMonitor, start_monitor
from bench.measure.machine_load import LoadMeter
from bench.measure.memory_parts import held, memory_parts
from bench.measure.step_probes import (
    compute_only_steps,
    loader_alone,
    probe_steps_planned,
    profile_steps,
)
from bench.measure.timing import InputWait, step_intervals, step_mark
from bench.models.parameters import initial_params_sha1
from bench.records.run_record import EvalStats, RunRecord, TrainStats
from bench.tools.errors import Diverged
from bench.tools.faults import Fault
from bench.tools.terminal import duration, fill
from bench.train.build import CUDA_GRAPH_MODES, CudaGraphWatch, ModelParts
from bench.train.mllog import MLPerfLog, NoLog
from bench.train.progress import RunClock, epoch_line, progress_bar, say
from bench.train.schedule import BatchSplit, lr_at
from bench.train.scratch import Heartbeat
from strategies.base import Strategy


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class StepDone(NamedTuple):
    """What one optimizer step leaves: each micro-batch's loss sum (device tensors), the
    images it took, its learning rate, and whether it stepped (a full group of
    micro-batches)."""

    loss_sums: list[torch.Tensor]
    images: int
    lr: float
    stepped: bool


def _noting_order(batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                  served: list[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's (images, labels), noting each batch's sample indices in ``served``."""
    for images, labels, indices in batches:
        served.append(indices)
        yield images, labels


class Trainer:
    """Runs the epochs of one rank. Its parts: the run's ``cfg``, the ``strategy`` (what
    happens inside a rank), ``parts`` (model, optimizer, precision), ``loaders``, the batch
    ``split``, the ``record`` (global rank 0 only, else None), the ``heartbeat``, an
    optional injected ``fault``, the ``mllog`` (MLPerf events: rank 0 with --mllog) and the
    ``load`` meter (rank 0: how busy its machine's cores were in each timed epoch)."""

    def __init__(self, cfg: RunConfig, strategy: Strategy, parts: ModelParts, loaders: Loaders,
                 split: BatchSplit, record: RunRecord | None, heartbeat: Heartbeat,
                 fault: Fault | None, threads: int, workers: int,
                 mllog: MLPerfLog | NoLog | None = None, load: LoadMeter | None = None) -> None:
        self.cfg, self.strategy, self.parts, self.loaders = cfg, strategy, parts, loaders
        self.split, self.record, self.beat, self.fault = split, record, heartbeat, fault
        self.threads, self.workers = threads, workers
        self.mllog = mllog or NoLog()
        self.criterion = nn.CrossEntropyLoss()
        self.steps_per_epoch = len(loaders.train) // cfg.grad_accum  # optimizer steps
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.warmup_steps = round(cfg.warmup_epochs * self.steps_per_epoch)
        self.clocks: ClockMonitor | None = None  # GPU clocks while timed (CUDA runs)
        # --compile in a mode that replays CUDA graphs: whether it did (said by the record's rank)
        graphs = cfg.compile and cfg.compile_mode in CUDA_GRAPH_MODES and record is not None
        self.graphs = CudaGraphWatch() if graphs else None
        self.window = (0.0, 0.0)  # the last epoch's timed region (perf_counter)
        self.run_clock: RunClock | None = None  # the time left, with progress on (rank 0)
        self.held: dict[str, int] | None = None  # memory_parts.held after the first epoch
        self.load = load
        self.cpu_load: dict[str, float] | None = None  # the last epoch's, from the meter

    @property
    def shows_progress(self) -> bool:
        """Whether this rank draws the bars and says the run's length (rank 0, with
        progress on)."""
        return self.record is not None and self.cfg.progress

    def probe_steps(self) -> int:
        """The steps the compute-only probe takes after the epochs (warm-ups included)."""
        cfg = self.cfg
        return probe_steps_planned(cfg.comm_probe_steps, self.strategy.world_size,
                                   cfg.ddp_comm_hook, cfg.compile)

    def run(self) -> None:
        """The timed run: warm-up compile, the epochs (train, evaluate, record), the
        measurements after them. ``bench verify`` drives the steps itself (verify_steps)."""
        start = initial_fingerprint(self.strategy, self.parts.model)
        compile_time = self.compile_warm_up()
        self.start_record(compile_time, *start)
        self.start_clocks()
        self.mllog.run_start()
        try:
            self.train_epochs()
            if self.graphs is not None:
                self.record.cuda_graphs(self.graphs.verdict(self.strategy.device.type))
            # MLPerf's success is reaching the target (its run_stop came there already);
            # a run without a target succeeds by finishing its epochs
            self.mllog.run_stop(success=self.cfg.target_top1 is None)
        except BaseException:
            self.mllog.run_stop(success=False)
            raise
        finally:
            self.mllog.close()
            if self.record is not None and self.mllog.failure:
                self.record.data["notes"] = [*self.record.data.get("notes", []),
                                             self.mllog.failure]
            if self.clocks is not None:
                self.clocks.close()
        finish_run(self)

    def start_clocks(self) -> None:
        """Sample the clocks of this process's GPUs while it trains (nothing on CPU)."""
        if self.strategy.device.type != "cuda":
            return
        try:
            uuids = [str(torch.cuda.get_device_properties(d).uuid)
                     for d in self.strategy.process_devices()]
        except Exception as e:  # a torch without device UUIDs: say so, train on
            self.clocks, how = None, f"not sampled: no CUDA device UUID ({e})"
        else:
            self.clocks, how = start_monitor(uuids)
        if self.record is None:
            return
        if self.clocks is None:
            self.record.gpu_sampling(how, None)
        else:
            self.record.gpu_sampling(
                f"nvml every {1000 * INTERVAL_S:.0f} ms, each rank's GPUs, reduced per epoch",
                self.clocks.power_limits())

    def train_epochs(self) -> None:
        cfg, log = self.cfg, self.mllog
        for epoch in range(cfg.epochs):
            log.epoch_start(epoch + 1)
            train = self.train_epoch(epoch)
            log.epoch_stop(epoch + 1)
            if train.diverged:  # every rank sees the same reduced loss: all stop here
                reason = self.record.diverged(epoch, train) if self.record is not None else ""
                raise Diverged(reason or "training loss became non-finite")
            log.eval_start(epoch + 1)
            clocks = self.clocks.window(*self.window) if self.clocks is not None else None
            train, evaluation, memory, clocks = slowest_rank(self.strategy, train,
                                                             self.evaluate(epoch), clocks)
            evaluated_at = time.perf_counter()  # the time-to-target clock stops here
            # top-1 is reduced over ranks: every rank takes the same decision
            reached = cfg.target_top1 is not None and 100 * evaluation.top1 >= cfg.target_top1
            log.eval_stop(epoch + 1, evaluation.top1, reached)
            if self.record is not None:
                entry = self.record.add_epoch(epoch, train, evaluation, memory, clocks,
                                              self.cpu_load)
                print(epoch_line(cfg.strategy, cfg.epochs, entry), flush=True)
                if reached and not self.record.data["reached_target"]:
                    self.record.reached_target(epoch + 1, evaluated_at - self.clock)
            if reached and cfg.stop_at_target:
                break

    def start_record(self, compile_time: float | None, initial_sha1: str,
                     initial_identical: bool | None) -> None:
        s = self.strategy
        if self.record is None:
            return
        self.record.start(
            world_size=s.replicas, processes=s.world_size, norm=s.norm,
            precision=self.parts.precision.label, per_replica_batch=self.split.per_replica,
            per_process_batch=self.split.per_process, grad_accum=self.cfg.grad_accum,
            workers_per_process=self.workers, threads_per_process=self.threads,
            train_size=self.loaders.train_size, test_size=self.loaders.test_size,
            steps_per_epoch=self.steps_per_epoch, warmup_steps=self.warmup_steps,
            parameters=self.parts.parameters, notes=s.notes,
            compile_time_s=compile_time, initial_param_fingerprint=initial_sha1,
            initial_reference_fingerprint=initial_params_sha1(self.cfg.seed, self.parts.spec),
            model=self.parts.spec, batchnorm_layers=self.parts.batchnorm_layers,
            initial_replicas_identical=initial_identical, allow_tf32=self.parts.allow_tf32,
            cpu_load=self.load.described() if self.load is not None else None,
        )

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self, epoch: int) -> TrainStats:
        """One timed epoch: ``train_step`` after ``train_step``, with the heartbeat, the
        injected fault and a timing mark between them; losses and the order served stay on
        the device until the epoch ends (no host sync in the timed region)."""
        s, cfg = self.strategy, self.cfg
        self.start_epoch(epoch)
        cuda = s.device.type == "cuda"
        if cuda:
            for device in s.process_devices():
                torch.cuda.reset_peak_memory_stats(device)
        shown = self.shows_progress
        bar = progress_bar(shown, self.steps_per_epoch, epoch, cfg.epochs)
        if shown and self.run_clock is None:
            self.run_clock = RunClock(cfg.strategy, cfg.epochs, self.steps_per_epoch,
                                      after=cfg.profile_steps + self.probe_steps())
        step = epoch * self.steps_per_epoch
        # the cores' counters read before the ranks gather, not after: the ms it takes would
        # otherwise hold the other ranks' first step, inside their timed region
        load_from = self.load.sample() if self.load is not None else None
        self.beat(f"train epoch {epoch + 1} (waiting for the other ranks)")
        s.barrier()
        # from here the first step, its batch drawn first: a failure or a stall drawing it
        # is the first step's, not the wait's
        self.beat(f"train epoch {epoch + 1} step {step + 1}")
        sync_devices(s)
        start = time.perf_counter()
        if epoch == 0:
            self.clock = start  # time to target runs from the first step, never paused
        if self.run_clock is not None:
            self.run_clock.start_epoch(epoch)
        marks: list[Any] = [step_mark(cuda)]
        # ---- timed region: no host syncs, no logging collectives ----
        history: list[torch.Tensor] = []  # every micro-batch's loss sum, for divergence
        served: list[torch.Tensor] = []  # sample indices as the loader served them
        waited = InputWait()  # host time spent waiting for batches (the clock only)
        batches = _noting_order(waited.batches(self.loaders.train), served)
        seen, lr = 0, math.nan
        for _ in range(self.steps_per_epoch):
            self.before_step(epoch, step)
            done = self.train_step(step, itertools.islice(batches, cfg.grad_accum))
            history += done.loss_sums
            seen += done.images
            lr = done.lr
            if not done.stepped:
                break  # the loader ran out
            step += 1
            marks.append(step_mark(cuda))
            if self.run_clock is not None:
                self.run_clock.step(bar)
            if bar is not None:
                bar.update()
        sync_devices(s)
        end = time.perf_counter()
        train_time, self.window = end - start, (start, end)
        # ---- end of timed region ----
        if load_from is not None:
            self.cpu_load = self.load.between(load_from, self.load.sample())
        if epoch == 0 and self.record is not None:  # gradients and optimizer state now exist
            self.held = held(self.parts.model, self.parts.optimizer)
        step_times = step_intervals(marks, cuda)
        self.beat(f"train epoch {epoch + 1} (end)")
        if bar is not None:
            bar.close()
        loss_sum = (torch.stack(history).sum() if history
                    else torch.zeros((), device=s.device, dtype=torch.float32))
        totals = torch.stack([loss_sum, torch.tensor(float(seen), device=s.device,
                                                     dtype=loss_sum.dtype)])
        s.all_reduce(totals, "sum")
        train_loss = (totals[0] / totals[1]).item()
        diverged, first, last_finite = not math.isfinite(train_loss), None, None
        if diverged and history:
            accum = cfg.grad_accum
            per_micro = torch.stack(history).double().cpu() / self.split.per_process * accum
            bad = (~torch.isfinite(per_micro)).nonzero()
            if len(bad):
                first = epoch * self.steps_per_epoch + int(bad[0]) // accum + 1
                finite = per_micro[: int(bad[0])]
                last_finite = float(finite[-1]) if len(finite) else None
        return TrainStats(
            diverged=diverged, diverged_step=first, last_finite_loss=last_finite,
            data_order_sha1=self.served_digest(served),
            train_time_s=train_time,
            train_loss=train_loss,
            train_images=int(totals[1].item()),
            lr_last=lr,
            step_time_p50_s=_percentile(step_times, 0.5),
            step_time_p90_s=_percentile(step_times, 0.9),
            input_wait_s=waited.seconds,
        )

    def start_epoch(self, epoch: int) -> None:
        """The sampler's order for ``epoch``; the model in training mode."""
        self.loaders.sampler.set_epoch(epoch)
        self.parts.model.train()

    def before_step(self, epoch: int, step: int) -> None:
        """Before each step's first batch is drawn: the heartbeat says where this rank is
        (the watchdog names a stall by it) and an injected fault may fire."""
        self.beat(f"train epoch {epoch + 1} step {step + 1}")
        if self.fault:
            self.fault.maybe_fire(self.strategy.rank, step + 1, self.strategy.device)

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int, micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                   sums: torch.dtype = torch.float32) -> StepDone:
        """One optimizer step over ``--grad-accum`` micro-batches: the learning rate of
        ``step``, the gradients of every micro-batch (all-reduced after the last only), then
        the strategy's step. Losses come back as device tensors, in ``sums``."""
        s, parts, accum = self.strategy, self.parts, self.cfg.grad_accum
        lr = lr_at(step, self.total_steps, self.warmup_steps, self.cfg.peak_lr)
        for group in parts.optimizer.param_groups:
            group["lr"] = lr
        parts.optimizer.zero_grad()  # set_to_none by default (Horovod takes no args)
        loss_sums, images = [], 0
        for micro, (batch, labels) in enumerate(micro_batches):
            loss_sums.append(self.forward_backward_step(batch, labels, micro == accum - 1,
                                                        sums))
            images += labels.numel()
        stepped = len(loss_sums) == accum  # a group the loader left short takes no step
        if stepped:
            s.step(parts.optimizer, parts.precision)
        return StepDone(loss_sums, images, lr, stepped)

    def forward_backward_step(self, images: torch.Tensor, labels: torch.Tensor, last: bool,
                              sums: torch.dtype) -> torch.Tensor:
        """Forward and backward of one micro-batch; the gradient all-reduce runs only on the
        ``last`` micro-batch of a step (DDP's no_sync before it). Returns the batch's loss
        sum (detached, on the device)."""
        s, parts = self.strategy, self.parts
        with contextlib.nullcontext() if last else s.no_sync(parts.model):
            loss = parts.training_loss(self.criterion, images, labels, s.device)
            s.backward(loss / self.cfg.grad_accum, parts.optimizer, parts.precision,
                       last=last)
        return loss.detach().to(sums) * labels.numel()

    def served_digest(self, served: list[torch.Tensor]) -> str:
        """``data_order_sha1`` of what every rank's loader served this epoch. Collective."""
        s = self.strategy
        indices = torch.cat(served).cpu().numpy() if served else np.zeros(0, np.int64)
        lanes = served_order_lanes(indices, s.rank, s.world_size)
        totals = torch.tensor([*lanes, len(indices)], dtype=torch.float64, device=s.device)
        s.all_reduce(totals, "sum")
        return order_digest(totals[:-1].tolist(), int(totals[-1].item()))

    @torch.no_grad()
    def evaluate(self, epoch: int) -> EvalStats:
        """Top-1, top-5 and the loss over the test set, every image once across ranks. With
        progress on, a bar of its own: on a CPU the 10,000 test images take a minute after
        the epoch's bar has gone."""
        s = self.strategy
        try:
            batches = len(self.loaders.test)  # type: ignore[arg-type]
        except TypeError:
            batches = None
        bar = progress_bar(self.shows_progress, batches, epoch, self.cfg.epochs, what="eval")
        net = s.eval_module(self.parts.model)
        s.broadcast_buffers(net)
        net.eval()
        totals = torch.zeros(4, device=s.device, dtype=torch.float64)  # top1, top5, n, loss
        self.beat("eval batch 1")  # drawing it: not "train epoch N (end)"
        sync_devices(s)
        start = time.perf_counter()
        for batch, (images, labels, valid) in enumerate(self.loaders.test):
            self.beat(f"eval batch {batch + 1}")
            images = images.to(s.device, self.parts.dtype, non_blocking=True)
            labels = labels.to(s.device, non_blocking=True)
            valid = valid.to(s.device, non_blocking=True)
            with self.parts.precision.autocast():
                logits = net(images)
            logits = logits.float()
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices  # 3 classes: 3
            hits = (top5 == labels[:, None]) & valid[:, None]
            losses = nn.functional.cross_entropy(logits, labels, reduction="none")
            # One float64 add: apex O1 patches in-place ops and refuses float64 += float32.
            sums = (hits[:, 0].sum(), hits.any(dim=1).sum(), valid.sum(), (losses * valid).sum())
            totals += torch.stack([x.to(torch.float64) for x in sums])
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
        sync_devices(s)
        eval_time = time.perf_counter() - start
        s.all_reduce(totals, "sum")
        count = int(totals[2].item())
        return EvalStats(eval_time_s=eval_time, top1=totals[0].item() / count,
                         top5=totals[1].item() / count, test_loss=totals[3].item() / count,
                         test_images=count)

    # ------------------------------------------------------------------ around the epochs
    def compile_warm_up(self) -> float | None:
        """With --compile: compile on one batch (forward + backward, no step; BatchNorm
        buffers restored) before the timed epochs. Returns the seconds it took."""
        if not self.cfg.compile:
            return None
        s, parts = self.strategy, self.parts
        module = getattr(parts.model, "module", parts.model)
        saved = [b.detach().clone() for b in module.buffers()]
        with unchanged_randomness(self.loaders.train):
            images, labels = next(iter(self.loaders.train))[:2]
        images = images.to(s.device, parts.dtype, memory_format=parts.memory_format)
        labels = labels.to(s.device)
        # A compile takes a minute on a CPU and more under max-autotune, before any bar:
        # with progress on, the run says what it is waiting for, and how long it took.
        shown = self.shows_progress
        if shown:
            say(fill(f"[{self.cfg.strategy}] compiling the model on one batch (--compile "
                     f"{self.cfg.compile_mode}), before the timed epochs",
                     subsequent_indent="    "), None)
        # The compile is one long call, and a rank that finished compiling waits for its
        # peers in the backward's collectives: the rank beats from a thread throughout, for
        # at most the stated limit (the group's collectives may wait as long: group_timeout).
        with self.beat.through("compile", COMPILE_LIMIT_S):
            sync_devices(s)
            start = time.perf_counter()
            with parts.precision.autocast():
                loss = self.criterion(parts.forward(images), labels)
            s.backward(loss, parts.optimizer, parts.precision)
            sync_devices(s)
            seconds = time.perf_counter() - start
        if shown:
            say(f"[{self.cfg.strategy}] compiled in {duration(seconds)}", None)
        s.discard_gradients(parts.optimizer)
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), saved):
                buffer.copy_(value)
        if parts.precision.scaler is not None:  # forget the warm-up's scaling state
            parts.precision.scaler.update(parts.precision.scaler.get_scale())
        return seconds


def finish_run(trainer: Trainer) -> None:
    """After the last epoch: the replica check, the input pipeline alone
    (--loader-probe-steps), then the profiled steps (--profile-steps) and the compute-only
    probe steps, which change the model and so come after everything recorded about it."""
    if trainer.record is not None and trainer.held is not None:  # before any extra step
        trainer.record.data["memory_parts"] = memory_parts(trainer.held,
                                                           trainer.strategy.device)
    identical, fingerprint = replica_fingerprint(trainer.strategy, trainer.parts.model)
    scaler_state = trainer.parts.precision.scaler_state()  # before the extra steps move it
    batches = trainer.cfg.loader_probe_steps
    ceiling = loader_alone(trainer, batches) if batches else None
    if trainer.record is not None and batches:
        trainer.record.loader_probe(batches, ceiling)
    clock = trainer.run_clock
    if trainer.cfg.profile_steps:
        trace = trainer.record.trace_path() if trainer.record is not None else None
        if clock is not None:
            clock.measuring(trainer.cfg.profile_steps, "a profile of the run's steps "
                            "(--profile-steps)")
        profile_steps(trainer, trainer.cfg.profile_steps, trace)
    steps = trainer.cfg.comm_probe_steps
    if clock is not None:
        clock.measuring(trainer.probe_steps(), "its compute timed without gradient "
                        "communication, for the projection (--comm-probe-steps 0 leaves "
                        "them out)" if trainer.strategy.world_size > 1 else
                        "when each gradient is ready (--comm-probe-steps 0 leaves them out)")
    probe = compute_only_steps(trainer, steps) if steps else None
    if trainer.record is not None:
        if probe is not None:
            trainer.record.comm_probe(probe.steps, probe.compute_step_s, probe.note,
                                      probe.timeline and probe.timeline.to_record(),
                                      probe.hook_work_s)
        model = trainer.parts.model
        trainer.record.finish(identical, fingerprint, scaler_state,
                              trainer.strategy.gradient_buckets(model),
                              trainer.strategy.compressed_gradient_elements(model))


