"""DDP + native mixed precision (``torch.amp``): fp16 autocast with a GradScaler on CUDA,
bf16 autocast (no scaler) on CUDA or CPU."""

from __future__ import annotations

from bench.config.strategy_parts import Features, Topology
from bench.tools.errors import ConfigError
from strategies.ddp import DDPStrategy


class DDPAmpStrategy(DDPStrategy):
    summary = "DDP + torch.amp (CUDA: fp16 + GradScaler; CPU: bf16)"

    def default_precision(self, device_type: str) -> str:
        return "fp16" if device_type == "cuda" else "bf16"

    def check(self, topology: Topology, features: Features) -> None:
        super().check(topology, features)
        if features.precision == "fp32":
            raise ConfigError("ddp-amp is mixed precision; use --precision fp16|bf16 or "
                              "--strategy ddp for fp32")
