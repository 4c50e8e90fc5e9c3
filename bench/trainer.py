"""The training loop of one rank, the same for every strategy and world size: train an epoch,
evaluate, record. It never names a strategy; what differs lives in the strategy object."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.across_ranks import (
    global_mean,
    initial_fingerprint,
    replica_fingerprint,
    slowest_rank,
    sync_devices,
)
from bench.config import COMPILE_LIMIT_S, RunConfig
from bench.errors import Diverged
from bench.extra_steps import compute_only_steps, loader_alone, profile_steps
from bench.faults import Fault
from bench.gpu_clocks import (
    INTERVAL_S,
    ClockMonitor,
    epoch_suffix,
    start_monitor,
)
from bench.loaders import Loaders, order_digest, served_order_lanes, unchanged_randomness
from bench.mlperf_log import MLPerfLog, NoLog
from bench.model import initial_params_sha1
from bench.parts import CUDA_GRAPH_MODES, CudaGraphWatch, ModelParts
from bench.record import EvalStats, RunRecord, TrainStats
from bench.schedule import BatchSplit, lr_at
from bench.scratch import Heartbeat
from bench.timing import InputWait, step_intervals, step_mark
from bench.verify_rank import run_verify
from strategies.base import Strategy


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class Trainer:
    """Runs the epochs of one rank. Its parts: the run's ``cfg``, the ``strategy`` (what
    happens inside a rank), ``parts`` (model, optimizer, precision), ``loaders``, the batch
    ``split``, the ``record`` (global rank 0 only, else None), the ``heartbeat``, an
    optional injected ``fault`` and the ``mllog`` (MLPerf events: rank 0 with --mllog)."""

    def __init__(self, cfg: RunConfig, strategy: Strategy, parts: ModelParts, loaders: Loaders,
                 split: BatchSplit, record: RunRecord | None, heartbeat: Heartbeat,
                 fault: Fault | None, threads: int, workers: int,
                 mllog: MLPerfLog | NoLog | None = None) -> None:
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

    def run(self) -> None:
        if self.cfg.verify_steps is not None:
            run_verify(self)
            return
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
                                                             self.evaluate(), clocks)
            evaluated_at = time.perf_counter()  # the time-to-target clock stops here
            # top-1 is reduced over ranks: every rank takes the same decision
            reached = cfg.target_top1 is not None and 100 * evaluation.top1 >= cfg.target_top1
            log.eval_stop(epoch + 1, evaluation.top1, reached)
            if self.record is not None:
                entry = self.record.add_epoch(epoch, train, evaluation, memory, clocks)
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
        )

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self, epoch: int) -> TrainStats:
        s, cfg, parts = self.strategy, self.cfg, self.parts
        optimizer, precision = parts.optimizer, parts.precision
        self.loaders.sampler.set_epoch(epoch)
        parts.model.train()
        step_losses: list[float] = []
        accum, verifying = cfg.grad_accum, cfg.verify_steps is not None
        sums = torch.float64 if verifying else torch.float32  # bench verify compares at 1e-8
        loss_sum = torch.zeros((), device=s.device, dtype=sums)
        seen = 0
        cuda = s.device.type == "cuda"
        if cuda:
            for device in s.process_devices():
                torch.cuda.reset_peak_memory_stats(device)
        bar = progress_bar(self.record is not None and cfg.progress, self.steps_per_epoch,
                           epoch, cfg.epochs)
        step = epoch * self.steps_per_epoch
        self.beat(f"train epoch {epoch + 1} (waiting for the other ranks)", force=True)
        s.barrier()
        # from here the first step, its batch drawn first: a failure or a stall drawing it
        # is the first step's, not the wait's
        self.beat(f"train epoch {epoch + 1} step {step + 1}", force=True)
        sync_devices(s)
        start = time.perf_counter()
        if epoch == 0:
            self.clock = start  # time to target runs from the first step, never paused
        marks: list[Any] = [step_mark(cuda)]
        # ---- timed region: no host syncs, no logging collectives ----
        step_loss = torch.zeros((), device=s.device, dtype=sums)
        history: list[torch.Tensor] = []  # every micro-batch's loss sum, for divergence
        served = []  # sample indices as the loader served them (no host sync)
        waited = InputWait()  # host time spent waiting for batches (the clock only)
        for micro, (images, labels, indices) in enumerate(waited.batches(self.loaders.train)):
            if micro >= self.steps_per_epoch * accum:
                break  # an incomplete group of micro-batches at the end is dropped
            served.append(indices)
            first, last = micro % accum == 0, micro % accum == accum - 1
            if first:
                self.beat(f"train epoch {epoch + 1} step {step + 1}")
                if self.fault:
                    self.fault.maybe_fire(s.rank, step + 1, s.device)
                lr = lr_at(step, self.total_steps, self.warmup_steps, cfg.peak_lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                optimizer.zero_grad()  # set_to_none by default (Horovod takes no args)
            # Micro-steps before the last skip the gradient all-reduce (DDP no_sync).
            with contextlib.nullcontext() if last else s.no_sync(parts.model):
                loss = parts.training_loss(self.criterion, images, labels, s.device)
                s.backward(loss / accum, optimizer, precision, last=last)
            batch_loss = loss.detach().to(sums) * labels.numel()
            loss_sum += batch_loss
            history.append(batch_loss)  # on the device: read once, after the epoch
            seen += labels.numel()
            if verifying:
                step_loss += batch_loss
            if not last:
                continue
            s.step(optimizer, precision)
            step += 1
            marks.append(step_mark(cuda))
            if bar is not None:
                bar.update()
            if verifying:  # not a timed run: per-step global loss, then stop at K steps
                step_losses.append(global_mean(s, step_loss, self.split.per_process))
                step_loss = torch.zeros((), device=s.device, dtype=sums)
                if step >= cfg.verify_steps:
                    break
        sync_devices(s)
        end = time.perf_counter()
        train_time, self.window = end - start, (start, end)
        # ---- end of timed region ----
        step_times = step_intervals(marks, cuda)
        self.beat(f"train epoch {epoch + 1} (end)", force=True)
        if bar is not None:
            bar.close()
        totals = torch.stack([loss_sum, torch.tensor(float(seen), device=s.device,
                                                     dtype=sums)])
        s.all_reduce(totals, "sum")
        train_loss = (totals[0] / totals[1]).item()
        diverged, first, last_finite = not math.isfinite(train_loss), None, None
        if diverged and history:
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
            step_losses=tuple(step_losses),
            input_wait_s=waited.seconds,
        )

    def served_digest(self, served: list[torch.Tensor]) -> str:
        """``data_order_sha1`` of what every rank's loader served this epoch. Collective."""
        s = self.strategy
        indices = torch.cat(served).cpu().numpy() if served else np.zeros(0, np.int64)
        lanes = served_order_lanes(indices, s.rank, s.world_size)
        totals = torch.tensor([*lanes, len(indices)], dtype=torch.float64, device=s.device)
        s.all_reduce(totals, "sum")
        return order_digest(totals[:-1].tolist(), int(totals[-1].item()))

    @torch.no_grad()
    def evaluate(self) -> EvalStats:
        s = self.strategy
        net = s.eval_module(self.parts.model)
        s.broadcast_buffers(net)
        net.eval()
        totals = torch.zeros(4, device=s.device, dtype=torch.float64)  # top1, top5, n, loss
        self.beat("eval batch 1", force=True)  # drawing it: not "train epoch N (end)"
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
    identical, fingerprint = replica_fingerprint(trainer.strategy, trainer.parts.model)
    scaler_state = trainer.parts.precision.scaler_state()  # before the extra steps move it
    batches = trainer.cfg.loader_probe_steps
    ceiling = loader_alone(trainer, batches) if batches else None
    if trainer.record is not None and batches:
        trainer.record.loader_probe(batches, ceiling)
    if trainer.cfg.profile_steps:
        trace = trainer.record.trace_path() if trainer.record is not None else None
        profile_steps(trainer, trainer.cfg.profile_steps, trace)
    steps = trainer.cfg.comm_probe_steps
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


