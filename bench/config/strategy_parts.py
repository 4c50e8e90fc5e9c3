"""What a strategy is handed instead of the whole run config (as Lightning Fabric hands a
strategy typed pieces): its own options, where the run's ranks go (``Topology``), and the
run-wide choices it may have to refuse (``Features``). ``RunConfig`` builds each of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def host_slots(hosts: str) -> list[int]:
    """The slots of each host of ``--hosts host1:4,host2:4`` (horovodrun's -H)."""
    return [int(h.rsplit(":", 1)[1]) for h in hosts.split(",")]


@dataclass(frozen=True)
class DDPOptions:
    """DistributedDataParallel's tuning knobs (torch's defaults); recorded as ``ddp_options``."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    comm_hook: str = "none"  # none | fp16 | bf16 | powersgd: DDP's gradient compression
    powersgd_rank: int = 1  # PowerSGD's matrix approximation rank
    # CPU ranks: BatchNorm over the global batch (strategies/cpu_syncbn.py), as SyncBatchNorm
    # does on GPUs; torch's needs an accelerator, so CPU ranks otherwise normalise per replica
    cpu_syncbn: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ApexOptions:
    """NVIDIA apex AMP: the opt level and which DDP wraps the apex model."""

    opt_level: str = "O1"
    ddp: str = "apex"  # apex.parallel.DistributedDataParallel, or torch's ("torch")


@dataclass(frozen=True)
class HorovodOptions:
    """Horovod's own choices."""

    compression: str = "none"  # gradient compression on the wire: none | fp16


@dataclass(frozen=True)
class FSDPOptions:
    """FSDP2's own choice: free the gathered parameters after forward (ZeRO-3) or keep them
    until backward (ZeRO-2-like: less communication, more memory)."""

    reshard_after_forward: bool = True


@dataclass(frozen=True)
class StrategyOptions:
    """Each strategy's own options; the registry hands every strategy the part that is its."""

    ddp: DDPOptions = field(default_factory=DDPOptions)
    apex: ApexOptions = field(default_factory=ApexOptions)
    horovod: HorovodOptions = field(default_factory=HorovodOptions)
    fsdp: FSDPOptions = field(default_factory=FSDPOptions)


@dataclass(frozen=True)
class Topology:
    """Where a run's ranks go, as the plan resolved it; the same for every rank. What a
    strategy needs to validate a run, count its processes and join its group."""

    device_type: str  # cuda | cpu
    gpus: int = 1  # GPUs (CPU processes with --cpu) asked for on each machine
    nodes: int = 1
    hosts: str | None = None  # horovodrun -H host1:4,host2:4
    rdzv_endpoint: str | None = None
    under_srun: bool = False  # this process is one task of an srun step
    timeout: float = 300.0  # seconds a collective may wait
    backend: str = "gloo"  # process-group backend: nccl (CUDA default) | gloo
    gpu_shared: bool = False  # more ranks than GPUs on a machine (gloo): correctness only


@dataclass(frozen=True)
class Features:
    """The run-wide choices a strategy may have to refuse (some combinations cannot work)."""

    precision: str
    grad_accum: int = 1
    channels_last: bool = False
    optimizer_impl: str = "default"
    compile: bool = False
