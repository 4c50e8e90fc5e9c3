"""DistributedDataParallel: one process per GPU (or CPU process), NCCL on CUDA, gloo on CPU.
The same class serves every launcher (torchrun, mp.spawn, torch.distributed.launch): the
launcher sets RANK / WORLD_SIZE / LOCAL_RANK, the strategy reads them."""

from __future__ import annotations

import inspect
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench.config.strategy_parts import DDPOptions, Features, Topology
from bench.tools.errors import ConfigError
from bench.tools.faults import slow_communication_note
from bench.tools.restarts import restarts_allowed
from strategies.base import Strategy, SyncOff
from strategies.precision import Precision

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def attempt_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store | None:
    """Where torchrun may start the ranks again (--max-restarts), the store this attempt's
    process group meets in: torchrun keeps one store for the whole job (its static
    rendezvous), and a restarted group read the keys the failed attempt left there, gloo's
    peer addresses among them, and connected to a dead rank ('Gloo connectFullMesh failed
    ... Connection refused', or a wait until --timeout). Each rank counts its own starts in
    the store; every attempt starts every rank, so the counts agree, and each attempt's
    keys go under a prefix of its own. None without restarts allowed: env:// as torch
    does it."""
    if not restarts_allowed():
        return None
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size, is_master=rank == 0 and not agent_hosts,
                          timeout=timeout, multi_tenant=True)
    attempt = store.add(f"bench/starts/rank{rank}", 1)
    return dist.PrefixStore(f"bench/attempt{attempt}/", store)


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise RuntimeError(
            f"{name} is not set: DDP ranks are started by `bench run`, not directly"
        ) from None


def gpu_index(local_rank: int, visible: int, *, shared: bool = False) -> int:
    """This rank's GPU. A task that sees one GPU (Slurm binding one per task) uses it; with
    several visible, local rank r takes GPU r. A local rank past them would share a GPU with
    another rank, which NCCL refuses later with "Duplicate GPU detected": say it plainly,
    unless sharing was asked for (``--backend gloo``): then round-robin."""
    if shared:
        return local_rank % visible
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    raise ConfigError(
        f"local rank {local_rank} has no GPU of its own ({visible} visible on this node): "
        f"run at most {visible} ranks per node, or give each task one GPU "
        "(srun --gpus-per-task=1)"
    )


def ddp_still_communicating(norm: str, options: DDPOptions) -> str | None:
    """What DDP's no_sync leaves on the wire (it only skips the gradient all-reduce)."""
    left = (["SyncBatchNorm statistics"] if norm == "syncbn" else []) + (
        ["the buffer broadcast of every forward"] if options.broadcast_buffers else [])
    return f"still communicating with sync off: {' and '.join(left)}" if left else None


def _ddp_call_kwargs(options: DDPOptions) -> dict:
    """What is passed to DDP: the default broadcast_buffers=True is left implicit, and
    --no-broadcast-buffers is torch's forward_sync_buffers=False where torch has it (from
    2.14, which deprecates broadcast_buffers with a FutureWarning per rank and wrap). Both
    stop the broadcast before every forward; the older argument also skips DDP's one
    broadcast at wrap, of buffers that every rank built alike from the same seed."""
    kwargs = options.as_dict()
    del kwargs["comm_hook"], kwargs["powersgd_rank"]  # registered after wrapping
    del kwargs["cpu_syncbn"]  # the model's BatchNorm layers, converted before wrapping
    if not kwargs.pop("broadcast_buffers"):
        takes_new = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        kwargs["forward_sync_buffers" if takes_new else "broadcast_buffers"] = False
    return kwargs


def _one_bucket_at_a_time(hook):
    """The hook, finished bucket by bucket. PowerSGD chains two all-reduces per bucket
    through future callbacks; over gloo the callbacks of one bucket and the next bucket's
    first all-reduce reach the process group in a different order on different ranks, a
    collective mismatch ("Received data size doesn't match expected size", seen with ViT-B's
    14 buckets, torch 2.11). Waiting for each bucket keeps the order."""

    def serial(state, bucket):
        future = hook(state, bucket)
        future.wait()
        return future

    return serial


POWERSGD_MIN_COMPRESSION_RATE = 2.0  # torch's default: compress a matrix 2x smaller or more


