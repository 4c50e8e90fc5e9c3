"""A model's parameters counted and fingerprinted: the same start of every run is proven by
the SHA-1 of its initial parameters."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import nn

from bench.models.registry import ModelSpec


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def params_sha1(params: Iterable[torch.Tensor]) -> str:
    """SHA-1 of the parameters' exact fp32 values in order: equal only for identical weights,
    whatever device, memory format or thread count they were computed with."""
    digest = hashlib.sha1()
    for p in params:
        digest.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def initial_params_sha1(seed: int, spec: ModelSpec | None = None) -> str:
    """What every run of this seed and model must start from (the reference for 'same
    start'): the weights the model draws after ``torch.manual_seed(seed)``. The caller's
    random state is left as it was."""
    from bench.models.registry import ModelSpec

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return params_sha1((spec or ModelSpec()).build().parameters())
