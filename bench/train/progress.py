"""What a rank prints while it trains: the progress bar of an epoch and the line after it."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from bench.measure.gpu_clocks import epoch_suffix
from bench.tools.terminal import columns, duration, fill


def progress_bar(enabled: bool, steps: int | None, epoch: int, epochs: int,
                 what: str = "epoch"):
    """tqdm over one epoch's steps, or its evaluation's batches (``what``: "eval"), or None
    where no bar is shown (rank 0 only, with progress on). ``steps`` None: not known."""
    if not enabled:
        return None
    from tqdm import tqdm

    # Under torchrun / launch / horovodrun stderr is a pipe to bench, which passes it on to
    # its terminal as it comes (BENCH_TTY=1 says that terminal is one): draw there too.
    # tqdm measures a terminal, not a pipe: there it takes bench's width (COLUMNS, passed
    # on), less the column a line that fills the terminal would wrap at. A bar wider than
    # its terminal folds, and each redraw then left a line behind.
    here = sys.stderr.isatty()
    drawn = here or os.environ.get("BENCH_TTY") == "1"
    return tqdm(total=steps, desc=f"{what} {epoch + 1}/{epochs}", leave=False,
                unit="step" if what == "epoch" else "batch",
                disable=not drawn, file=sys.stderr, ncols=None if here else columns() - 1)


class RunClock:
    """How long the run has left, from its pace so far (rank 0, with progress on): the
    current epoch's steps, then the later epochs at the length of the last whole one
    (evaluation included); in the first epoch, at its own pace, evaluation not counted.
    And the ``after`` steps of the run's shape it takes once its epochs are done (the
    compute-only probe's, the profiled ones), at the pace of a training step: on a CPU
    the probe's 22 steps took 66 s after two epochs of 27 s, and a run said to need
    "about 55 s" took 128."""

    FIRST_SAY = 5  # steps of the first epoch before the run's length is said
    # the steps after the epochs are said (in the run's length, and as they start) where
    # they take this long: a GPU's 22 probe steps (0.6 s) are not worth a word
    SAY_AFTER_S = 5.0

    def __init__(self, strategy: str, epochs: int, steps_per_epoch: int, after: int = 0):
        self.strategy, self.epochs, self.steps = strategy, epochs, steps_per_epoch
        self.after = after
        self.epoch, self.started, self.done, self.last_epoch_s = 0, 0.0, 0, None
        self.step_s: float | None = None  # the current epoch's seconds a step so far
        self.said = False

    def start_epoch(self, epoch: int) -> None:
        now = time.perf_counter()
        if self.started and epoch == self.epoch + 1:
            self.last_epoch_s = now - self.started  # its training and its evaluation
        self.epoch, self.started, self.done = epoch, now, 0

    def left_s(self) -> float | None:
        """Seconds the run has left, or None before a few steps show the pace."""
        if self.done < min(self.FIRST_SAY, self.steps) or self.step_s is None:
            return None
        later = self.epochs - self.epoch - 1
        per_epoch = self.last_epoch_s if self.last_epoch_s is not None else self.step_s * self.steps
        return (self.steps - self.done + self.after) * self.step_s + later * per_epoch

    def step(self, bar) -> None:
        """One step done: the bar's 'run … left', and once, early in the first epoch, a
        line with the whole run's expected length."""
        self.done += 1
        self.step_s = (time.perf_counter() - self.started) / self.done
        left = self.left_s()
        if left is None:
            return
        if bar is not None:
            bar.set_postfix_str(f"run ≈ {duration(left)} left", refresh=False)
        if not self.said and self.epoch == 0:
            self.said = True
            after = self.after * self.step_s
            epochs = left - after + time.perf_counter() - self.started
            then = (f", then {duration(after)} for {self.after} measuring steps"
                    if after >= self.SAY_AFTER_S else "")
            say(fill(f"[{self.strategy}] about {duration(epochs)} for {self.epochs} epoch"
                     f"{'s' * (self.epochs != 1)}{then} (from the first {self.done} steps, "
                     "the warm-up's pace; evaluation not counted)", subsequent_indent="    "),
                bar)

    def measuring(self, steps: int, what: str) -> None:
        """Said as steps after the epochs begin, where they take a while (5 s or more at
        the epochs' pace): how long, and what for."""
        if steps and self.step_s is not None and steps * self.step_s >= self.SAY_AFTER_S:
            say(fill(f"[{self.strategy}] {steps} more steps, about "
                     f"{duration(steps * self.step_s)}: {what}", subsequent_indent="    "), None)


def say(line: str, bar) -> None:
    """A line of the run's progress: above the bar where one is drawn, else on stderr."""
    if bar is not None and not bar.disable:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def epoch_line(strategy: str, epochs: int, entry: dict[str, Any], width: int | None = None
               ) -> str:
    """One epoch on the terminal (top-5 is in the record); the GPUs' figures go on a line of
    their own when both would not fit in ``width`` columns (the terminal's: ``columns``)."""
    waited = entry["input_wait_s"] / entry["train_time_s"]
    line = (f"[{strategy}] epoch {entry['epoch']}/{epochs}  "
            f"{entry['train_time_s']:.2f}s  {entry['images_per_s']:.0f} img/s  "
            f"input wait {100 * waited:.0f}%  loss {entry['train_loss']:.3f}  "
            f"top1 {100 * entry['top1']:.2f}%")
    gpus = epoch_suffix(entry.get("gpu_clocks"))
    return line + gpus if len(line + gpus) <= (width or columns()) else f"{line}\n  {gpus}"