def powersgd_elements(module: nn.Module, rank: int) -> int:
    """Gradient elements PowerSGD all-reduces per step, by torch's rule (powerSGD_hook): a
    gradient of n rows is viewed as an n x m matrix and travels as its rank-r factors P
    (n x r) and Q (m x r), r = min(n, m, rank), when (n + m) r is at least the minimum
    compression rate smaller than n m; otherwise whole, as vectors (biases, BatchNorm)
    always travel."""
    total = 0
    for param in module.parameters():
        if not param.requires_grad:
            continue
        if param.dim() <= 1:
            total += param.numel()
            continue
        n = param.shape[0]
        m = param.numel() // n
        factors = (n + m) * min(n, m, rank)
        total += factors if factors * POWERSGD_MIN_COMPRESSION_RATE < n * m else n * m
    return total


def _delayed(hook, delay_s: float):
    """The hook, after a blocking wait of ``delay_s`` seconds per bucket (a slow link); the
    hook itself without one."""
    if not delay_s:
        return hook

    def slow(state, bucket):
        time.sleep(delay_s)
        return hook(state, bucket)

    return slow


def register_comm_hook(model: DistributedDataParallel, options: DDPOptions,
                       backend: str = "nccl", group=None, delay_s: float = 0.0) -> str | None:
    """DDP's own gradient compression (``--ddp-comm-hook``); returns the note saying what it
    does. fp16 / bf16: each bucket is cast (and divided by the world size) before the
    all-reduce and cast back after it, as Horovod's fp16 compression does. PowerSGD: each
    large gradient matrix is all-reduced as two rank-r factors, with error feedback and
    warm start; it starts at the second step (torch's default waits 1,000 steps, which a
    benchmark run would never leave) and all-reduces vectors (biases, BatchNorm) as they
    are. ``group``: the process group the hook all-reduces over (default: every rank).
    ``delay_s`` (the ``BENCH_SLOW_COMM_MS`` test hook): a wait before every bucket's
    communication, in front of whichever hook runs (DDP takes one hook only)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if options.comm_hook == "none":
        if delay_s:
            model.register_comm_hook(group, _delayed(default_hooks.allreduce_hook, delay_s))
        return None
    if options.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=options.powersgd_rank,
            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True, random_seed=0)
        serial = backend == "gloo"
        hook = (_one_bucket_at_a_time(powerSGD_hook.powerSGD_hook) if serial
                else powerSGD_hook.powerSGD_hook)
        model.register_comm_hook(state, _delayed(hook, delay_s))
        sent = powersgd_elements(model.module, options.powersgd_rank)
        total = sum(p.numel() for p in model.module.parameters() if p.requires_grad)
        return (f"DDP comm hook: PowerSGD rank {options.powersgd_rank} (error feedback, warm "
                f"start) from step 2, all-reducing {sent:,} of {total:,} gradient elements "
                f"({sent / total:.1%}); the first step all-reduces in full"
                + ("; gloo: one bucket at a time (concurrent buckets mismatch their "
                   "collectives)" if serial else ""))
    hook = {"fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook}[options.comm_hook]
    # the cast hooks' state is their process group
    model.register_comm_hook(group, _delayed(hook, delay_s))
    return (f"DDP comm hook: gradients all-reduced in {options.comm_hook} (cast before, "
            "cast back after)")


class DDPStrategy(Strategy):
    summary = "DistributedDataParallel, one process per GPU"
    launcher = "torchrun"
    own_options = frozenset({"ddp"})

    def __init__(self, name: str, *, ddp: DDPOptions | None = None,
                 launcher: str | None = None, summary: str | None = None) -> None:
        super().__init__(name, launcher=launcher, summary=summary)
        self.ddp_options = ddp or DDPOptions()

    def record_options(self) -> dict | None:
        return self.ddp_options.as_dict()

    def check(self, topology: Topology, features: Features) -> None:
        if topology.nodes > 1 and self.launcher in ("spawn", "torch.distributed.launch"):
            raise ConfigError(
                f"{self.name} starts its ranks on one machine by design; for --nodes > 1 use "
                "--strategy ddp (torchrun rendezvous)"
            )
        if topology.nodes > 1 and not topology.rdzv_endpoint and not topology.under_srun:
            raise ConfigError("--nodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every "
                              "node)")
        if topology.hosts:
            raise ConfigError("--hosts is for horovod; DDP across machines uses --nodes and "
                              "--rdzv-endpoint")
        if self.ddp_options.static_graph and features.grad_accum > 1:
            raise ConfigError(
                "--static-graph cannot be combined with --grad-accum > 1 (DDP's no_sync fails "
                "an internal assert with a static graph); drop one of them"
            )

    def setup(self, topology: Topology) -> None:
        self.rank = _env_int("RANK")
        self.world_size = _env_int("WORLD_SIZE")
        self.local_rank = _env_int("LOCAL_RANK")
        self.replicas = self.world_size
        if self.launcher == "torch.distributed.launch":
            self.notes.append(
                "torch.distributed.launch is deprecated (FutureWarning); torchrun replaces it"
            )
            if os.environ.get("BENCH_LOCAL_RANK_ARG"):
                self.notes.append(
                    f"rank 0 read its local rank from `{os.environ['BENCH_LOCAL_RANK_ARG']}`"
                )
        if topology.device_type == "cuda":
            index = gpu_index(self.local_rank, torch.cuda.device_count(),
                              shared=topology.gpu_shared)
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        timeout = timedelta(seconds=topology.timeout)
        store = attempt_store(self.rank, self.world_size, timeout)
        dist.init_process_group(
            topology.backend,
            **({"store": store} if store is not None else {"init_method": "env://"}),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )

    def wrap_model(self, model: nn.Module, *, syncbn: bool, precision: Precision) -> nn.Module:
        # imported here, in the rank: its torch.compiler.disable imports torch._dynamo (1.2 s
        # on 2 cores), which bench's launcher, `bench list` and the sweep never use
        from strategies.cpu_syncbn import CpuSyncBatchNorm

        model = self.apply_norm(model, syncbn, nn.SyncBatchNorm.convert_sync_batchnorm,
                                "torch's SyncBatchNorm needs an accelerator: --cpu-syncbn "
                                "for bench's", cpu_sync=(CpuSyncBatchNorm.convert
                                                         if self.ddp_options.cpu_syncbn
                                                         else None)).to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids,
                                          **_ddp_call_kwargs(self.ddp_options))
        self.register_comm_hook(wrapped)
        return wrapped

    def register_comm_hook(self, model: DistributedDataParallel) -> None:
        """The run's comm hook on its DDP model, behind the test hook's wait if one is set;
        each noted in the record."""
        note = register_comm_hook(model, self.ddp_options, dist.get_backend(),
                                  delay_s=self.bucket_delay_s)
        if note:
            self.notes.append(note)
        if self.bucket_delay_s:
            self.notes.append(slow_communication_note(self.bucket_delay_s))

    def no_sync(self, model: nn.Module):
        return model.no_sync()

    def gradient_sync_off(self, model: nn.Module, optimizer) -> SyncOff | str:
        return SyncOff(model.no_sync(), ddp_still_communicating(self.norm, self.ddp_options))

    def alone(self, model: nn.Module) -> nn.Module | None:
        """A DDP of this rank alone with the same buckets and comm hook: its steps are the
        hook's own work (PowerSGD's matrix products, orthogonalisation and error feedback,
        or the casts) and the reducer's bucket copies, around all-reduces of one rank."""
        if self.ddp_options.comm_hook == "none":
            return None
        mine, _ = dist.new_subgroups(group_size=1)  # collective: every rank makes them all
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        solo = DistributedDataParallel(model.module, device_ids=device_ids, process_group=mine,
                                       **_ddp_call_kwargs(self.ddp_options))
        register_comm_hook(solo, self.ddp_options, dist.get_backend(), group=mine)
        return solo

    def compressed_gradient_elements(self, model: nn.Module) -> int | None:
        if self.ddp_options.comm_hook != "powersgd":
            return None
        return powersgd_elements(model.module, self.ddp_options.powersgd_rank)

    def gradient_buckets(self, model: nn.Module) -> list[int] | None:
        """The reducer's buckets after it rebuilt them in gradient-ready order (torch's own
        logging data; None before a rebuild or where torch no longer reports them)."""
        try:
            sizes = model._get_ddp_logging_data().get("rebuilt_bucket_sizes")
            return [int(x) for x in str(sizes).split(",")] if sizes else None
        except (AttributeError, RuntimeError, ValueError):
            return None

    def eval_module(self, model: nn.Module) -> nn.Module:
        # Evaluate on the bare module: ranks see different numbers of test batches, and the
        # DDP wrapper must not start collectives on some ranks only.
        return model.module

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        dist.all_reduce(tensor, op=_OPS[op])
        return tensor

    def broadcast_buffers(self, model: nn.Module) -> None:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)

    def barrier(self) -> None:
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def teardown(self, clean: bool = True) -> None:
        if dist.is_initialized():
            if clean:  # nobody may leave while a peer is still in a collective (gloo aborts)
                self.barrier()
            dist.destroy_process_group()
