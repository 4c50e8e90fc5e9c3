"""What a rank prints while it trains: the progress bar of an epoch and the line after it."""

from __future__ import annotations

import os
import sys
from typing import Any

from bench.measure.gpu_clocks import epoch_suffix


def progress_bar(enabled: bool, steps: int, epoch: int, epochs: int):
    """tqdm over one epoch's steps (rank 0 only), or None."""
    if not enabled:
        return None
    from tqdm import tqdm

    # Under torchrun / launch / horovodrun stderr is a pipe to bench, which passes it on to
    # its terminal as it comes (BENCH_TTY=1 says that terminal is one): draw there too.
    drawn = sys.stderr.isatty() or os.environ.get("BENCH_TTY") == "1"
    return tqdm(total=steps, desc=f"epoch {epoch + 1}/{epochs}", leave=False, unit="step",
                disable=not drawn, file=sys.stderr)


def epoch_line(strategy: str, epochs: int, entry: dict[str, Any], width: int = 120) -> str:
    """One epoch on the terminal (top-5 is in the record); the GPUs' figures go on a line of
    their own when both would not fit in ``width`` columns."""
    waited = entry["input_wait_s"] / entry["train_time_s"]
    line = (f"[{strategy}] epoch {entry['epoch']}/{epochs}  "
            f"{entry['train_time_s']:.2f}s  {entry['images_per_s']:.0f} img/s  "
            f"input wait {100 * waited:.0f}%  loss {entry['train_loss']:.3f}  "
            f"top1 {100 * entry['top1']:.2f}%")
    gpus = epoch_suffix(entry.get("gpu_clocks"))
    return line + gpus if len(line + gpus) <= width else f"{line}\n  {gpus}"
