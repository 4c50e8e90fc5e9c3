"""``bench verify``: every available strategy trains K steps from the same weights on the
same global batches, and is compared with a plain single-process loop.

BatchNorm. A replica normalises with the statistics of the images it sees. Under per-replica
BN (DataParallel, DDP/Horovod on CPU, ``--no-syncbn``) each of W replicas sees B/W images, so
the network computes a different function from one that sees all B at once: comparing such a
strategy with a full-batch reference would flag a difference that is not a bug. The reference
therefore reproduces the strategy's BatchNorm grouping: it runs the global batch as W separate
forward passes over exactly the images each replica gets (the sampler's rank shards for DDP and
Horovod, DataParallel's contiguous scatter chunks), averages their losses and takes one step.
That is mathematically what the strategy must compute; SyncBN strategies are compared with
W = 1. Augmentation is off (each rank's random crops differ by design).

Learning rate. Training a fresh ResNet at lr 0.1 amplifies rounding differences enormously:
the same plain loop run with 1 and with 2 CPU threads differs by 1e-4 in loss after 4 steps
and by 3 % in parameters after 20. No tolerance could then tell a bug from rounding, so the
check uses lr 0.001 (``--lr`` overrides), where the two thread counts stay within 2e-5. A
real bug (summed instead of averaged gradients, a wrong data split, ranks that drift apart)
moves the numbers by 1e-3 or more.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import strategies
from bench.config import RunConfig
from bench.data import CifarTensorDataset, load_split
from bench.errors import EXIT_FAILED, EXIT_OK, ConfigError
from bench.model import resnet18_cifar
from bench.runner import RunPlan, execute
from bench.trainer import lr_at
from strategies.base import epoch_sampler

VERIFY_LR = 0.001
# Relative tolerance on every step's loss and on the whole parameter vector.
TOLERANCE = {"fp32": 1e-4, "mixed": 5e-2}


@dataclass
class Outcome:
    strategy: str
    status: str  # pass | FAIL | skipped
    precision: str = ""
    norm: str = ""
    loss_diff: float = math.nan
    param_diff: float = math.nan
    tolerance: float = math.nan
    detail: str = ""

    def line(self) -> str:
        if self.status == "skipped":
            return f"{self.strategy:<11} skipped  {self.detail}"
        return (
            f"{self.strategy:<11} {self.status:<4}  {self.precision:<5} {self.norm:<14} "
            f"max loss diff {self.loss_diff:.1e}  param diff {self.param_diff:.1e}  "
            f"(tolerance {self.tolerance:.0e}){'  ' + self.detail if self.detail else ''}"
        )


@dataclass(frozen=True)
class Layout:
    """How a strategy cut each global batch into BatchNorm forward passes."""

    processes: int = 1  # sampler shards (DistributedSampler ranks)
    replicas_per_process: int = 1  # DataParallel scatters a process batch into this many
    accum: int = 1  # micro-batches per optimizer step
    sync: bool = False  # SyncBatchNorm: one statistic over all replicas' micro-batch

    def describe(self) -> str:
        kind = "sync" if self.sync else f"{self.processes * self.replicas_per_process} replicas"
        return f"BN {kind} x {self.accum} micro"


def layout_of(meta: dict) -> Layout:
    return Layout(
        processes=meta["processes"],
        replicas_per_process=meta["world_size"] // meta["processes"],
        accum=meta.get("grad_accum", 1),
        sync=meta["norm"] == "syncbn",
    )


def reference(cfg: RunConfig, steps: int,
              layout: Layout = Layout()) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The plain loop: one process, no wrapper, same recipe and batches, and the strategy's
    BatchNorm grouping: each group is one forward pass; their mean losses are averaged."""
    torch.manual_seed(cfg.seed)
    model = resnet18_cifar(width=cfg.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.peak_lr, momentum=cfg.momentum,
                                nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)
    data = CifarTensorDataset(
        load_split(cfg.data, "train", cfg.data_dir, cfg.seed, cfg.train_limit), augment=False
    )
    orders = []
    for rank in range(layout.processes):
        sampler = epoch_sampler(data, cfg.seed, layout.processes, rank)
        sampler.set_epoch(0)
        orders.append(list(sampler))
    per_process = cfg.batch_size // layout.processes
    micro = per_process // layout.accum
    part = micro // layout.replicas_per_process
    steps_per_epoch = len(orders[0]) // per_process
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    model.train()
    losses = []
    for step in range(steps):
        groups = []
        for m in range(layout.accum):
            start = step * per_process + m * micro
            chunks = [order[start : start + micro] for order in orders]
            if layout.sync:
                groups.append([i for chunk in chunks for i in chunk])
            else:
                groups += [c[r * part : (r + 1) * part] for c in chunks
                           for r in range(layout.replicas_per_process)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps_per_epoch * cfg.epochs, warmup, cfg.peak_lr)
        optimizer.zero_grad()
        total = 0.0
        for idx in groups:
            images = torch.stack([data[i][0] for i in idx])
            labels = torch.stack([data[i][1] for i in idx])
            loss = nn.functional.cross_entropy(model(images), labels) / len(groups)
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def compare(losses: list[float], params: dict[str, torch.Tensor], ref_losses: list[float],
            ref_params: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Max relative per-step loss difference; relative difference of all parameters."""
    if len(losses) != len(ref_losses) or set(params) != set(ref_params):
        return math.inf, math.inf
    loss_diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref_losses))
    mine = torch.cat([params[k].reshape(-1) for k in ref_params])
    ref = torch.cat([v.reshape(-1) for v in ref_params.values()])
    return loss_diff, float((mine - ref).norm() / ref.norm())


def run_verify(base: RunConfig, names: list[str], steps: int) -> int:
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1 (got {steps})")
    base = base.derive(train_limit=steps * base.batch_size, epochs=1, warmup_epochs=0.0,
                       progress=False, lr=VERIFY_LR if base.lr is None else base.lr)
    # Validate everything first: bad input writes nothing.
    plans = {name: RunPlan(base.derive(strategy=name), probe_output=False) for name in names}
    print(f"bench verify: {steps} steps, global batch {base.batch_size}, lr {base.lr}, "
          f"{base.gpus} {'CPU process(es)' if base.cpu else 'GPU(s)'}, no augmentation; "
          "reference: one plain process with the strategy's BatchNorm grouping", flush=True)
    references: dict[Layout, tuple[list[float], dict]] = {}
    outcomes = []
    for name in names:
        plan = plans[name]
        reason = plan.strategy.requires(plan.device_type)
        if reason:
            outcomes.append(Outcome(name, "skipped", detail=f"unavailable: {reason}"))
            print(outcomes[-1].line(), flush=True)
            continue
        work = Path(tempfile.mkdtemp(prefix=f"bench-verify-{name}-"))
        try:
            cfg = base.derive(strategy=name, verify_steps=steps, verify_dir=str(work),
                              output=str(work / "results"))
            with contextlib.redirect_stdout(io.StringIO()):
                code = execute(cfg, ["bench", "verify", name])
            if code != 0 or not (work / "losses.json").exists():
                outcomes.append(Outcome(name, "FAIL", detail=f"run exited with {code}"))
            else:
                meta = json.loads((work / "losses.json").read_text())
                key = layout_of(meta)
                if key not in references:
                    references[key] = reference(base, steps, key)
                params = torch.load(work / "params.pt")
                loss_diff, param_diff = compare(meta["losses"], params, *references[key])
                tol = TOLERANCE["fp32" if meta["precision"] == "fp32" else "mixed"]
                ok = loss_diff <= tol and param_diff <= tol
                outcomes.append(Outcome(name, "pass" if ok else "FAIL", meta["precision"],
                                        meta["norm"], loss_diff, param_diff, tol,
                                        detail=key.describe()))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(outcomes[-1].line(), flush=True)
    failed = [o for o in outcomes if o.status == "FAIL"]
    print(f"bench verify: {sum(o.status == 'pass' for o in outcomes)} passed, "
          f"{len(failed)} failed, {sum(o.status == 'skipped' for o in outcomes)} skipped")
    return EXIT_FAILED if failed else EXIT_OK


def default_strategies() -> list[str]:
    return strategies.names()
