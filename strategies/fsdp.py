"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer state
sharded over the ranks; each residual stage and the root are sharding units. Ranks started
by torchrun; NCCL on CUDA, gloo on CPU. Mixed precision through FSDP's own
``MixedPrecisionPolicy`` (bf16/fp16 parameters, fp32 gradient reduction)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from bench.config.strategy_parts import Features, FSDPOptions, Topology
from bench.tools.collectives import reduce_scatter_flat
from bench.tools.errors import ConfigError
from strategies.base import SyncOff
from strategies.ddp import DDPStrategy
from strategies.precision import Precision


def fsdp_api():
    """(fully_shard, MixedPrecisionPolicy) or None where this torch has no FSDP2."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        return None
    return fully_shard, MixedPrecisionPolicy


class FSDPStrategy(DDPStrategy):
    summary = "FSDP2: fully_shard per residual stage + root"
    collective_forward = True  # every forward all-gathers: ranks must evaluate in lockstep
    replicates_parameters = False  # each rank holds a shard: "replicas identical" has no object
    own_options = frozenset({"fsdp"})

    def __init__(self, name: str, *, fsdp: FSDPOptions | None = None) -> None:
        super().__init__(name)
        self.fsdp_options = fsdp or FSDPOptions()
        self._unit_bytes: list[int] | None = None  # each unit's fp32 gradient, the root's last

    def record_options(self) -> dict | None:
        return {"reshard_after_forward": self.fsdp_options.reshard_after_forward}

    def gradient_buckets(self, model: nn.Module) -> list[int] | None:
        """FSDP's buckets are its units: each reduce-scatters its own gradient (fp32 bytes,
        the root's last where it holds any), and each is a stage of the all-gather pipeline
        `bench project` models (ResNet-18's four stages and the root; 7 + root for
        mobilenet_v3_small)."""
        return self._unit_bytes

    def requires(self, device_type: str, backend: str | None = None) -> str | None:
        if fsdp_api() is None:
            return f"torch {torch.__version__} has no FSDP2 (fully_shard); use torch >= 2.8"
        return None

    def check(self, topology: Topology, features: Features) -> None:
        super().check(topology, features)
        if topology.device_type == "cuda" and topology.backend == "gloo":
            # Seen on an H100 (torch 2.11, 2 ranks sharing cuda:0): rank 0 died of SIGSEGV
            # in FSDP2's first collectives over gloo, in `bench run` and in `bench verify`.
            raise ConfigError("fsdp cannot run over gloo with CUDA tensors (its collectives "
                              "crashed with SIGSEGV on torch 2.11); use --backend nccl with "
                              "one GPU per rank, or fsdp --cpu")
        if features.channels_last:
            raise ConfigError("fsdp cannot shard channels_last parameters (FSDP2 needs "
                              "contiguous ones); drop --channels-last, or use ddp with it")
        if features.optimizer_impl == "fused":
            raise ConfigError("fsdp cannot use the fused SGD (no sharding rule for "
                              "_fused_sgd_ on DTensor); use --optimizer-impl foreach")

    def make_precision(self, precision: str) -> Precision:
        # FSDP casts parameters itself; no autocast. fp16 still needs loss scaling.
        chosen = Precision(precision, self.device)
        chosen.dtype = None
        return chosen

    def wrap_model(self, model: nn.Module, *, syncbn: bool, precision: Precision) -> nn.Module:
        fully_shard, policy_cls = fsdp_api()
        model = self.apply_norm(model, syncbn, nn.SyncBatchNorm.convert_sync_batchnorm,
                                "SyncBatchNorm needs CUDA").to(self.device)
        kwargs = {}
        mixed = precision.name in ("bf16", "fp16")
        if mixed:
            dtype = torch.bfloat16 if precision.name == "bf16" else torch.float16
            kwargs["mp_policy"] = policy_cls(param_dtype=dtype, reduce_dtype=torch.float32)
            # BatchNorm stays fp32 (its own unit), as in every mixed-precision recipe.
            bn_policy = policy_cls(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                   output_dtype=dtype, cast_forward_inputs=True)
            for module in model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    fully_shard(module, mp_policy=bn_policy)
            self.notes.append(
                f"FSDP MixedPrecisionPolicy: {precision.name} params, fp32 reduce, "
                "fp32 BatchNorm"
            )
        elif next(model.parameters()).dtype == torch.float64:
            # bench verify runs fp32 strategies in float64, where FSDP2 reduces gradients
            # with SUM and divides them itself; a float32 run reduces with ReduceOp.AVG.
            # Reducing in float32 here checks the reduction runs use (its rounding moved
            # loss and parameters by ~1e-11 over 6 steps, far below the 1e-8 tolerance).
            kwargs["mp_policy"] = policy_cls(reduce_dtype=torch.float32)
            self.notes.append("FSDP MixedPrecisionPolicy under bench verify: float64 "
                              "parameters, gradients reduced in float32 as a float32 run does")
        units = shard_units(model)
        sizes = [4 * sum(p.numel() for p in unit.parameters()) for unit in units]
        root = 4 * sum(p.numel() for p in model.parameters()) - sum(sizes)
        self._unit_bytes = [*sizes, root] if root else sizes  # a root of no parameters gathers none
        kwargs["reshard_after_forward"] = self.fsdp_options.reshard_after_forward
        for unit in units:
            fully_shard(unit, **kwargs)
        if mixed:  # logits and loss in fp32, as autocast gives them
            kwargs["mp_policy"] = policy_cls(param_dtype=dtype, reduce_dtype=torch.float32,
                                             output_dtype=torch.float32)
        fully_shard(model, **kwargs)
        self._reduce_gradients_by_sum_where_avg_sums(model)
        what = ("4 residual stages" if hasattr(model, "stages")
                else f"{len(units)} submodules of {type(model).__name__}")
        self.notes.append(f"FSDP2: sharded units = {what} + root; parameters are "
                          "sharded, so replicas_identical is null (not applicable)")
        if not self.fsdp_options.reshard_after_forward:
            self.notes.append("FSDP2: reshard_after_forward=False: each unit keeps its "
                              "gathered parameters from forward to backward (ZeRO-2-like: no "
                              "all-gather in backward)")
        return model

    def _reduce_gradients_by_sum_where_avg_sums(self, model: nn.Module) -> None:
        """FSDP2 reduce-scatters fp32 and bf16 gradients with ``ReduceOp.AVG``; gloo's
        reduce_scatter returned the *sum* for AVG before the fix of pytorch/pytorch#162338
        (2.8 does; 2.4 refuses AVG), so fsdp on CPU trained on N times the gradient
        (`bench verify` runs in float64, where FSDP divides and sums, and cannot see it).
        Where this group's AVG sums, every FSDP module is told to reduce with SUM and divide
        itself. Collective."""
        if dist.get_backend() != "gloo" or reduce_scatter_averages():
            return
        if not hasattr(model, "set_force_sum_reduction_for_comms"):  # an older FSDP2
            raise RuntimeError(
                f"fsdp over gloo cannot average its gradients on torch {torch.__version__}: "
                "gloo's reduce_scatter refuses ReduceOp.AVG or returns the sum "
                "(pytorch/pytorch#162338), and this FSDP2 cannot be told to sum and divide "
                "itself; use torch >= 2.8 (pyproject's minimum), or fsdp on GPUs over nccl")
        for module in model.modules():
            if hasattr(module, "set_force_sum_reduction_for_comms"):  # each FSDP module
                module.set_force_sum_reduction_for_comms(True)
        self.notes.append(f"FSDP2 reduces gradients with SUM and divides by the world size: "
                          f"gloo's reduce_scatter on torch {torch.__version__} sums where asked "
                          "to average (pytorch/pytorch#162338)")

    def eval_module(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module):
        # FSDP2: skip the gradient reduce-scatter on micro-steps before the last.
        model.set_requires_gradient_sync(False)
        return _resync(model)

    def gradient_sync_off(self, model: nn.Module, optimizer) -> SyncOff | str:
        """A compute-only step for FSDP: with only the gradient reduce-scatter off, every
        step still all-gathers each unit's parameters in forward (and backward), and over a
        slow link those gathers were most of the "compute" step (docs/projection.md). So
        every unit is gathered once, in the first (warm-up) step, and kept whole: no
        reshard after forward or backward until the probe ends. Memory then holds the whole
        model for the probe's steps, as DDP's ranks always do."""
        left = ("still communicating with sync off: SyncBatchNorm statistics"
                if self.norm == "syncbn" else None)
        return SyncOff(_gathered_once(model, self.fsdp_options.reshard_after_forward), left)


def reduce_scatter_averages() -> bool:
    """Whether a reduce-scatter with ``ReduceOp.AVG`` averages over the default group (one
    element per rank: rank r sends r + 1 everywhere). Collective."""
    world = dist.get_world_size()
    sent = torch.full((world,), float(dist.get_rank() + 1), dtype=torch.float64)
    got = torch.zeros(1, dtype=torch.float64)
    try:
        reduce_scatter_flat(dist)(got, sent, op=dist.ReduceOp.AVG)
    except (RuntimeError, ValueError):  # a gloo without AVG at all
        return False
    return abs(got.item() - (world + 1) / 2) < 1e-9


@contextlib.contextmanager
def _gathered_once(model: nn.Module, reshard_after_forward: bool):
    """Gradient sync off, and each FSDP unit's parameters, once gathered, kept gathered;
    afterwards the run's own settings again and every unit resharded. Collective on exit."""
    units = [m for m in model.modules() if hasattr(m, "set_reshard_after_backward")]
    inner = [unit for unit in units if unit is not model]  # the root never reshards after
    for unit in inner:                                      # forward (FSDP2 sets it so)
        unit.set_reshard_after_forward(False, recurse=False)
    for unit in units:
        unit.set_reshard_after_backward(False, recurse=False)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
        for unit in inner:
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
        for unit in units:
            unit.set_reshard_after_backward(True, recurse=False)
            unit.reshard()


@contextlib.contextmanager
def _resync(model: nn.Module):
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """What FSDP shards apart: ResNet-18 CIFAR's four residual stages; for any other model
    its parameter-holding submodules from the top down, splitting any that holds more than
    half of the parameters (a ViT's encoder into its layers) and leaving the smallest
    (under 2 %) to the root unit."""
    if hasattr(model, "stages"):
        return list(model.stages)
    total = sum(p.numel() for p in model.parameters())

    def split(module: nn.Module) -> list[nn.Module]:
        units = []
        for child in module.children():
            size = sum(p.numel() for p in child.parameters())
            if size > total / 2 and any(True for _ in child.children()):
                units += split(child)
            elif size >= 0.02 * total:
                units.append(child)
        return units

    return split(model)
