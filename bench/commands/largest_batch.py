"""`bench sweep --batch-size max`: each combination trains at the largest per-replica batch
`bench fit`'s search finds for it under the sweep's --memory-limit (CPU) or --gpu-memory
(CUDA). Found once per strategy, N, recipe and device, and kept in OUTPUT/fits/, so a
resumed or repeated sweep does not search again. The learning rate follows the recipe's
rule (0.1 x global batch / 128 unless --lr is given): the rows' top-1 are not comparable."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.commands.fit import (
    MAX_MINUTES,
    MAX_TRIES,
    TRY_NEVER,
    TRY_SETS,
    as_json,
    fits_in,
    memory_cap,
    replicas_of,
    search,
    unclosed,
)
from bench.config.options import without
from bench.config.run_config import RunConfig
from bench.records.files import write_text_atomic
from bench.tools.errors import ConfigError
from bench.tools.terminal import count


def take_max(passed_on: list[str]) -> tuple[bool, list[str]]:
    """Whether `--batch-size max` is among the run options, and the options without it."""
    found = any(arg == "--batch-size=max" or (arg == "--batch-size" and value == "max")
                for arg, value in zip(passed_on, [*passed_on[1:], None]))
    return found, without(passed_on, ("--batch-size",)) if found else passed_on


def _device_name(cfg: RunConfig) -> str:
    if cfg.cpu:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("--batch-size max on CUDA needs a visible GPU; add --cpu and "
                          "--memory-limit GiB to find CPU batches")
    return torch.cuda.get_device_name(0)


@dataclass(frozen=True)
class LargestBatch:
    """How a sweep finds each combination's batch: the limit, where the search starts, and
    the device its cache entries belong to."""

    memory_limit: float | None  # GiB, all processes of a CPU try
    gpu_memory: float | None  # GiB a rank may use of its GPU
    start: int  # first per-replica batch tried
    limit_bytes: int | None
    fits_in: str  # as the workload names it: "6 GiB (CPU, all processes)"
    device: str

    @classmethod
    def plan(cls, base: RunConfig, memory_limit: float | None, gpu_memory: float | None,
             start: int) -> LargestBatch:
        """Validated before anything runs: one line naming the fix where it cannot be."""
        if start < 1:
            raise ConfigError(f"--fit-start must be at least 1 (got {start})")
        limit = memory_cap(base, memory_limit, gpu_memory)
        return cls(memory_limit, gpu_memory, start, limit,
                   fits_in(base, memory_limit, gpu_memory), _device_name(base))

    def _cache(self, output: str, key: str) -> Path:
        return Path(output) / "fits" / f"{key}.json"

    def global_batch(self, strategy: str, gpus: int, key: str, run_args: list[str],
                     output: str, say: Callable[[str], None]) -> tuple[int | None, str]:
        """(the combination's global batch, how it was found) or (None, why none fits)."""
        replicas = replicas_of(strategy, gpus, self.device == "cpu")
        path = self._cache(output, key)
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            found = None
        if (isinstance(found, dict) and found.get("device") == self.device
                and found.get("fits_in") == self.fits_in
                and isinstance(found.get("largest_batch_per_replica"), int)):
            lo = found["largest_batch_per_replica"]
            why = found.get("unclosed")
            return lo * replicas, (f"{lo} per replica, found before ({path})"
                                   + (f"; not closed in: {why}" if why else ""))
        args = ["--strategy", strategy, "--gpus", str(gpus),
                *without(run_args, TRY_SETS + TRY_NEVER)]
        lo, tries = search(self.start, replicas, args, self.limit_bytes, self.gpu_memory,
                           MAX_TRIES, 60 * MAX_MINUTES, say=say)
        if lo is None:
            last = tries[-1].cause if tries else "no try ran"
            return None, f"no batch fits {self.fits_in} (bench fit: {last})"
        write_text_atomic(path, json.dumps(
            {**as_json(strategy, gpus, self.memory_limit, self.gpu_memory, lo, tries),
             "device": self.device, "fits_in": self.fits_in}, indent=1))
        why = unclosed(lo, tries)
        return lo * replicas, (f"{lo} per replica, found in "
                               f"{count(len(tries), 'try', 'tries')}"
                               + (f"; not closed in: {why}" if why else ""))
