"""Precision chosen once per run: autocast dtype and, for fp16 on CUDA, a GradScaler."""

from __future__ import annotations

import contextlib

import torch

from bench.tools.errors import ConfigError

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Precision:
    """``fp32`` (no autocast), ``bf16`` (autocast, no scaler) or ``fp16`` (autocast +
    dynamic loss scaling; CUDA only)."""

    def __init__(self, name: str, device: torch.device) -> None:
        if name == "fp16" and device.type != "cuda":
            raise ConfigError("--precision fp16 needs CUDA; use --precision bf16 on CPU")
        self.name = name
        self.label = name  # what the record calls it (apex: "apex-O1", ...)
        self.device_type = device.type
        self.dtype = _DTYPES.get(name)
        self.scaler = torch.amp.GradScaler("cuda") if name == "fp16" else None
        self.skipped_steps: torch.Tensor | None = None  # kept on the device: no sync per step

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager:
        """Autocast to this precision (``cache``: autocast's cache of low-precision weight
        copies, on as torch has it; bench verify's rank-chunked reference turns it off)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype,
                              cache_enabled=cache)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass, through the scaler when there is one (gradients accumulate)."""
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step (skipped by the scaler on inf/nan gradients) and scale update."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            found = sum(self.scaler._found_inf_per_device(optimizer).values())  # 1 = skipped
            self.skipped_steps = found if self.skipped_steps is None else self.skipped_steps + found
            self.scaler.update()

    def scaler_state(self) -> dict[str, float | int | None]:
        """For the record: the final loss scale and how many optimizer steps the scaler
        skipped on inf/nan gradients (null without a scaler), proof that it ran."""
        if self.scaler is None:
            return {"loss_scale": None, "scaler_skipped_steps": None}
        skipped = 0 if self.skipped_steps is None else int(self.skipped_steps.item())
        return {"loss_scale": self.scaler.get_scale(), "scaler_skipped_steps": skipped}
