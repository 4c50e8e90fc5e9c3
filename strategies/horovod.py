"""Horovod: ranks started by ``horovodrun`` (Gloo controller), gradients averaged by
``hvd.DistributedOptimizer``. This is the only module that imports horovod."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

from bench.config.strategy_parts import Features, HorovodOptions, Topology, host_slots
from bench.tools.errors import ConfigError
from strategies.base import Strategy, SyncOff
from strategies.ddp import gpu_index
from strategies.precision import Precision

BUILD_HINT = "build it for the installed torch with `make horovod` (see docs/gpus.md, 'Horovod')"


def horovodrun_command() -> list[str]:
    """horovodrun next to this Python (the venv), else on PATH, else Horovod's launcher module
    run by this Python (an install with ``pip --target`` or ``--user`` has no script on PATH)."""
    beside = Path(sys.executable).parent / "horovodrun"
    found = str(beside) if beside.exists() else shutil.which("horovodrun")
    return [found] if found else [sys.executable, "-m", "horovod.runner.launch"]


class HorovodStrategy(Strategy):
    launcher = "horovodrun"
    summary = "Horovod DistributedOptimizer (horovodrun --gloo)"
    own_options = frozenset({"horovod"})

    def __init__(self, name: str, *, options: HorovodOptions | None = None,
                 launcher: str | None = None) -> None:
        super().__init__(name, launcher=launcher)
        self.options = options or HorovodOptions()
        self.sync_off = False  # inside gradient_sync_off

    def num_processes(self, topology: Topology) -> int:
        return self.num_replicas(topology)

    def num_replicas(self, topology: Topology) -> int:
        if topology.hosts:  # horovodrun -np = all slots of all hosts
            return sum(host_slots(topology.hosts))
        return topology.gpus

    def check(self, topology: Topology, features: Features) -> None:
        if topology.nodes > 1:
            raise ConfigError("horovod spans machines with --hosts host1:4,host2:4, not --nodes")

    def requires(self, device_type: str, backend: str | None = None) -> str | None:
        try:
            import horovod.torch as hvd
        except Exception as exc:  # ImportError, or a stale build that no longer loads
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return f"horovod.torch cannot be imported ({text}); {BUILD_HINT}"
        if not hvd.gloo_built():
            return f"this Horovod was built without Gloo; {BUILD_HINT}"
        if device_type == "cuda" and backend != "gloo" and not hvd.nccl_built():
            return (
                "this Horovod was built without NCCL GPU operations; "
                f"{BUILD_HINT} on this GPU machine (or --backend gloo: CUDA tensors through "
                "host memory)"
            )
        if device_type == "cuda" and backend == "gloo" and hvd.nccl_built():
            return ("this Horovod sends CUDA tensors over NCCL (built with NCCL GPU "
                    "operations); --backend gloo needs a build without them: "
                    "HOROVOD_BUILD_MODE=cpu make horovod")
        return None

    def setup(self, topology: Topology) -> None:
        import horovod.torch as hvd

        hvd.init()
        self.hvd = hvd
        self.rank, self.world_size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.replicas = self.world_size
        if topology.device_type == "cuda":
            index = gpu_index(self.local_rank, torch.cuda.device_count(),
                              shared=topology.gpu_shared)
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)

    def wrap_model(self, model: nn.Module, *, syncbn: bool, precision: Precision) -> nn.Module:
        model = self.apply_norm(
            model, syncbn, lambda m: _convert_to_hvd_syncbn(m, self.hvd.SyncBatchNorm),
            "hvd.SyncBatchNorm is CUDA-only",
        )
        return model.to(self.device)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module, *,
                       grad_accum: int) -> torch.optim.Optimizer:
        hvd = self.hvd
        compression = hvd.Compression.fp16 if self.options.compression == "fp16" else (
            hvd.Compression.none
        )
        self.notes.append(f"Horovod gradient compression: {self.options.compression}")
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            op=hvd.Average,
            backward_passes_per_step=grad_accum,
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # No hvd.broadcast_optimizer_state: every rank built the same fresh optimizer, and on an
        # empty state Horovod 0.28.1 fills it by a zero-gradient step(), which with weight
        # decay and momentum moves every weight before step 1 (seen by bench verify).
        return optimizer

    def backward(self, loss, optimizer, precision: Precision, last: bool = True) -> None:
        # With backward_passes_per_step=K Horovod starts the all-reduce on the K-th pass.
        precision.backward(loss)

    def gradient_sync_off(self, model: nn.Module, optimizer) -> SyncOff | str:
        note = "still communicating with sync off: hvd.SyncBatchNorm statistics" if (
            self.norm == "syncbn") else None
        return SyncOff(self._allreduce_off(optimizer), note)

    @contextlib.contextmanager
    def _allreduce_off(self, optimizer):
        """Horovod starts a parameter's all-reduce when its backward count reaches
        ``backward_passes_per_step``: set that out of reach, and step without synchronize()
        (which would all-reduce what is missing)."""
        passes = optimizer.backward_passes_per_step
        optimizer.set_backward_passes_per_step(2**30)
        self.sync_off = True
        try:
            with optimizer.skip_synchronize():
                yield
        finally:
            self.sync_off = False
            optimizer.set_backward_passes_per_step(passes)

    def step(self, optimizer, precision: Precision) -> None:
        if self.sync_off:
            precision.step(optimizer)  # inside skip_synchronize: the local gradients
            return
        if precision.scaler is None:
            optimizer.step()  # waits for the averaged gradients
            return
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            precision.step(optimizer)  # the scaler's step and update, skipped steps counted

    def discard_gradients(self, optimizer) -> None:
        # Horovod refuses zero_grad() between backward and step: finish the all-reduces it
        # started (every rank does), then clear.
        optimizer.synchronize()
        optimizer.zero_grad()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        # hvd.allreduce averages by default: ask for Sum / Max explicitly.
        hvd_op = {"sum": self.hvd.Sum, "max": self.hvd.Max}[op]
        self.hvd.allreduce_(tensor, op=hvd_op)
        return tensor

    def broadcast_buffers(self, model: nn.Module) -> None:
        for name, buffer in model.named_buffers():
            self.hvd.broadcast_(buffer, root_rank=0, name=f"buffer.{name}")

    def barrier(self) -> None:
        self.hvd.barrier()

    def teardown(self, clean: bool = True) -> None:
        hvd = getattr(self, "hvd", None)
        if hvd is not None and hvd.is_initialized():
            if clean:
                hvd.barrier()
            hvd.shutdown()


def _convert_to_hvd_syncbn(module: nn.Module, sync_bn_cls) -> nn.Module:
    """Replace every BatchNorm2d by hvd.SyncBatchNorm, keeping its parameters and stats."""
    if isinstance(module, nn.BatchNorm2d):
        new = sync_bn_cls(module.num_features, module.eps, module.momentum, module.affine,
                          module.track_running_stats)
        new.load_state_dict(module.state_dict())
        return new
    for name, child in module.named_children():
        setattr(module, name, _convert_to_hvd_syncbn(child, sync_bn_cls))
    return module
