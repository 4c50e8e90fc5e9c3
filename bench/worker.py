"""The per-rank training body, the same for 1 and N processes and for every strategy.

Started as ``python -m bench.worker SPEC.json`` by torchrun / torch.distributed.launch, or
called in-process (inline, mp.spawn). Rank 0 alone writes the record, after every epoch.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import strategies
from bench.config import RunConfig
from bench.data import CifarTensorDataset, load_split
from bench.device_loader import DeviceLoader
from bench.model import count_parameters, resnet18_cifar
from bench.results import read_record, summarise_epochs, utc_now, write_atomic
from strategies.base import Strategy, cpu_threads_per_process, epoch_sampler


def lr_at(step: int, total_steps: int, warmup_steps: int, peak_lr: float) -> float:
    """Linear warm-up from peak/warmup_steps to peak, then cosine decay to 0, per step."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return 0.5 * peak_lr * (1.0 + math.cos(math.pi * progress))


def global_order_digest(dataset, seed: int, epoch: int, world_size: int, per_rank: int) -> str:
    """SHA-1 of the sequence of global batches (each as a sorted set of sample indices).
    Equal digests mean two runs trained on exactly the same batches in the same order."""
    per_rank_indices = []
    for rank in range(world_size):
        sampler = epoch_sampler(dataset, seed, world_size, rank)
        sampler.set_epoch(epoch)
        per_rank_indices.append(list(sampler))
    steps = len(per_rank_indices[0]) // per_rank
    digest = hashlib.sha1()
    for step in range(steps):
        batch = sorted(
            i for idx in per_rank_indices for i in idx[step * per_rank : (step + 1) * per_rank]
        )
        digest.update(",".join(map(str, batch)).encode() + b";")
    return digest.hexdigest()


PHASE = ["start-up"]  # where this rank is; named in its error report


class Heartbeat:
    """Touches ``scratch/beat-rank{r}`` (with the current phase) at most once a second, so
    the launcher's watchdog can tell a slow rank from a stuck one."""

    def __init__(self, scratch: Path, rank: int) -> None:
        self.path = scratch / f"beat-rank{rank}" if scratch.is_dir() else None
        self.last = 0.0

    def __call__(self, phase: str, force: bool = False) -> None:
        PHASE[0] = phase
        now = time.monotonic()
        if self.path is not None and (force or now - self.last >= 1.0):
            self.last = now
            self.path.write_text(phase)


def parse_fault(text: str | None) -> tuple[str, int, int] | None:
    """``BENCH_FAULT=raise:RANK:STEP`` or ``hang:RANK:STEP`` (a test hook: make that rank
    raise, or stop taking part, before global step STEP)."""
    if not text:
        return None
    kind, rank, step = text.split(":")
    if kind not in ("raise", "hang"):
        raise ValueError(f"BENCH_FAULT kind must be raise or hang, got {kind!r}")
    return kind, int(rank), int(step)


def _inject(fault: tuple[str, int, int], rank: int, step: int) -> None:
    kind, fault_rank, fault_step = fault
    if rank == fault_rank and step == fault_step:
        if kind == "raise":
            raise RuntimeError(f"injected fault (BENCH_FAULT) at step {step}")
        while True:  # hang: never reach the next collective
            time.sleep(60)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _peak_memory(strategy: Strategy) -> int:
    if strategy.device.type == "cuda":
        return max(torch.cuda.max_memory_allocated(d) for d in strategy.process_devices())
    # ru_maxrss is in KiB on Linux: the peak resident set of this process so far.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class EvalShard(Dataset):
    """A rank's test images; ``None`` entries are padding (served, flagged not valid)."""

    def __init__(self, base: Dataset, indices: list[int | None]) -> None:
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        image, label = self.base[0 if index is None else index]
        return image, label, index is not None


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter gathered whole; others as they are. Collective."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _mark(cuda: bool):
    if cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _sync(strategy: Strategy) -> None:
    if strategy.device.type == "cuda":
        for device in strategy.process_devices():
            torch.cuda.synchronize(device)


