"""DDP + NVIDIA apex AMP, as the seed projects used it (``apex.amp.initialize``,
``amp.scale_loss``, ``apex.parallel.DistributedDataParallel``, ``convert_syncbn_model``).

NVIDIA removed ``apex.amp`` and ``apex.parallel`` in May 2025 (tag 25.05 is the last release
with them), and apex AMP needs CUDA. This is the only module that imports apex."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

import torch
from torch import nn

from bench.config.strategy_parts import ApexOptions, DDPOptions, Features, Topology
from bench.tools.errors import ConfigError
from strategies.base import OptimizerFactory, SyncOff, has_batchnorm
from strategies.ddp import DDPStrategy, _ddp_call_kwargs, ddp_still_communicating
from strategies.precision import Precision

APEX_BUILD = (
    "build NVIDIA apex 25.05 from its source with `make apex` (APEX_SRC=DIR|TARBALL offline; "
    "see docs/gpus.md, 'NVIDIA apex')"
)


def apex_build() -> str:
    """Which apex build is installed: ``cuda-extensions`` (amp_C, fused kernels),
    ``cpp-extension`` (apex_C only) or ``python-only`` (amp and apex.parallel in Python)."""
    if importlib.util.find_spec("amp_C") is not None:
        return "cuda-extensions"
    if importlib.util.find_spec("apex_C") is not None:
        return "cpp-extension"
    return "python-only"


def apex_problem() -> str | None:
    """Why NVIDIA apex AMP cannot be imported here, or None."""
    if importlib.util.find_spec("apex") is None:
        return "NVIDIA apex is not installed"
    try:
        apex = importlib.import_module("apex")
    except Exception as exc:
        return f"`import apex` fails ({type(exc).__name__}: {exc})"
    nvidia_parts = ("amp", "parallel", "optimizers", "normalization", "contrib", "fp16_utils")
    found = [p for p in nvidia_parts if importlib.util.find_spec(f"apex.{p}") is not None]
    if not found:
        return (
            f"the installed `apex` ({getattr(apex, '__file__', '?')}) is the unrelated PyPI "
            "package of that name, not NVIDIA apex; `pip uninstall apex` first"
        )
    if "amp" not in found or "parallel" not in found:
        return "the installed NVIDIA apex is newer than 25.05: apex.amp and apex.parallel are gone"
    return None


@contextlib.contextmanager
def _apex_allreduce_off(model: nn.Module):
    model.disable_allreduce()  # apex.parallel.DistributedDataParallel's own switch
    try:
        yield
    finally:
        model.enable_allreduce()


class ApexStrategy(DDPStrategy):
    summary = "NVIDIA apex AMP (amp.initialize) + apex.parallel DDP"

    def __init__(self, name: str, *, apex: ApexOptions | None = None,
                 ddp: DDPOptions | None = None, launcher: str | None = None) -> None:
        super().__init__(name, ddp=ddp, launcher=launcher)
        self.apex_options = apex or ApexOptions()

    @property
    def own_options(self) -> frozenset[str]:  # apex.parallel's DDP takes none of torch DDP's
        return frozenset({"apex", "ddp"} if self.apex_options.ddp == "torch" else {"apex"})

    def requires(self, device_type: str, backend: str | None = None) -> str | None:
        problems = []
        if device_type != "cuda":
            problems.append("apex AMP needs CUDA, and this runs on CPU")
        apex = apex_problem()
        if apex:  # how to build it, only where it is what is missing
            problems.append(f"{apex}; {APEX_BUILD}")
        return "; ".join(problems) or None

    def check(self, topology: Topology, features: Features) -> None:
        super().check(topology, features)
        if features.precision != "fp32":
            raise ConfigError("ddp-apex sets its precision with --apex-opt-level O0..O3, "
                              "not --precision")

    def precision_label(self, precision: str) -> str:
        return f"apex-{self.apex_options.opt_level}"

    def make_precision(self, precision: str) -> Precision:
        chosen = Precision("fp32", self.device)  # apex patches the ops; no torch autocast
        chosen.label = self.precision_label(precision)
        return chosen

    def setup_model(self, model: nn.Module, make_optimizer: OptimizerFactory, *,
                    syncbn: bool, precision: Precision,
                    grad_accum: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        from apex import amp, parallel

        opt_level, which_ddp = self.apex_options.opt_level, self.apex_options.ddp
        if not has_batchnorm(model):
            model = self.no_batchnorm(model)
        elif syncbn and self.world_size > 1:
            model = parallel.convert_syncbn_model(model)
            self.norm = "syncbn"
        model = model.to(self.device)
        optimizer = make_optimizer(model.parameters())
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level)
        if which_ddp == "apex":
            model = parallel.DistributedDataParallel(model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index], **_ddp_call_kwargs(self.ddp_options)
            )
            self.register_comm_hook(model)
        self.notes.append(f"apex {opt_level}, {which_ddp} DDP, apex build: {apex_build()}")
        return model, optimizer

    def exact_arithmetic(self) -> contextlib.AbstractContextManager:
        # O1 patches torch's functions (sum, stack, +=...) to cast CUDA inputs that are not
        # fp32, float64 included, to fp32; its own switch turns that off for a while.
        amp = importlib.import_module("apex.amp")
        if getattr(amp._amp_state, "handle", None) is None:  # not initialised: nothing patched
            return contextlib.nullcontext()
        return amp.disable_casts()

    def no_sync(self, model: nn.Module):
        # torch DDP can skip the all-reduce of micro-steps; apex DDP reduces every backward.
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def gradient_sync_off(self, model: nn.Module, optimizer) -> SyncOff | str:
        if hasattr(model, "no_sync"):  # --apex-ddp torch
            return SyncOff(model.no_sync(), ddp_still_communicating(self.norm, self.ddp_options))
        note = "still communicating with sync off: SyncBatchNorm statistics" if (
            self.norm == "syncbn") else None
        return SyncOff(_apex_allreduce_off(model), note)

    def backward(self, loss, optimizer, precision: Precision, last: bool = True) -> None:
        from apex import amp

        # Micro-steps before the last keep their gradients scaled (apex's accumulation idiom).
        with amp.scale_loss(loss, optimizer, delay_unscale=not last) as scaled_loss:
            scaled_loss.backward()

    def step(self, optimizer, precision: Precision) -> None:
        optimizer.step()
