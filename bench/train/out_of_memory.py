"""A rank that runs out of memory says so in one line with the fix: how many images each
device held at once and the option that lowers it. torch's own CUDA message is a paragraph
about the allocator (and the CPU allocator's an `enforce fail` line) that names neither
the batch nor ``--grad-accum``; trying a larger batch is where users meet it first."""

from __future__ import annotations

import re

import torch

from bench.config.run_config import RunConfig
from bench.train.schedule import EVAL_MIN_BATCH, BatchSplit

# RuntimeErrors that are out-of-memory: the CPU allocator's, and CUDA's from a library
# (cuBLAS, NCCL: "CUDA error: out of memory") rather than torch's caching allocator
_OUT_OF_MEMORY = ("can't allocate memory", "out of memory")
_SIZE = r"[\d.]+ (?:[KMGTPE]iB|bytes)"  # c10's format_size: 512 bytes, 2.00 GiB
_CUDA_TRIED = re.compile(rf"Tried to allocate ({_SIZE})")
_CUDA_FREE = re.compile(rf"total capacity of ({_SIZE}) of which ({_SIZE}) is free")
_CPU_TRIED = re.compile(r"tried to allocate (\d+) bytes")
# CUDA's caching allocator refuses a request over 1 EB before asking the driver
_CUDA_OVER_LIMIT = "Tried to allocate more than 1EB memory"


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA), the CPU allocator's failure, or Python's MemoryError."""
    return (isinstance(exc, (torch.OutOfMemoryError, MemoryError))
            or (isinstance(exc, RuntimeError) and any(text in str(exc).lower()
                                                       for text in _OUT_OF_MEMORY)))


def _size(n: int) -> str:
    """Bytes as torch's CUDA message writes them (2.00 GiB)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = min(len(units) - 1, max(0, (n.bit_length() - 1) // 10))
    return f"{n} B" if power == 0 else f"{n / 1024 ** power:.2f} {units[power]}"


def _what_failed(message: str) -> str:
    """The allocation that failed, from torch's message: size, and on CUDA the device's
    free and total memory."""
    tried = _CUDA_TRIED.search(message)
    if tried:
        free = _CUDA_FREE.search(message)
        where = f" ({free.group(2)} free of {free.group(1)})" if free else ""
        return f"tried to allocate {tried.group(1)}{where}"
    if _CUDA_OVER_LIMIT in message:
        return "tried to allocate more than 1 EB (the CUDA allocator's limit)"
    tried = _CPU_TRIED.search(message)
    if tried:
        return f"tried to allocate {_size(int(tried.group(1)))}"
    return "an allocation failed"


def next_grad_accum(per_replica: int, grad_accum: int) -> int | None:
    """The smallest --grad-accum above the current one that splits a replica's batch evenly
    (so the global batch stays), or None when one image at a time is already the case."""
    return next((k for k in range(grad_accum + 1, per_replica + 1) if per_replica % k == 0),
                None)


def out_of_memory_line(exc: BaseException, cfg: RunConfig, device: torch.device,
                       split: BatchSplit, phase: str) -> str:
    """One line for the record: what ran out on ``device``, how many images each device
    held at once (``split`` of ``cfg``'s batch), and the fix for the ``phase`` it
    happened in."""
    where = "cpu" if device.type == "cpu" else str(device)
    holder = "GPU" if device.type == "cuda" else "replica"
    head = f"out of memory on {where}: {_what_failed(str(exc))}"
    at_once = split.per_replica // cfg.grad_accum
    if phase == "start-up":
        placed = "the model" + (" or the data set on the device (--loader gpu)"
                                if cfg.loader == "gpu" else "")
        fix = "--loader torch, or " if cfg.loader == "gpu" else ""
        return (f"{head} before training: {placed} does not fit; use {fix}a smaller --model "
                "or --width")
    if phase.startswith("eval"):
        if split.per_process > EVAL_MIN_BATCH:
            return (f"{head} while evaluating {split.per_process} images per process at "
                    "once (the training batch per process): lower --batch-size")
        return (f"{head} while evaluating {EVAL_MIN_BATCH} images per process at once (the "
                "least evaluation takes): choose a smaller --model or --image-size")
    # training steps, their compile warm-up and the probes after the epochs
    held = f"{at_once} images per {holder} at once"
    accum = next_grad_accum(split.per_replica, cfg.grad_accum)
    if accum is not None:
        more = (f"add --grad-accum {accum}" if cfg.grad_accum == 1
                else f"raise --grad-accum to {accum}")
        return (f"{head}; {held}: lower --batch-size, or keep it and {more} "
                f"({split.per_replica // accum} at once, the same global batch)")
    return (f"{head}; {held}: the model does not fit one image at a time; choose a smaller "
            "--model or --image-size, or --precision bf16")
