"""One typed, validated configuration for a run; every field lands in the record."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.config.strategy_parts import (
    ApexOptions,
    DDPOptions,
    Features,
    FSDPOptions,
    HorovodOptions,
    StrategyOptions,
    host_slots,
)
from bench.tools.errors import ConfigError

DATASETS = ("cifar100", "synthetic", "imagefolder")
PRECISIONS = ("fp32", "fp16", "bf16")
APEX_OPT_LEVELS = ("O0", "O1", "O2", "O3")
APEX_DDP = ("apex", "torch")
HVD_COMPRESSION = ("none", "fp16")
DDP_COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
LOADERS = ("torch", "gpu")
GPU_LOADER_WORKERS = 4  # --workers per GPU by default (fewer where cores are short); 0 on CPU
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
# DDP's buckets, in MB: 1 TiB holds any model's gradients in one bucket; beyond 10^300 the
# bytes DDP counts them in were infinite, and every rank failed on building the model
MAX_BUCKET_CAP_MB = 2**20
# torch.compile modes; reduce-overhead and max-autotune replay CUDA graphs on a GPU
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TF32 = ("on", "off")
BACKENDS = ("nccl", "gloo")
SYNTHETIC_DIFFICULTY = 1.0  # default: accuracy does not saturate (top-1 capped near 70 %)
REFERENCE_BATCH = 128  # the lr is given for this global batch and scaled linearly from it


def check_timeout(seconds: float) -> None:
    """--timeout: positive seconds, at most a week (bench run and bench probe)."""
    if not seconds > 0:
        raise ConfigError(f"--timeout must be positive seconds (got {seconds})")
    if seconds > 7 * 24 * 3600:
        raise ConfigError(f"--timeout must be at most a week in seconds (got {seconds})")


def check_rendezvous(nodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    """--node-rank within --nodes, and --rdzv-endpoint HOST:PORT with a real port (bench
    run and bench probe)."""
    if not 0 <= node_rank < nodes:
        raise ConfigError(f"--node-rank must lie in 0..{nodes - 1} for --nodes {nodes} "
                          f"(got {node_rank})")
    if rdzv_endpoint is not None and not (
            re.fullmatch(r"[^:\s]+:\d+", rdzv_endpoint)
            and 1 <= int(rdzv_endpoint.rsplit(":", 1)[1]) <= 65535):
        raise ConfigError(f"--rdzv-endpoint must be HOST:PORT, the port in 1..65535 "
                          f"(got {rdzv_endpoint!r})")


def default_data_dir() -> Path:
    """Where CIFAR-100 is cached: ``$BENCH_DATA_DIR`` or the user cache directory."""
    if os.environ.get("BENCH_DATA_DIR"):
        return Path(os.environ["BENCH_DATA_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "parallel-bench" / "cifar100"


# How long a rank's --compile warm-up may take (ranks compile at their own speed; the first
# waits in the warm-up's collectives for the last). While it lasts the rank beats, and the
# process group's collectives may wait this long; past it the run ends as a timeout "in
# compile". Training's collectives stay bounded by --timeout through the heartbeat watchdog.
COMPILE_LIMIT_S = 1800.0


def group_timeout(timeout: float, compile_: bool, processes: int) -> float:
    """Seconds a collective of the process group may wait: --timeout, or the compile limit
    where ranks compile (a rank that compiles 5 minutes longer than its peer is not stuck)."""
    return max(timeout, COMPILE_LIMIT_S) if compile_ and processes > 1 else timeout


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Same config, same work, whatever the strategy.

    Frozen: validated once, never changed. Where the plan resolves a default (precision,
    Slurm's node count, the rendezvous id) it derives a new config with ``derive``."""

    strategy: str
    gpus: int = 1
    cpu: bool = False
    epochs: int = 30
    batch_size: int = 128  # global: split evenly over all replicas
    # Set by `bench sweep --batch-size max`: the memory in which `bench fit` found
    # batch_size the largest that trains ("6 GiB on CPU"); None: a batch given
    batch_fits_in: str | None = None
    base_lr: float = 0.1  # lr at the reference global batch of 128
    lr: float | None = None  # explicit peak lr; None = base_lr * batch_size / 128
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0  # linear warm-up, then cosine decay to 0 (per step)
    data: str = "cifar100"
    synthetic_difficulty: float = SYNTHETIC_DIFFICULTY  # 0 = the easy set; see synthetic_split
    synthetic_classes: int = 100  # the synthetic set's classes (CIFAR-100's count by default)
    image_size: int | None = None  # pixels per side; None = the model's (32 CIFAR, 224 torchvision)
    data_dir: str = field(default_factory=lambda: str(default_data_dir()))
    download: bool = True
    train_limit: int | None = None
    test_limit: int | None = None
    seed: int = 0
    workers: int | None = None  # loader workers per replica (GPU or CPU process)
    model: str = "resnet18-cifar"  # models.registry: resnet18-cifar | torchvision:NAME | mod:fn
    width: float = 1.0  # channel multiplier of ResNet-18; 1.0 is the real model
    precision: str | None = None  # None: the strategy's default (fp32; ddp-amp: fp16/bf16)
    apex_opt_level: str = "O1"
    apex_ddp: str = "apex"  # which DDP wraps the apex model: apex.parallel or torch
    hvd_compression: str = "none"  # Horovod gradient compression: none | fp16
    loader: str = "torch"  # torch: DataLoader + per-image transforms; gpu: on-device batches
    channels_last: bool = False
    compile: bool = False  # torch.compile; compile time measured apart from epoch time
    compile_mode: str = "default"  # torch.compile mode (COMPILE_MODES)
    optimizer_impl: str = "default"  # SGD implementation: default | foreach | fused
    cudnn_benchmark: bool = True
    tf32: str | None = None  # on | off; None = torch's default (cuDNN convolutions in TF32)
    nodes: int = 1  # machines; each runs the same command (torchrun c10d rendezvous)
    node_rank: int = 0  # this machine's index; node 0 closes the record after a failure
    rdzv_endpoint: str | None = None  # HOST:PORT of the c10d rendezvous (nodes > 1)
    rdzv_id: str | None = None  # the same on every node; default derived from the command
    backend: str | None = None  # nccl | gloo; None = nccl on CUDA, gloo on CPU
    max_restarts: int = 0  # torchrun --max-restarts
    hosts: str | None = None  # horovod across machines: host1:4,host2:4
    use_slurm: bool = True  # inside `srun`, take rank / world size from Slurm
    grad_accum: int = 1  # micro-steps per optimizer step; batch_size stays the effective batch
    target_top1: float | None = None  # percent: record the time to the first eval at/above it
    stop_at_target: bool = False  # end the run there (MLPerf style)
    mllog: str | None = None  # MLPerf-format event log (rank 0; {run_id} in the name)
    comm_probe_steps: int = 20  # compute-only steps after the epochs (multi-rank; 0: none)
    loader_probe_steps: int = 30  # input batches drawn alone after the epochs (0: none)
    profile_steps: int = 0  # torch.profiler trace of this many steps after the epochs
    # DDP's knobs (torch defaults)
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    cpu_syncbn: bool = False  # --cpu-syncbn: DDPOptions.cpu_syncbn
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    ddp_comm_hook: str = "none"  # DDP gradient compression: none | fp16 | bf16 | powersgd
    powersgd_rank: int = 1
    reshard_after_forward: bool = True  # fsdp: False keeps parameters gathered for backward
    syncbn: bool = True  # SyncBatchNorm where the strategy and device support it
    # --ghost-bn G: BatchNorm's training statistics over each G images of a replica's
    # micro-batch (bench/models/ghost_batchnorm.py); None: over the whole micro-batch
    ghost_bn: int | None = None
    output: str = "results"
    master_port: int | None = None
    timeout: float = 300.0  # seconds a collective (or a wait for a loader batch) may take
    progress: bool = True
    tag: str | None = None  # free-form label stored in the record (bench sweep sets it)
    # bench verify: train this many steps without augmentation and
    # write per-step losses and final parameters to verify_dir.
    verify_steps: int | None = None
    verify_dir: str | None = None
    verify_float64: bool = False  # model, data and loss in float64 (fp32 strategies)

    @property
    def strategy_options(self) -> StrategyOptions:
        return StrategyOptions(
            ddp=DDPOptions(
                bucket_cap_mb=self.bucket_cap_mb,
                gradient_as_bucket_view=self.gradient_as_bucket_view,
                static_graph=self.static_graph,
                find_unused_parameters=self.find_unused_parameters,
                broadcast_buffers=self.broadcast_buffers,
                comm_hook=self.ddp_comm_hook,
                powersgd_rank=self.powersgd_rank,
                cpu_syncbn=self.cpu_syncbn,
            ),
            fsdp=FSDPOptions(reshard_after_forward=self.reshard_after_forward),
            apex=ApexOptions(opt_level=self.apex_opt_level, ddp=self.apex_ddp),
            horovod=HorovodOptions(compression=self.hvd_compression),
        )

    @property
    def features(self) -> Features:
        return Features(precision=self.precision or "fp32", grad_accum=self.grad_accum,
                        channels_last=self.channels_last, optimizer_impl=self.optimizer_impl,
                        compile=self.compile)

    def derive(self, **changes: Any) -> RunConfig:
        """A new, validated config with some fields changed; this one stays as it is."""
        derived = dataclasses.replace(self, **changes)
        derived.validate()
        return derived

    @property
    def input_size(self) -> int:
        """The images' side in pixels: ``--image-size``, else the model's default."""
        from bench.models.registry import default_image_size

        return self.image_size or default_image_size(self.model)

    @property
    def peak_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        return self.base_lr * self.batch_size / REFERENCE_BATCH

    def validate(self) -> None:
        """Checks that need no knowledge of the machine. Raises ConfigError."""
        for f in dataclasses.fields(self):  # nan and inf never reach a run or a record
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{f.name.replace('_', '-')} must be a finite number "
                                  f"(got {value})")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"--seed must lie in 0..{2**32 - 1} (got {self.seed})")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay must be 0 or more (got {self.weight_decay})")
        check_timeout(self.timeout)
        if self.gpus < 1:
            raise ConfigError(f"--gpus must be at least 1 (got {self.gpus})")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be at least 1 (got {self.epochs})")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1 (got {self.batch_size})")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"--lr must be positive (got {self.lr})")
        if not self.base_lr > 0:
            raise ConfigError(f"--base-lr must be positive (got {self.base_lr})")
        if self.warmup_epochs < 0 or self.warmup_epochs > self.epochs:
            raise ConfigError(
                f"--warmup-epochs must lie between 0 and --epochs ({self.epochs}), "
                f"got {self.warmup_epochs}"
            )
        if self.data not in DATASETS:
            raise ConfigError(f"--data must be one of {', '.join(DATASETS)} (got {self.data!r})")
        for name in ("train_limit", "test_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be at least 1 (got {value})")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"--workers must be 0 or more (got {self.workers})")
        if not 0 <= self.synthetic_difficulty <= 1:
            raise ConfigError("--synthetic-difficulty must lie in [0, 1] (got "
                              f"{self.synthetic_difficulty})")
        if self.image_size is not None and not 8 <= self.image_size <= 1024:
            raise ConfigError(f"--image-size must lie in 8..1024 pixels (got {self.image_size})")
        if not 2 <= self.synthetic_classes <= 100_000:
            raise ConfigError(f"--synthetic-classes must lie in 2..100000 (got "
                              f"{self.synthetic_classes})")
        if self.synthetic_classes != 100 and self.data != "synthetic":
            raise ConfigError("--synthetic-classes applies to --data synthetic; the classes of "
                              f"--data {self.data} are its own")
        if self.data == "imagefolder" and Path(self.data_dir) == default_data_dir():
            raise ConfigError("--data imagefolder needs --data-dir DIR: the folder of your "
                              "images, as DIR/train/CLASS/*.jpg and DIR/val/CLASS/*.jpg")
        if self.data == "imagefolder" and self.loader == "gpu":
            raise ConfigError("--loader gpu holds a set of fixed-size images; an ImageFolder is "
                              "decoded per image: use --loader torch")
        if not 0 < self.width <= 4:
            raise ConfigError(f"--width must lie in (0, 4] (got {self.width})")
        from bench.models.registry import check_model

        check_model(self.model, self.width)
        for flag, value, allowed in (
            ("--precision", self.precision, (None, *PRECISIONS)),
            ("--apex-opt-level", self.apex_opt_level, APEX_OPT_LEVELS),
            ("--apex-ddp", self.apex_ddp, APEX_DDP),
            ("--hvd-compression", self.hvd_compression, HVD_COMPRESSION),
            ("--ddp-comm-hook", self.ddp_comm_hook, DDP_COMM_HOOKS),
            ("--loader", self.loader, LOADERS),
            ("--optimizer-impl", self.optimizer_impl, OPTIMIZER_IMPLS),
            ("--compile", self.compile_mode, COMPILE_MODES),
            ("--tf32", self.tf32, (None, *TF32)),
            ("--backend", self.backend, (None, *BACKENDS)),
        ):
            if value not in allowed:
                names = ", ".join(a for a in allowed if a)
                raise ConfigError(f"{flag} must be one of {names} (got {value!r})")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ConfigError(f"--master-port must lie in 1..65535 (got {self.master_port})")
        if self.nodes < 1:
            raise ConfigError(f"--nodes must be at least 1 (got {self.nodes})")
        check_rendezvous(self.nodes, self.node_rank, self.rdzv_endpoint)
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be 0 or more (got {self.max_restarts})")
        if self.hosts is not None and not (
                re.fullmatch(r"[^:,\s]+:\d+(,[^:,\s]+:\d+)*", self.hosts)
                and min(host_slots(self.hosts)) >= 1):
            raise ConfigError(f"--hosts must look like host1:4,host2:4, each with 1 slot or "
                              f"more (got {self.hosts!r})")
        if self.grad_accum < 1:
            raise ConfigError(f"--grad-accum must be at least 1 (got {self.grad_accum})")
        if self.ghost_bn is not None and self.ghost_bn < 1:
            raise ConfigError(f"--ghost-bn takes the images a group holds, 1 or more (got "
                              f"{self.ghost_bn})")
        if self.ghost_bn is not None and self.cpu_syncbn:
            raise ConfigError("--ghost-bn keeps BatchNorm's statistics per group of a "
                              "replica's images, --cpu-syncbn over the global batch: drop one")
        if not 1 <= self.powersgd_rank <= 64:
            raise ConfigError(f"--powersgd-rank must lie in 1..64 (got {self.powersgd_rank})")
        if self.powersgd_rank != 1 and self.ddp_comm_hook != "powersgd":
            raise ConfigError("--powersgd-rank needs --ddp-comm-hook powersgd")
        if not 0 < self.bucket_cap_mb <= MAX_BUCKET_CAP_MB:  # DDP makes it whole bytes
            raise ConfigError(f"--bucket-cap-mb must lie in (0, {MAX_BUCKET_CAP_MB}] (got "
                              f"{self.bucket_cap_mb}): any bucket beyond the gradients is one")
        if self.target_top1 is not None and not 0 < self.target_top1 <= 100:
            raise ConfigError(f"--target-top1 is a percentage in (0, 100] (got "
                              f"{self.target_top1})")
        if self.cpu and self.backend == "nccl":
            raise ConfigError("--backend nccl needs CUDA GPUs; drop it with --cpu (gloo)")
        if self.cpu and (self.tf32 is not None or not self.cudnn_benchmark):
            # each switched nothing on CPU, while the run's command line (and a sweep's
            # key) said it had
            flag = "--tf32" if self.tf32 is not None else "--no-cudnn-benchmark"
            raise ConfigError(f"{flag} is a CUDA switch (cuDNN, TF32 on Ampere+ GPUs) and "
                              "changes nothing on CPU: drop it with --cpu")
        if self.profile_steps < 0:
            raise ConfigError(f"--profile-steps must be 0 or more (got {self.profile_steps})")
        if self.comm_probe_steps < 0:
            raise ConfigError(f"--comm-probe-steps must be 0 or more (got "
                              f"{self.comm_probe_steps})")
        if self.loader_probe_steps < 0:
            raise ConfigError(f"--loader-probe-steps must be 0 or more (got "
                              f"{self.loader_probe_steps})")
        if self.stop_at_target and self.target_top1 is None:
            raise ConfigError("--stop-at-target needs --target-top1 P")

    def check_batch_split(self, replicas: int) -> int:
        """Per-replica batch; the global batch must split evenly over the replicas and, with
        --grad-accum K, each replica's share over K micro-batches."""
        parts = replicas * self.grad_accum
        if self.batch_size % parts:
            lower = self.batch_size - self.batch_size % parts
            what = f"{replicas} replicas" + (
                f" x {self.grad_accum} micro-batches" if self.grad_accum > 1 else ""
            )
            raise ConfigError(
                f"--batch-size {self.batch_size} does not split evenly over {what}; "
                f"use a multiple of {parts}, e.g. --batch-size {max(lower, parts)}"
            )
        return self.batch_size // replicas

    def check_ghost_bn(self, micro_batch: int, syncs_batchnorm: bool) -> None:
        """--ghost-bn G needs each replica's micro-batch to split into groups of G, and
        BatchNorm per replica: ``syncs_batchnorm`` says the strategy, on this device and
        number of replicas, would use SyncBatchNorm (whose statistics span the replicas)
        unless --no-syncbn."""
        if self.ghost_bn is None:
            return
        if micro_batch % self.ghost_bn:
            raise ConfigError(
                f"--ghost-bn {self.ghost_bn} does not split a replica's micro-batch of "
                f"{micro_batch} images into whole groups; use a divisor of {micro_batch}")
        if syncs_batchnorm and self.syncbn:
            raise ConfigError("--ghost-bn keeps BatchNorm's statistics per group of a "
                              "replica's images, SyncBatchNorm over the replicas: add "
                              "--no-syncbn")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