class Trainer:
    """Builds data, model and optimizer for one rank and runs the epochs."""

    def __init__(self, cfg: RunConfig, strategy: Strategy, spec: dict[str, Any]) -> None:
        self.cfg, self.strategy, self.spec = cfg, strategy, spec
        self.record_path = Path(spec["record_path"])
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", strategy.world_size))
        self.threads = cpu_threads_per_process(local_processes)
        torch.set_num_threads(self.threads)

        torch.manual_seed(cfg.seed)  # identical initial weights for every rank and strategy
        model = resnet18_cifar(width=cfg.width)
        self.num_params = count_parameters(model)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if strategy.device.type == "cuda":
            torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        self.precision = strategy.make_precision(cfg)

        def make_optimizer(params) -> torch.optim.Optimizer:
            impl = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(
                cfg.optimizer_impl, {}
            )
            return torch.optim.SGD(
                params,
                lr=cfg.peak_lr,
                momentum=cfg.momentum,
                nesterov=cfg.nesterov,
                weight_decay=cfg.weight_decay,
                **impl,
            )

        self.model, self.optimizer = strategy.setup_model(model, cfg, make_optimizer)
        self.forward_model = torch.compile(self.model) if cfg.compile else self.model
        self.memory_format = torch.channels_last if cfg.channels_last else torch.preserve_format
        self.criterion = nn.CrossEntropyLoss()

        # Augmentation differs per rank (and per loader worker), deterministically.
        aug_seed = cfg.seed * 1_000_003 + 1 + strategy.rank
        torch.manual_seed(aug_seed)
        self.per_replica_batch = cfg.batch_size // strategy.replicas
        self.per_process_batch = cfg.batch_size // strategy.world_size
        self.micro_batch = self.per_process_batch // cfg.grad_accum
        self.workers = spec["workers_per_process"]
        self.verify = cfg.verify_steps is not None
        train_images = load_split(cfg.data, "train", cfg.data_dir, cfg.seed, cfg.train_limit)
        test_images = load_split(cfg.data, "test", cfg.data_dir, cfg.seed, cfg.test_limit)
        self.train_size, self.test_size = len(train_images), len(test_images)
        eval_batch = max(256, self.per_process_batch)
        eval_indices = strategy.eval_indices(self.test_size)
        if cfg.loader == "gpu":
            self.train_loader = DeviceLoader(
                train_images, strategy.device, self.micro_batch, train=True,
                augment=not self.verify, seed=cfg.seed, world_size=strategy.world_size,
                rank=strategy.rank, aug_seed=aug_seed, channels_last=cfg.channels_last,
            )
            self.sampler = self.train_loader.sampler
            self.test_loader = DeviceLoader(
                test_images, strategy.device, eval_batch, train=False, indices=eval_indices,
                channels_last=cfg.channels_last,
            )
        else:
            pin = strategy.device.type == "cuda"
            train_set = CifarTensorDataset(train_images, augment=not self.verify)
            self.sampler = strategy.train_sampler(train_set, cfg.seed)
            self.train_loader = DataLoader(
                train_set,
                batch_size=self.micro_batch,
                sampler=self.sampler,
                drop_last=True,
                num_workers=self.workers,
                pin_memory=pin,
                persistent_workers=self.workers > 0,
                generator=torch.Generator().manual_seed(aug_seed),
            )
            self.test_loader = DataLoader(
                EvalShard(CifarTensorDataset(test_images, augment=False), eval_indices),
                batch_size=eval_batch,
                shuffle=False,
                num_workers=self.workers,
                pin_memory=pin,
                persistent_workers=self.workers > 0,
            )
        self.steps_per_epoch = len(self.train_loader) // cfg.grad_accum  # optimizer steps
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.warmup_steps = round(cfg.warmup_epochs * self.steps_per_epoch)
        self.record = {}
        if strategy.is_main:
            self.record = (read_record(self.record_path) if self.record_path.exists()
                           else dict(spec["record"]))
            scratch = Path(spec["scratch"])
            if scratch.is_dir():  # tells this machine's launcher that global rank 0 ran here
                (scratch / "rank0-here").touch()
        self.beat = Heartbeat(Path(spec["scratch"]), strategy.rank)
        self.fault = parse_fault(os.environ.get("BENCH_FAULT"))

    # ------------------------------------------------------------------ record (rank 0)
    def _write_record(self) -> None:
        if self.strategy.is_main:
            write_atomic(self.record_path, self.record)

    def _start_record(self) -> None:
        s = self.strategy
        self.record.update(
            {
                "status": "running",
                "world_size": s.replicas,
                "processes": s.world_size,
                "norm": s.norm,
                "precision": self.precision.label,
                # images behind each BatchNorm statistic (one micro-batch per replica, or all)
                "bn_batch_size": self.per_replica_batch // self.cfg.grad_accum
                * (s.replicas if s.norm == "syncbn" else 1),
                "per_rank_batch": self.per_replica_batch,
                "per_process_batch": self.per_process_batch,
                "grad_accum": self.cfg.grad_accum,
                "micro_batch_per_replica": self.per_replica_batch // self.cfg.grad_accum,
                "workers_per_process": self.workers,
                "threads_per_process": self.threads,
                "train_size": self.train_size,
                "test_size": self.test_size,
                "steps_per_epoch": self.steps_per_epoch,
                "warmup_steps": self.warmup_steps,
                "model": {
                    "name": "resnet18-cifar",
                    "width": self.cfg.width,
                    "parameters": self.num_params,
                },
                "notes": self.record.get("notes", []) + s.notes,
                "per_epoch": [],
            }
        )
        self._write_record()

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        s, cfg = self.strategy, self.cfg
        self.sampler.set_epoch(epoch)
        self.model.train()
        step_losses: list[float] = []
        loss_sum = torch.zeros((), device=s.device)
        seen = 0
        if s.device.type == "cuda":
            for device in s.process_devices():
                torch.cuda.reset_peak_memory_stats(device)
        bar = None
        if s.is_main and cfg.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=self.steps_per_epoch, desc=f"epoch {epoch + 1}/{cfg.epochs}",
                leave=False, unit="step", disable=None,
            )
        step = epoch * self.steps_per_epoch
        cuda = s.device.type == "cuda"
        self.beat(f"train epoch {epoch + 1} (waiting for the other ranks)", force=True)
        s.barrier()
        _sync(s)
        start = time.perf_counter()
        # Step boundaries: CUDA events (no host sync) on GPU, the clock on CPU.
        marks: list[Any] = [_mark(cuda)]
        # ---- timed region: no host syncs, no logging collectives ----
        accum = cfg.grad_accum
        step_loss = torch.zeros((), device=s.device)
        for micro, (images, labels) in enumerate(self.train_loader):
            if micro >= self.steps_per_epoch * accum:
                break  # an incomplete group of micro-batches at the end is dropped
            first, last = micro % accum == 0, micro % accum == accum - 1
            if first:
                self.beat(f"train epoch {epoch + 1} step {step + 1}")
                if self.fault:
                    _inject(self.fault, s.rank, step + 1)
                lr = lr_at(step, self.total_steps, self.warmup_steps, cfg.peak_lr)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.zero_grad()  # set_to_none by default (Horovod takes no args)
            images = images.to(s.device, non_blocking=True, memory_format=self.memory_format)
            labels = labels.to(s.device, non_blocking=True)
            # Micro-steps before the last skip the gradient all-reduce (DDP no_sync).
            with contextlib.nullcontext() if last else s.no_sync(self.model):
                with self.precision.autocast():
                    loss = self.criterion(self.forward_model(images), labels)
                s.backward(loss / accum, self.optimizer, self.precision, last=last)
            batch_loss = loss.detach().float() * labels.numel()
            loss_sum += batch_loss
            seen += labels.numel()
            if self.verify:
                step_loss += batch_loss
            if not last:
                continue
            s.step(self.optimizer, self.precision)
            step += 1
            marks.append(_mark(cuda))
            if bar is not None:
                bar.update()
            if self.verify:  # not a timed run: per-step global loss, then stop at K steps
                pair = torch.stack([step_loss, torch.tensor(float(self.per_process_batch),
                                                            device=s.device)])
                s.all_reduce(pair, "sum")
                step_losses.append((pair[0] / pair[1]).item())
                step_loss = torch.zeros((), device=s.device)
                if step >= cfg.verify_steps:
                    break
        _sync(s)
        train_time = time.perf_counter() - start
        # ---- end of timed region ----
        if cuda:
            step_times = [a.elapsed_time(b) / 1000 for a, b in zip(marks, marks[1:])]
        else:
            step_times = [b - a for a, b in zip(marks, marks[1:])]
        self.beat(f"train epoch {epoch + 1} (end)", force=True)
        if bar is not None:
            bar.close()
        totals = torch.stack([loss_sum, torch.tensor(float(seen), device=s.device)])
        s.all_reduce(totals, "sum")
        return {
            "train_time_s": train_time,
            "train_loss": (totals[0] / totals[1]).item(),
            "train_images": int(totals[1].item()),
            "lr_last": lr,
            "step_losses": step_losses,
            "step_time_p50_s": _percentile(step_times, 0.5),
            "step_time_p90_s": _percentile(step_times, 0.9),
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        s = self.strategy
        net = s.eval_module(self.model)
        s.broadcast_buffers(net)
        net.eval()
        totals = torch.zeros(4, device=s.device, dtype=torch.float64)  # top1, top5, n, loss
        _sync(s)
        start = time.perf_counter()
        for batch, (images, labels, valid) in enumerate(self.test_loader):
            self.beat(f"eval batch {batch + 1}")
            images = images.to(s.device, non_blocking=True)
            labels = labels.to(s.device, non_blocking=True)
            valid = valid.to(s.device, non_blocking=True)
            with self.precision.autocast():
                logits = net(images)
            logits = logits.float()
            top5 = logits.topk(5, dim=1).indices
            hits = (top5 == labels[:, None]) & valid[:, None]
            totals[0] += hits[:, 0].sum()
            totals[1] += hits.any(dim=1).sum()
            totals[2] += valid.sum()
            losses = nn.functional.cross_entropy(logits, labels, reduction="none")
            totals[3] += (losses * valid).sum()
        _sync(s)
        eval_time = time.perf_counter() - start
        s.all_reduce(totals, "sum")
        count = int(totals[2].item())
        return {
            "eval_time_s": eval_time,
            "top1": totals[0].item() / count,
            "top5": totals[1].item() / count,
            "test_loss": totals[3].item() / count,
            "test_images": count,
        }

    @torch.no_grad()
    def replicas_identical(self) -> tuple[bool, list[float]]:
        """Whether every rank ends with bit-identical parameters, checked through three
        float64 fingerprints whose max and min over ranks must agree."""
        s = self.strategy
        params = [_full(p.detach()).double().reshape(-1)
                  for p in s.eval_module(self.model).parameters()]
        flat = torch.cat(params)
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
        local = torch.stack([flat.sum(), (flat * flat).sum(), (flat * weights).sum()])
        high, low = local.clone(), -local
        s.all_reduce(high, "max")
        s.all_reduce(low, "max")
        return bool(torch.equal(high, -low)), high.tolist()

    def run_verify(self) -> None:
        """bench verify: K steps, then rank 0 saves per-step losses and final parameters."""
        train = self.train_epoch(0)
        module = getattr(self.model, "module", self.model)  # unwrapped (DP, DDP, apex)
        state = {k: _full(v.detach()).float().cpu() for k, v in module.named_parameters()}
        if self.strategy.is_main:
            out = Path(self.cfg.verify_dir)
            torch.save(state, out / "params.pt")
            (out / "losses.json").write_text(json.dumps({
                "losses": train["step_losses"], "precision": self.precision.label,
                "norm": self.strategy.norm, "world_size": self.strategy.replicas,
                "processes": self.strategy.world_size,
                "grad_accum": self.cfg.grad_accum,
            }))
            self.record.update(status="ok", finished_at=utc_now(), norm=self.strategy.norm,
                               notes=["bench verify run", *self.strategy.notes])
            self._write_record()

    def compile_warm_up(self) -> float | None:
        """With --compile: compile on one batch (forward + backward, no step; BatchNorm
        buffers restored) before the timed epochs. Returns the seconds it took."""
        if not self.cfg.compile:
            return None
        s = self.strategy
        self.beat("compile", force=True)
        module = getattr(self.model, "module", self.model)
        saved = [b.detach().clone() for b in module.buffers()]
        images, labels = next(iter(self.train_loader))[:2]
        images = images.to(s.device, memory_format=self.memory_format)
        labels = labels.to(s.device)
        _sync(s)
        start = time.perf_counter()
        with self.precision.autocast():
            loss = self.criterion(self.forward_model(images), labels)
        s.backward(loss, self.optimizer, self.precision)
        _sync(s)
        seconds = time.perf_counter() - start
        self.optimizer.zero_grad()
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), saved):
                buffer.copy_(value)
        if self.precision.scaler is not None:  # forget the warm-up's scaling state
            self.precision.scaler.update(self.precision.scaler.get_scale())
        return seconds

    def run(self) -> None:
        s, cfg = self.strategy, self.cfg
        if self.verify:
            self.run_verify()
            return
        compile_time = self.compile_warm_up()
        if s.is_main:
            self.record["compile_time_s"] = compile_time
        self._start_record()
        epochs: list[dict[str, Any]] = []
        for epoch in range(cfg.epochs):
            train = self.train_epoch(epoch)
            evaluation = self.evaluate()
            # Peak memory: the largest GPU's max-allocated; on CPU rank 0's peak RSS.
            memory = _peak_memory(s) if (s.device.type == "cuda" or s.is_main) else 0
            times = torch.tensor(
                [train["train_time_s"], evaluation["eval_time_s"], float(memory),
                 train["step_time_p50_s"], train["step_time_p90_s"]],
                device=s.device,
                dtype=torch.float64,
            )
            s.all_reduce(times, "max")  # a step is as slow as the slowest rank
            if not s.is_main:
                continue
            entry = {
                "epoch": epoch + 1,
                "warmup": epoch == 0,
                "train_time_s": times[0].item(),
                "eval_time_s": times[1].item(),
                "images_per_s": train["train_images"] / times[0].item(),
                "train_images": train["train_images"],
                "train_loss": train["train_loss"],
                "test_loss": evaluation["test_loss"],
                "top1": evaluation["top1"],
                "top5": evaluation["top5"],
                "test_images": evaluation["test_images"],
                "peak_mem_bytes": int(times[2].item()),
                "step_time_p50_s": times[3].item(),
                "step_time_p90_s": times[4].item(),
                "lr_last": train["lr_last"],
                "data_order_sha1": global_order_digest(
                    range(self.train_size), cfg.seed, epoch, s.world_size, self.per_process_batch
                ),
            }
            epochs.append(entry)
            self.record["per_epoch"] = epochs
            self.record["summary"] = summarise_epochs(epochs)
            self._write_record()
            print(
                f"[{cfg.strategy}] epoch {epoch + 1}/{cfg.epochs}  "
                f"train {entry['train_time_s']:.2f}s  {entry['images_per_s']:.0f} img/s  "
                f"loss {entry['train_loss']:.3f}  top1 {100 * entry['top1']:.2f}%  "
                f"top5 {100 * entry['top5']:.2f}%",
                flush=True,
            )
        identical, fingerprint = self.replicas_identical()
        if s.is_main:
            self.record["replicas_identical"] = identical
            self.record["param_fingerprint"] = fingerprint
            self.record["status"] = "ok"
            self.record["finished_at"] = utc_now()
            self._write_record()


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def die_with_parent() -> None:
    """Linux: get SIGKILL when the launcher dies, so no rank outlives its run."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def run_rank(spec: dict[str, Any]) -> None:
    """Everything one rank does, whatever started it."""
    cfg = RunConfig.from_dict(spec["config"])
    strategy = strategies.get(cfg.strategy)
    scratch = Path(spec["scratch"])
    if scratch.is_dir():
        (scratch / f"pid-rank{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
    clean = False
    try:
        strategy.setup(cfg, spec["device_type"])
        trainer = Trainer(cfg, strategy, spec)
        trainer.run()
        # The DDP wrapper must be gone before its process group is destroyed: gloo aborts
        # the process now and then otherwise ("terminate called without an active exception").
        del trainer
        gc.collect()
        clean = True
    except BaseException as exc:
        rank = os.environ.get("RANK", str(strategy.rank))
        line = _error_line(exc)
        if "timed out" in line.lower() or "timeout" in line.lower():
            line = f"timeout: {line}"
        if scratch.is_dir():
            (scratch / f"error-rank{rank}.txt").write_text(
                f"{line} [in {PHASE[0]}]\n" + traceback.format_exc()
            )
        raise
    finally:
        strategy.teardown(clean)


def load_spec(path: str | Path) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # torch.distributed.launch (legacy) passes --local-rank=N / --local_rank=N unless --use-env.
    spec_path = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(("--local-rank", "--local_rank")):
            value = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
            i += 0 if "=" in arg else 1
            os.environ["LOCAL_RANK"] = value
            os.environ["BENCH_LOCAL_RANK_ARG"] = arg if "=" in arg else f"{arg} {value}"
        else:
            spec_path = arg
        i += 1
    if spec_path is None:
        raise SystemExit("usage: python -m bench.worker SPEC.json (started by `bench run`)")
    die_with_parent()
    run_rank(load_spec(spec_path))


if __name__ == "__main__":
    main()