def progress_bar(enabled: bool, steps: int, epoch: int, epochs: int):
    """tqdm over one epoch's steps (rank 0 only), or None."""
    if not enabled:
        return None
    from tqdm import tqdm

    # Under torchrun / launch / horovodrun stderr is a pipe to bench, which passes it on to
    # its terminal as it comes (BENCH_TTY=1 says that terminal is one): draw there too.
    drawn = sys.stderr.isatty() or os.environ.get("BENCH_TTY") == "1"
    return tqdm(total=steps, desc=f"epoch {epoch + 1}/{epochs}", leave=False, unit="step",
                disable=not drawn, file=sys.stderr)


def epoch_line(strategy: str, epochs: int, entry: dict[str, Any], width: int = 120) -> str:
    """One epoch on the terminal (top-5 is in the record); the GPUs' figures go on a line of
    their own when both would not fit in ``width`` columns."""
    waited = entry["input_wait_s"] / entry["train_time_s"]
    line = (f"[{strategy}] epoch {entry['epoch']}/{epochs}  "
            f"{entry['train_time_s']:.2f}s  {entry['images_per_s']:.0f} img/s  "
            f"input wait {100 * waited:.0f}%  loss {entry['train_loss']:.3f}  "
            f"top1 {100 * entry['top1']:.2f}%")
    gpus = epoch_suffix(entry.get("gpu_clocks"))
    return line + gpus if len(line + gpus) <= width else f"{line}\n  {gpus}"
