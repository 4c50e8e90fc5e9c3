"""The strategy interface: what happens inside one rank. How ranks are started is the
launcher's business (``bench/launch/launchers.py``); a strategy only names its launcher."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DistributedSampler

from bench.config.strategy_parts import Features, Topology
from bench.tools.cores import usable_cores
from strategies.precision import Precision

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class SyncOff:
    """A context in which whole training steps send no gradients (the compute-only probe
    after the timed epochs), and what still communicates inside it, for the record."""

    context: contextlib.AbstractContextManager
    note: str | None = None


class Strategy:
    """Base class. Subclasses set ``launcher`` and ``summary`` and override what differs.

    A strategy is built by the registry with its own options (never the whole config); every
    hook receives the run-wide values it needs as arguments."""

    launcher: str = "inline"
    summary: str = ""
    # the parts of StrategyOptions it honours (ddp, apex, horovod, fsdp): the flags of the
    # others change nothing here, so bench run refuses them (bench.launch.preflight)
    own_options: frozenset[str] = frozenset()
    collective_forward = False  # True when every forward is a collective (FSDP)
    replicates_parameters = True  # every rank holds all parameters (False: sharded, FSDP)
    syncs_batchnorm = True  # SyncBatchNorm on GPUs unless --no-syncbn (False: DataParallel)

    def __init__(self, name: str, *, launcher: str | None = None,
                 summary: str | None = None) -> None:
        self.name = name
        if launcher is not None:
            self.launcher = launcher
        if summary is not None:
            self.summary = summary
        self.rank = 0
        self.local_rank = 0
        self.world_size = 1  # processes taking part in the run
        self.replicas = 1  # model replicas the global batch is split over
        self.device = torch.device("cpu")
        self.norm = "per-replica-bn"
        self.notes: list[str] = []
        # BENCH_SLOW_COMM_MS (a test hook): a wait before each gradient bucket's all-reduce,
        # honoured by strategies that wrap the model in torch's DDP
        self.bucket_delay_s = 0.0

    # ---- in the launching process -------------------------------------------------------
    def requires(self, device_type: str, backend: str | None = None) -> str | None:
        """Why this strategy cannot run here (missing dependency, no CUDA...), or None.
        ``backend``: the run's process-group backend, where it matters (None: the default)."""
        return None

    def process_group_backend(self, topology: Topology) -> str | None:
        """The backend its collectives use, for the record (None: no process group)."""
        return topology.backend

    def check(self, topology: Topology, features: Features) -> None:
        """Strategy-specific validation of a run; raises ConfigError."""

    def default_precision(self, device_type: str) -> str:
        return "fp32"

    def num_processes(self, topology: Topology) -> int:
        """Ranks the launcher starts on this machine."""
        return topology.gpus

    def num_replicas(self, topology: Topology) -> int:
        """Model replicas over which the global batch is split (all machines)."""
        return topology.gpus * topology.nodes

    def fewer_replicas(self, topology: Topology) -> str | None:
        """Why this strategy runs fewer replicas than --gpus asks (None: it does not): the
        terminal says it as the run starts, the record's notes keep it."""
        return None

    @property
    def runs_as_srun_task(self) -> bool:
        """Whether one rank can be one ``srun`` task (ranks found through the environment)."""
        return self.launcher == "torchrun"

    def precision_label(self, precision: str) -> str:
        """What the record calls this run's precision."""
        return precision

    def record_options(self) -> dict | None:
        """This strategy's own options as the record's ``ddp_options`` shows them."""
        return None

    # ---- inside a rank ------------------------------------------------------------------
    def setup(self, topology: Topology) -> None:
        """Join the group (if any) and pick this rank's device."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def make_precision(self, precision: str) -> Precision:
        """Autocast and loss scaling, chosen once per run."""
        return Precision(precision, self.device)

    def setup_model(self, model: nn.Module, make_optimizer: OptimizerFactory, *,
                    syncbn: bool, precision: Precision,
                    grad_accum: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Wrapped model and optimizer. The default wraps the model, then builds the optimizer
        over its parameters and wraps that; strategies that must see both at once (apex)
        override this."""
        model = self.wrap_model(model, syncbn=syncbn, precision=precision)
        optimizer = self.wrap_optimizer(make_optimizer(model.parameters()), model,
                                        grad_accum=grad_accum)
        return model, optimizer

    def apply_norm(self, model: nn.Module, syncbn: bool,
                   to_sync: Callable[[nn.Module], nn.Module], cpu_reason: str,
                   cpu_sync: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
        """SyncBatchNorm (through ``to_sync``) on CUDA with several replicas unless
        --no-syncbn, and on CPU through ``cpu_sync`` where it is given (--cpu-syncbn);
        per-replica BatchNorm otherwise. Sets ``self.norm`` and says why."""
        if not has_batchnorm(model):
            return self.no_batchnorm(model)
        if syncbn and self.world_size > 1 and (self.device.type == "cuda" or cpu_sync):
            self.norm = "syncbn"
            return to_sync(model) if self.device.type == "cuda" else cpu_sync(model)
        self.norm = "per-replica-bn"
        if self.world_size > 1:
            why = cpu_reason if self.device.type != "cuda" else "--no-syncbn"
            self.notes.append(f"BatchNorm statistics are per replica ({why})")
        return model

    def no_batchnorm(self, model: nn.Module) -> nn.Module:
        """A model without BatchNorm: the record's norm says so, not a conversion."""
        self.norm = "none"
        self.notes.append("the model has no BatchNorm: no statistics to synchronise")
        return model

    def wrap_model(self, model: nn.Module, *, syncbn: bool, precision: Precision) -> nn.Module:
        """Move the model to the device, convert normalisation, wrap; sets ``self.norm``."""
        return model.to(self.device)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module, *,
                       grad_accum: int) -> torch.optim.Optimizer:
        return optimizer

    def eval_module(self, model: nn.Module) -> nn.Module:
        """The module to evaluate with (unwrapped where the wrapper would communicate)."""
        return model

    def train_sampler(self, dataset, seed: int) -> DistributedSampler:
        return epoch_sampler(dataset, seed, self.world_size, self.rank)

    def process_devices(self) -> list[torch.device]:
        """Devices this process computes on (for peak memory)."""
        return [self.device]

    def eval_indices(self, size: int) -> list[int | None]:
        """This rank's share of the test set: every image exactly once over all ranks. When
        forwards are collectives every rank needs the same number of batches: short shards
        are padded with None (not counted)."""
        share: list[int | None] = list(range(self.rank, size, self.world_size))
        if self.collective_forward:
            share += [None] * (-(-size // self.world_size) - len(share))
        return share

    def exact_arithmetic(self) -> contextlib.AbstractContextManager:
        """Context for bookkeeping that must run in the dtype it is written in (the float64
        replica fingerprint): apex O1 patches torch's functions to cast their inputs."""
        return contextlib.nullcontext()

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Context for a gradient-accumulation micro-step whose gradients are not yet
        communicated (DDP: ``model.no_sync()``)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                 precision: Precision, last: bool = True) -> None:
        """Backward of one (micro-)batch; ``last`` is the final micro-step before step()."""
        precision.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer, precision: Precision) -> None:
        precision.step(optimizer)

    def gradient_sync_off(self, model: nn.Module,
                          optimizer: torch.optim.Optimizer) -> SyncOff | str:
        """Switch gradient synchronisation off for whole steps (the model and optimizer are
        not used for the run's figures afterwards), or say why this strategy cannot."""
        return f"{self.name} cannot switch its gradient communication off"

    def alone(self, model: nn.Module) -> nn.Module | None:
        """The model wrapped again as this strategy wraps it, over a process group of this
        rank alone, where the strategy does per-step work of its own beside its
        communication (a gradient compression hook): its steps cost that work, and
        communication next to none. None where there is no such work. Collective."""
        return None

    def compressed_gradient_elements(self, model: nn.Module) -> int | None:
        """Elements one step all-reduces where a low-rank compression (PowerSGD) sends
        fewer than the gradient's; None where the whole gradient is sent."""
        return None

    def gradient_buckets(self, model: nn.Module) -> list[int] | None:
        """Bytes of each gradient bucket as the strategy's reducer last built them (what
        ran), or None where there are none to read."""
        return None

    def discard_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Forget gradients of a backward that is not followed by a step (compile warm-up)."""
        optimizer.zero_grad()

    def backward_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                      precision: Precision) -> None:
        """Backward and step without accumulation."""
        self.backward(loss, optimizer, precision)
        self.step(optimizer, precision)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce over ranks in place (``sum`` or ``max``); a no-op for one process."""
        return tensor

    def broadcast_buffers(self, model: nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm running statistics) before eval."""

    def barrier(self) -> None:
        """Wait for every rank."""

    def teardown(self, clean: bool = True) -> None:
        """Leave the group; ``clean`` when every rank got here without an error."""


def order_seed(seed: int, epoch: int) -> int:
    """The permutation seed of (seed, epoch) (bench.records.schema.DATA_ORDER_RULE): a hash
    of both, so that no two pairs share an order. torch's own rule, ``seed + epoch``, gave
    seed s at epoch e seed s+1's order of epoch e-1: the repeats of a sweep (seeds S, S+1,
    ...) trained on shifted copies of one sequence of orders, and were not independent."""
    digest = hashlib.sha256(f"{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # a non-negative 63-bit seed


class EpochSampler(DistributedSampler):
    """DistributedSampler whose epoch ``e`` of seed ``s`` draws the permutation of
    ``order_seed(s, e)``; the rest (shards, drop_last, padding) is DistributedSampler's."""

    def __iter__(self):
        seed, epoch = self.seed, self.epoch
        self.seed, self.epoch = order_seed(seed, epoch), 0
        try:
            return super().__iter__()  # builds the whole list of indices before it returns
        finally:
            self.seed, self.epoch = seed, epoch


def epoch_sampler(dataset, seed: int, world_size: int, rank: int) -> DistributedSampler:
    """Every strategy draws the same global order: one permutation per (seed, epoch), rank r
    taking positions r, r+W, ... With drop_last the tail that does not fill all ranks is
    dropped, so with per-rank batch B/W the global batch k is the same set of images for
    every world size W."""
    return EpochSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )


def batchnorm_layers(model: nn.Module) -> int:
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def has_batchnorm(model: nn.Module) -> bool:
    return batchnorm_layers(model) > 0


def cpu_threads_per_process(processes_on_node: int) -> int:
    """Cores split evenly over the processes of this machine, so every strategy gets the
    same total number of CPU threads."""
    return max(1, usable_cores() // max(1, processes_on_node))
