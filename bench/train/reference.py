"""The plain loop ``bench verify`` compares every strategy with: one process, no wrapper,
the same recipe, initial weights and global batches.

BatchNorm. A replica normalises with the statistics of the images it sees. Under per-replica
BN (DataParallel, DDP/Horovod on CPU, ``--no-syncbn``) each of W replicas sees B/W images, so
the network computes a different function from one that sees all B at once: comparing such a
strategy with a full-batch reference would flag a difference that is not a bug. The reference
therefore reproduces the strategy's BatchNorm grouping: it runs the global batch as W separate
forward passes over exactly the images each replica gets (the sampler's rank shards for DDP and
Horovod, DataParallel's contiguous scatter chunks), averages their losses and takes one step.
That is mathematically what the strategy must compute; SyncBN strategies are compared with
W = 1. Under ``--ghost-bn G`` each replica's images are cut further, into forward passes of G
images of plain BatchNorm: what the ranks' ghost layer must compute in one pass (an
independent check of it; under mixed precision G-image passes round otherwise than one pass,
so there the reference takes the ranks' ghost layer). Augmentation and dropout are off
(each rank's random crops and masks differ by design).

Mixed precision. Under bf16 two computations of one function differ wherever one rounds
where the other does not, so the reference also rounds where the ranks do: it takes their
thread count (verify sets it), memory layout and compilation, scales each gradient as they
do (a rank's mean, the sum divided by W after the backward), and under SyncBN on CPU ranks
cuts each batch as they do (bench/train/rank_chunks.py).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from bench.config.run_config import RunConfig
from bench.data.datasets import dataset, model_spec
from bench.data.loaders import input_memory_format
from bench.models.ghost_batchnorm import GhostBatchNorm
from bench.models.stochastic import switch_off_random_layers
from bench.train.build import compiled
from bench.train.rank_chunks import as_rank_chunks
from bench.train.schedule import lr_at
from strategies.base import epoch_sampler
from strategies.precision import Precision


@dataclass(frozen=True)
class Layout:
    """How a strategy cut each global batch into BatchNorm forward passes."""

    processes: int = 1  # sampler shards (DistributedSampler ranks)
    replicas_per_process: int = 1  # DataParallel scatters a process batch into this many
    accum: int = 1  # micro-batches per optimizer step
    sync: bool = False  # SyncBatchNorm: one statistic over all replicas' micro-batch
    ghost: int | None = None  # --ghost-bn: a replica's statistics over each G of its images

    def describe(self) -> str:
        replicas = self.processes * self.replicas_per_process
        kind = "sync" if self.sync else f"{replicas} replica{'s' if replicas > 1 else ''}"
        return f"BN {kind} x {self.accum} micro{f', ghost {self.ghost}' if self.ghost else ''}"


def layout_of(meta: dict) -> Layout:
    return Layout(
        processes=meta["processes"],
        replicas_per_process=meta["world_size"] // meta["processes"],
        accum=meta.get("grad_accum", 1),
        sync=meta["norm"] == "syncbn",
        ghost=meta.get("ghost_bn"),
    )


def reference(cfg: RunConfig, steps: int, layout: Layout = Layout(), *,
              precision: str = "fp32", float64: bool = True, device: str = "cpu",
              sum_first: bool = False,
              ) -> tuple[list[float], dict[str, torch.Tensor], int | None]:
    """The plain loop: one process, no wrapper, same recipe and batches, and the strategy's
    BatchNorm grouping: each group is one forward pass; their mean losses are averaged.
    fp32 runs in float64; mixed precision under the same autocast dtype and loss scaler
    (same initial scale); returns the losses, the parameters and the steps the scaler
    skipped (None without one). ``sum_first``: a cast on the wire averages as Horovod
    does (the sum, then 1/W), not as DDP's hook (each share divided by W, then summed)."""
    dtype = torch.float64 if float64 else torch.float32
    torch.manual_seed(cfg.seed)
    model = model_spec(cfg).build()
    switch_off_random_layers(model)  # as the strategy's ranks do under verify
    mixed = Precision(precision, torch.device(device))
    if layout.ghost is not None and mixed.dtype is not None:  # see the module's docstring
        model = GhostBatchNorm.convert(model, layout.ghost)
        layout = replace(layout, ghost=None)
    model = model.to(device=device, dtype=dtype)
    if cfg.channels_last:  # as the ranks' (under bf16 another layout rounds otherwise)
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.peak_lr, momentum=cfg.momentum,
                                nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)
    data = dataset(cfg, "train", augment=False)
    orders = []
    for rank in range(layout.processes):
        sampler = epoch_sampler(data, cfg.seed, layout.processes, rank)
        sampler.set_epoch(0)
        orders.append(list(sampler))
    model.train()
    # bf16 on CPU ranks under SyncBN: the ranks' cut, or rounding noise hides defects
    by_rank = layout.sync and mixed.dtype is not None and device == "cpu"
    if by_rank:
        model = as_rank_chunks(model, layout.processes)
    # a cast on the wire, as each rank makes it, where each rank's gradient is its own
    wire = (WireCast(CAST_DTYPES[cfg.ddp_comm_hook], sum_first)
            if cfg.ddp_comm_hook in CAST_DTYPES and not layout.sync else None)
    with _compressed_like(cfg, model, wire is None) as net:
        if cfg.compile:  # as the ranks' (under bf16 fused kernels round otherwise)
            net = compiled(net, cfg.compile_mode, dynamic=False if by_rank else None)
        losses = _reference_steps(cfg, steps, layout, net, optimizer, mixed, data, orders,
                                  device, dtype, by_rank=by_rank, wire=wire)
    params = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    return losses, params, mixed.scaler_state()["scaler_skipped_steps"]


CAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # the cast hooks' wire types


@dataclass(frozen=True)
class WireCast:
    """Each rank's gradient cast to ``dtype`` for the all-reduce and back after it: DDP's
    fp16 / bf16 hook divides each share by W in that type, then sums; Horovod's fp16
    compression (``sum_first``) sums, then scales by 1/W (its Average's postscale)."""

    dtype: torch.dtype
    sum_first: bool = False

    def average(self, shares: list[torch.Tensor]) -> torch.Tensor:
        """The all-reduced gradient from each rank's own, rounded where the wire rounds:
        each cast, each sum of two in the low type (gloo and NCCL add pairwise), the 1/W
        in it too. At 2 ranks that is the ranks' result to the bit; beyond, the
        collective's order of addition may round otherwise."""
        world = len(shares)
        low = [share.to(self.dtype) for share in shares]
        if not self.sum_first:
            low = [x.div_(world) for x in low]
        total = low[0]
        for x in low[1:]:
            total = total + x
        if self.sum_first:
            total = total.mul_(1.0 / world)
        return total.to(shares[0].dtype)


@contextlib.contextmanager
def _compressed_like(cfg: RunConfig, model: nn.Module, wrap: bool = True):
    """The reference model, or — under ``--ddp-comm-hook`` — the same model in a one-process
    DDP with the same hook, so that the reference compresses its gradient as the strategy
    does. PowerSGD is linear in the gradient given its (all-reduced, hence shared) factors
    and error-feedback memory, so W ranks compressing their own gradients and averaging the
    factors compute what one process compressing the averaged gradient computes: the check
    stays exact (float64). fp16 / bf16 casts round each rank's share before the sum: where
    each rank's gradient is its own (not under SyncBN) the reference casts them so itself
    (``wrap`` False: WireCast); under SyncBN one process casts the sum, a tolerance set
    from measurement (docs/verify.md)."""
    if cfg.ddp_comm_hook == "none" or not wrap:
        yield model
        return
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench.tools.ports import MASTER_ADDR, free_port, release_port
    from strategies.ddp import register_comm_hook

    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://{MASTER_ADDR}:{port}",
                            rank=0, world_size=1)
    release_port(port)  # its store listens now
    # The hook's callbacks run on the group's gloo threads and hold the group: the thread
    # that drops the last reference runs its destructor, which joins every gloo thread, and
    # one joining itself aborts the process ('Resource deadlock avoided', seen once under
    # load). Kept here, the group is never freed by one of its own threads.
    _RETIRED_GROUPS.append(dist.group.WORLD)
    try:
        wrapped = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb)
        register_comm_hook(wrapped, cfg.strategy_options.ddp, "gloo")
        yield wrapped
    finally:
        dist.destroy_process_group()


_RETIRED_GROUPS: list = []  # one idle 1-rank gloo group per hooked reference (see above)


