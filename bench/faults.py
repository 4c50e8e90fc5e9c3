"""``BENCH_FAULT``: a test hook that makes one rank fail for real at a chosen step."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """``raise:RANK:STEP`` (that rank raises) or ``hang:RANK:STEP`` (it stops taking part),
    before global optimizer step STEP (counted from 1)."""

    kind: str
    rank: int
    step: int

    @classmethod
    def from_env(cls) -> Fault | None:
        text = os.environ.get("BENCH_FAULT")
        if not text:
            return None
        kind, rank, step = text.split(":")
        if kind not in ("raise", "hang"):
            raise ValueError(f"BENCH_FAULT kind must be raise or hang, got {kind!r}")
        return cls(kind, int(rank), int(step))

    def maybe_fire(self, rank: int, step: int) -> None:
        if rank != self.rank or step != self.step:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault (BENCH_FAULT) at step {step}")
        while True:  # hang: never reach the next collective
            time.sleep(60)

