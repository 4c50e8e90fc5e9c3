"""The line a rank that ran out of memory leaves, from the messages torch really writes:
its CUDA caching allocator's (the format of c10's CUDACachingAllocator, as users meet it),
a CUDA library's, the CPU allocator's (raised here for real). Each names what each device
held at once and the option that fixes it, for the phase the rank was in."""

from __future__ import annotations

import pytest
import torch

from bench.config.run_config import RunConfig
from bench.train.out_of_memory import is_out_of_memory, next_grad_accum, out_of_memory_line
from bench.train.schedule import BatchSplit

CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB "
    "of which 1.58 GiB is free. Including non-PyTorch memory, this process has 12.97 GiB "
    "memory in use. Of the allocated memory 12.2 GiB is allocated by PyTorch, and 33.93 MiB "
    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
    "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
CUDA0 = torch.device("cuda", 0)


def _cfg(**changes) -> RunConfig:
    return RunConfig(strategy="ddp", **changes)


def test_torchs_cuda_message_becomes_the_batch_and_the_fix():
    line = out_of_memory_line(torch.OutOfMemoryError(CUDA_MESSAGE), _cfg(batch_size=512),
                              CUDA0, BatchSplit(256, 256, 256), "train epoch 1 step 1")
    assert line == ("out of memory on cuda:0: tried to allocate 1.95 GiB (1.58 GiB free of "
                    "14.57 GiB); 256 images per GPU at once: lower --batch-size, or keep it and "
                    "add --grad-accum 2 (128 at once, the same global batch)")


def test_the_suggested_accumulation_splits_the_replicas_batch_evenly():
    # 96 per replica in 2 micro-batches: the next count that splits 96 evenly is 3 (32 each)
    assert next_grad_accum(96, 2) == 3
    assert next_grad_accum(7, 1) == 7  # a prime batch: one image at a time
    assert next_grad_accum(7, 7) is None
    line = out_of_memory_line(torch.OutOfMemoryError(CUDA_MESSAGE),
                              _cfg(batch_size=7, grad_accum=7), CUDA0, BatchSplit(7, 7, 1),
                              "train epoch 1 step 1")
    assert line.endswith("1 images per GPU at once: the model does not fit one image at a "
                         "time; choose a smaller --model or --image-size, or --precision bf16")


def test_the_fix_follows_the_phase():
    oom = torch.OutOfMemoryError(CUDA_MESSAGE)
    split = BatchSplit(64, 64, 64)
    assert out_of_memory_line(oom, _cfg(batch_size=64, loader="gpu"), CUDA0, split,
                              "start-up").endswith(
        "before training: the model or the data set on the device (--loader gpu) does not "
        "fit; use --loader torch, or a smaller --model or --width")
    assert out_of_memory_line(oom, _cfg(batch_size=64), CUDA0, split, "eval batch 3").endswith(
        "while evaluating 256 images per process at once (the least evaluation takes): "
        "choose a smaller --model or --image-size")
    big = BatchSplit(1024, 1024, 1024)
    assert out_of_memory_line(oom, _cfg(batch_size=1024), CUDA0, big, "eval batch 1").endswith(
        "while evaluating 1024 images per process at once (the training batch per process): "
        "lower --batch-size")
    # the probes after the epochs run training steps: the training fix
    assert "add --grad-accum 2" in out_of_memory_line(oom, _cfg(batch_size=64), CUDA0, split,
                                                      "comm probe step 3")


def test_the_cpu_allocators_failure_is_out_of_memory_and_sized():
    with pytest.raises(RuntimeError) as caught:
        torch.empty(1 << 62, dtype=torch.uint8)
    assert is_out_of_memory(caught.value)
    line = out_of_memory_line(caught.value, _cfg(batch_size=32), torch.device("cpu"),
                              BatchSplit(32, 32, 32), "train epoch 2 step 7")
    assert line.startswith("out of memory on cpu: tried to allocate 4.00 EiB; 32 images per "
                           "replica at once")


@pytest.mark.parametrize("exc, expected", [
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
                  "reported"), True),  # cuBLAS / NCCL, not the caching allocator
    (MemoryError(), True),
    (RuntimeError("Expected all tensors to be on the same device"), False),
    (ValueError("out of memory"), False),  # not an error torch raises for memory
])
def test_what_counts_as_out_of_memory(exc, expected):
    assert is_out_of_memory(exc) is expected


def test_a_request_over_the_cuda_allocators_limit_is_said_as_such():
    """c10's caching allocator refuses over 1 EB before asking the driver, without figures."""
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")
    line = out_of_memory_line(oom, _cfg(batch_size=64), CUDA0, BatchSplit(64, 64, 64),
                              "train epoch 1 step 2")
    assert line.startswith("out of memory on cuda:0: tried to allocate more than 1 EB (the "
                           "CUDA allocator's limit); 64 images per GPU at once")
