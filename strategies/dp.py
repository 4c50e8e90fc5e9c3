"""``nn.DataParallel``: one process drives N GPUs; replicas are re-created every step."""

from __future__ import annotations

import torch
from torch import nn

from bench.config.strategy_parts import Features, Topology
from bench.tools.errors import ConfigError
from strategies.base import Strategy, has_batchnorm
from strategies.precision import Precision


class DataParallelStrategy(Strategy):
    launcher = "inline"
    summary = "nn.DataParallel, one process over N GPUs (one replica on CPU)"
    syncs_batchnorm = False  # its replicas normalise alone (no SyncBatchNorm in it)

    def num_processes(self, topology: Topology) -> int:
        return 1

    def num_replicas(self, topology: Topology) -> int:
        # Without CUDA nn.DataParallel does nothing: the model runs once, on the CPU.
        return topology.gpus if topology.device_type == "cuda" else 1

    def fewer_replicas(self, topology: Topology) -> str | None:
        if self.num_replicas(topology) == topology.gpus:
            return None
        return (f"nn.DataParallel has no effect without CUDA: asked for {topology.gpus}, one "
                "CPU replica runs in one process")

    def setup(self, topology: Topology) -> None:
        self.replicas = self.num_replicas(topology)
        if topology.device_type == "cuda":
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        fewer = self.fewer_replicas(topology)
        if fewer:
            self.notes.append(fewer)

    def check(self, topology: Topology, features: Features) -> None:
        if topology.nodes > 1 or topology.hosts:
            raise ConfigError(
                "dp runs in one process on one machine and cannot use --nodes/--hosts; "
                "use --strategy ddp"
            )
        if topology.gpu_shared:
            raise ConfigError("dp puts one replica on each GPU and cannot share one; use "
                              "--gpus at most the GPUs visible, or ddp with --backend gloo")
        if features.compile and topology.device_type == "cuda" and topology.gpus > 1:
            # torch.compile breaks its graph at DataParallel's scatter, replicate and
            # threads: the record would say "compiled" of a run that mostly was not.
            raise ConfigError("dp --compile on more than one GPU: torch.compile cannot trace "
                              "nn.DataParallel's replicas (its graph breaks at scatter and "
                              "its threads); use ddp --compile, or dp on one GPU")

    def process_group_backend(self, topology: Topology) -> str | None:
        return None  # one process, no process group

    def process_devices(self) -> list[torch.device]:
        if self.device.type == "cuda":
            return [torch.device("cuda", i) for i in range(self.replicas)]
        return [self.device]

    def wrap_model(self, model: nn.Module, *, syncbn: bool, precision: Precision) -> nn.Module:
        model = model.to(self.device)
        if not has_batchnorm(model):
            self.no_batchnorm(model)
        else:  # SyncBatchNorm under DataParallel silently acts per replica: plain BN, said
            self.norm = "per-replica-bn"
            if self.replicas > 1:
                self.notes.append("BatchNorm statistics are per replica (DataParallel has no "
                                  "SyncBN)")
        device_ids = list(range(self.replicas)) if self.device.type == "cuda" else None
        if precision.dtype is not None and self.replicas > 1:
            autocast_in_replicas(model, self.device.type, precision.dtype)
            self.notes.append(f"autocast {precision.name} re-entered in every replica thread")
        return nn.DataParallel(model, device_ids=device_ids)


def autocast_in_replicas(model: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """nn.DataParallel's replica threads re-enter autocast with ``enabled`` only, not the
    dtype, so on CUDA they fall back to fp16 (without a scaler) under a bf16 run. Give the
    model's class a forward that enters autocast with the run's dtype itself; replicas are
    made with the same class, and parameter names do not change."""
    base = type(model)

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type=device_type, dtype=dtype):
            return base.forward(self, *args, **kwargs)

    model.__class__ = type(f"{base.__name__}AutocastReplicas", (base,), {"forward": forward})