def _reference_steps(cfg: RunConfig, steps: int, layout: Layout, model: nn.Module, optimizer,
                     mixed: Precision, data, orders: list[list[int]], device: str,
                     dtype: torch.dtype, by_rank: bool = False,
                     wire: WireCast | None = None) -> list[float]:
    """The reference's optimizer steps; returns each step's loss. A DDP-wrapped reference
    (a comm hook) communicates once per step, after the last BatchNorm group's backward.

    Gradients are scaled where the ranks scale them: each rank's loss is the mean over its
    own micro-batch divided by --grad-accum, and DDP divides the summed gradients by the
    world size W after the backward. So the reference divides by W at the end, not in
    every loss: a 1/3 folded into the loss rounded every bf16 activation gradient otherwise
    than the ranks' did, and at 3 ranks a correct ddp-amp failed (7.7e-5 against 5e-5).
    Under a cast on the wire (``wire``) each rank's gradient is made apart, then averaged
    as the wire rounds it (WireCast.average), which divides by W itself."""
    per_process = cfg.batch_size // layout.processes
    micro = per_process // layout.accum
    part = micro // layout.replicas_per_process
    steps_per_epoch = len(orders[0]) // per_process
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    last_only = getattr(model, "no_sync", None)
    losses = []
    for step in range(steps):
        groups: list[tuple[int, list[int]]] = []  # (the rank whose images, the images)
        for m in range(layout.accum):
            start = step * per_process + m * micro
            chunks = [order[start : start + micro] for order in orders]
            if layout.sync:
                groups.append((0, [i for chunk in chunks for i in chunk]))
            else:
                size = layout.ghost or part  # a ghost BatchNorm group, or the replica's part
                groups += [(rank, c[r * part + g : r * part + g + size])
                           for rank, c in enumerate(chunks)
                           for r in range(layout.replicas_per_process)
                           for g in range(0, part, size)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps_per_epoch * cfg.epochs, warmup, cfg.peak_lr)
        optimizer.zero_grad()
        total, divisor = 0.0, _after_backward(layout, by_rank)
        # under a cast on the wire, each rank's groups apart (its gradient is its own sum)
        owners = ([[k for k, (rank, _) in enumerate(groups) if rank == r]
                   for r in range(layout.processes)] if wire else [range(len(groups))])
        shares = []
        for ks in owners:
            if wire:
                optimizer.zero_grad()
            for k in ks:
                idx = groups[k][1]
                images = torch.stack([data[i][0] for i in idx]).to(
                    device, dtype, memory_format=input_memory_format(cfg))
                labels = torch.as_tensor([int(data[i][1]) for i in idx]).to(device)
                hold = (last_only() if last_only and k < len(groups) - 1
                        else contextlib.nullcontext())
                with hold:
                    with mixed.autocast(cache=not by_rank):
                        loss = _group_loss(model(images), labels, layout, by_rank, part)
                    mixed.backward(loss)
                total += loss.item() / divisor
            if wire:
                shares.append([p.grad.clone() if p.grad is not None else None
                               for p in model.parameters()])
        if wire:
            for i, param in enumerate(model.parameters()):
                each = [share[i] for share in shares]
                param.grad = None if each[0] is None else wire.average(each)
        elif divisor > 1:
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.div_(divisor)
        mixed.step(optimizer)
        losses.append(total)
    return losses


def _group_loss(logits: torch.Tensor, labels: torch.Tensor, layout: Layout,
                by_rank: bool, part: int) -> torch.Tensor:
    """One BatchNorm group's loss as the ranks scale it: a replica's mean (DataParallel's
    replicas share their process's mean; a ghost group is its share of its replica's
    ``part`` images), divided by --grad-accum; the whole batch of a SyncBN group (its mean
    over every rank's images), or, cut by rank, each rank's mean."""
    if layout.sync and by_rank:
        rank_means = [nn.functional.cross_entropy(part, lab)
                      for part, lab in zip(logits.chunk(layout.processes),
                                           labels.chunk(layout.processes))]
        return torch.stack(rank_means).sum() / layout.accum
    loss = nn.functional.cross_entropy(logits, labels)
    if layout.sync:
        return loss / layout.accum
    share = layout.replicas_per_process * (part // len(labels))  # a ghost group's 1/(part/G)
    return loss / (layout.accum * share)


def _after_backward(layout: Layout, by_rank: bool) -> int:
    """What the summed gradients are divided by after the backward, as DDP divides them by
    the world size: the processes, except for a SyncBN group taken whole (its loss is
    already the mean over every rank's images)."""
    return 1 if layout.sync and not by_rank else layout.processes


def compare(losses: list[float], params: dict[str, torch.Tensor], ref_losses: list[float],
            ref_params: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Max relative per-step loss difference; relative difference of all parameters."""
    if len(losses) != len(ref_losses) or set(params) != set(ref_params):
        return math.inf, math.inf
    loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses))
    mine = torch.cat([params[k].double().reshape(-1) for k in ref_params])
    ref = torch.cat([v.double().reshape(-1) for v in ref_params.values()])
    return loss_diff, float((mine - ref).norm() / ref.norm())
