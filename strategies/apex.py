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

from bench.config import RunConfig
from bench.errors import ConfigError
from bench.precision import Precision
from strategies.ddp import DDPStrategy, _ddp_call_kwargs

APEX_BUILD = (
    "build NVIDIA apex 25.05 from source on a CUDA machine: git clone "
    "https://github.com/NVIDIA/apex && cd apex && git checkout 25.05 && pip install -v "
    "--no-build-isolation --config-settings '--build-option=--cpp_ext' "
    "--config-settings '--build-option=--cuda_ext' ./ (see README, 'NVIDIA apex')"
)


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


class ApexStrategy(DDPStrategy):
    summary = "DDP + NVIDIA apex AMP (amp.initialize, apex.parallel DDP), ranks by torchrun"

    def requires(self, device_type: str) -> str | None:
        problems = []
        if device_type != "cuda":
            problems.append("apex AMP needs CUDA and this run has no GPU")
        apex = apex_problem()
        if apex:
            problems.append(apex)
        if not problems:
            return None
        return "; ".join(problems) + "; " + APEX_BUILD

    def check(self, cfg: RunConfig, device_type: str) -> None:
        super().check(cfg, device_type)
        if cfg.precision not in (None, "fp32"):
            raise ConfigError("ddp-apex sets its precision with --apex-opt-level O0..O3, "
                              "not --precision")

    def precision_label(self, cfg: RunConfig) -> str:
        return f"apex-{cfg.apex_opt_level}"

    def make_precision(self, cfg: RunConfig) -> Precision:
        precision = Precision("fp32", self.device)  # apex patches the ops; no torch autocast
        precision.label = self.precision_label(cfg)
        return precision

    def setup_model(self, model: nn.Module, cfg: RunConfig, make_optimizer):
        from apex import amp, parallel

        if cfg.syncbn and self.world_size > 1:
            model = parallel.convert_syncbn_model(model)
            self.norm = "syncbn"
        model = model.to(self.device)
        optimizer = make_optimizer(model.parameters())
        model, optimizer = amp.initialize(model, optimizer, opt_level=cfg.apex_opt_level)
        if cfg.apex_ddp == "apex":
            model = parallel.DistributedDataParallel(model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index], **_ddp_call_kwargs(cfg)
            )
        self.notes.append(f"apex {cfg.apex_opt_level}, {cfg.apex_ddp} DDP")
        return model, optimizer

    def no_sync(self, model: nn.Module):
        # torch DDP can skip the all-reduce of micro-steps; apex DDP reduces every backward.
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def backward(self, loss, optimizer, precision: Precision, last: bool = True) -> None:
        from apex import amp

        # Micro-steps before the last keep their gradients scaled (apex's accumulation idiom).
        with amp.scale_loss(loss, optimizer, delay_unscale=not last) as scaled_loss:
            scaled_loss.backward()

    def step(self, optimizer, precision: Precision) -> None:
        optimizer.step()
