"""One rank's model, optimizer and precision, built the same way for every strategy."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from bench.config.run_config import RunConfig
from bench.data.datasets import model_spec
from bench.data.loaders import batch_to_device, input_memory_format
from bench.models.ghost_batchnorm import GhostBatchNorm
from bench.models.parameters import count_parameters
from bench.models.registry import ModelSpec
from bench.models.stochastic import switch_off_random_layers
from strategies.base import OptimizerFactory, Strategy, batchnorm_layers
from strategies.precision import Precision

_OPTIMIZER_IMPL = {"foreach": {"foreach": True}, "fused": {"fused": True}}


@dataclass
class ModelParts:
    """The wrapped model, what the loop calls forward on (the model or its compiled form),
    the (wrapped) optimizer, precision, input memory format and the parameter count."""

    model: nn.Module
    spec: ModelSpec  # which network: name, width, classes, image size
    forward: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    precision: Precision
    memory_format: torch.memory_format
    parameters: int
    batchnorm_layers: int  # BatchNorm layers in the model (SyncBatchNorm's collectives)
    dtype: torch.dtype  # of parameters and inputs: float32, or float64 under bench verify
    allow_tf32: bool | None  # cuDNN convolutions in TF32 (GPU); None on CPU

    def to_device(self, images: torch.Tensor, labels: torch.Tensor, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch on the device in the run's dtype and memory format (without
        waiting): the last stage of the input pipeline."""
        return batch_to_device(images, labels, device, self.dtype, self.memory_format)

    def training_loss(self, criterion: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                      device: torch.device) -> torch.Tensor:
        """One training micro-batch's loss: the batch moved to the device (to_device), the
        forward under the run's autocast."""
        images, labels = self.to_device(images, labels, device)
        with self.precision.autocast():
            return criterion(self.forward(images), labels)


def make_optimizer(cfg: RunConfig) -> OptimizerFactory:
    """SGD with the run's recipe, over whichever parameters the strategy hands it."""

    def build(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            params, lr=cfg.peak_lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay, **_OPTIMIZER_IMPL.get(cfg.optimizer_impl, {}),
        )

    return build


# torch.compile modes that replay the compiled graphs as CUDA graphs on a GPU
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
_CUDAGRAPH_LOG = "torch._inductor.cudagraph_utils.__cudagraphs"  # torch's skip warnings


class CudaGraphWatch:
    """Whether a compile mode that replays CUDA graphs really did. Inductor skips them, with
    a warning and a counter, for a graph it cannot capture (and always on CPU): the record
    says which, instead of a mode name that promises what did not run."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self.counters = counters["inductor"]
        self.skips_before = self.counters["cudagraph_skips"]
        self.reasons: list[str] = []
        watch = self

        class _Reasons(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                message = record.getMessage()
                if message not in watch.reasons:
                    watch.reasons.append(message)

        self.handler = _Reasons(logging.WARNING)
        logging.getLogger(_CUDAGRAPH_LOG).addHandler(self.handler)

    def verdict(self, device_type: str) -> str:
        """'used', or why not: 'not on CPU', 'skipped for N graph(s): <torch's reasons>'."""
        logging.getLogger(_CUDAGRAPH_LOG).removeHandler(self.handler)
        if device_type != "cuda":
            return "not on CPU (CUDA graphs need a GPU)"
        skipped = self.counters["cudagraph_skips"] - self.skips_before
        if not skipped:
            return "used"
        return (f"skipped for {skipped} graph(s)"
                + (f": {'; '.join(self.reasons)}" if self.reasons else ""))


# Two lines torch logs on every compiled run that concern nothing the run does: Dynamo
# drops DDP's own profiler label from the compiled forward (the trace loses one name, not
# a kernel), and Inductor's C++ compiler on CPU notes the CUDA toolkit it does not use. They
# read as faults under a run's first epoch; other messages of these loggers pass.
_COMPILE_NOISE = {
    "torch._dynamo.variables.ctx_manager": "Profiler record function ",
    "torch.utils.cpp_extension": "No CUDA runtime is found",
}


class _DropNoise(logging.Filter):
    """Drops a logger's records whose message starts with ``start``; lets the rest pass."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def compiled(model: nn.Module, mode: str, dynamic: bool | None = None
             ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``torch.compile`` in the run's mode (torch's own default when "default"), without
    torch's two notes of no consequence (_COMPILE_NOISE); ``dynamic`` as torch.compile's."""
    for name, start in _COMPILE_NOISE.items():
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in log.filters):
            log.addFilter(_DropNoise(start))
    if mode == "default":
        return torch.compile(model, dynamic=dynamic)
    return torch.compile(model, mode=mode, dynamic=dynamic)


def tf32_label(label: str, allow_tf32: bool) -> str:
    """An "fp32" GPU run whose convolutions run in TF32 (10-bit mantissa) is called tf32."""
    return "tf32" if label == "fp32" and allow_tf32 else label


def build_model_and_optimizer(cfg: RunConfig, strategy: Strategy) -> ModelParts:
    """The same initial weights on every rank and for every strategy (seeded here, as
    ``bench.models.parameters.initial_params_sha1`` assumes), then the strategy's wrapping."""
    torch.manual_seed(cfg.seed)
    spec = model_spec(cfg)
    model = spec.build()
    if cfg.verify_steps is not None:  # as the reference: bench/models/stochastic.py
        switch_off_random_layers(model)
    if cfg.ghost_bn is not None:  # a model without BatchNorm was refused by the plan
        model = GhostBatchNorm.convert(model, cfg.ghost_bn)
    parameters = count_parameters(model)
    bn_layers = batchnorm_layers(model)
    dtype = torch.float64 if cfg.verify_float64 else torch.float32
    model = model.to(dtype)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    precision = strategy.make_precision(cfg.precision)
    if strategy.device.type == "cuda":
        torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        if cfg.tf32 is not None:
            torch.backends.cudnn.allow_tf32 = cfg.tf32 == "on"
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32 == "on"
        precision.label = tf32_label(precision.label, torch.backends.cudnn.allow_tf32)
    model, optimizer = strategy.setup_model(
        model, make_optimizer(cfg), syncbn=cfg.syncbn, precision=precision,
        grad_accum=cfg.grad_accum,
    )
    return ModelParts(
        model=model,
        spec=spec,
        forward=compiled(model, cfg.compile_mode) if cfg.compile else model,
        optimizer=optimizer,
        precision=precision,
        memory_format=input_memory_format(cfg),
        parameters=parameters,
        batchnorm_layers=bn_layers,
        dtype=dtype,
        allow_tf32=torch.backends.cudnn.allow_tf32 if strategy.device.type == "cuda" else None,
    )
