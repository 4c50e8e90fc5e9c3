"""``--mllog FILE``: the run's events in MLPerf's log format, written by global rank 0 with the
``mlperf-logging`` package's own ``mllog``, so MLPerf's tools (its parser, compliance checker
and result summarizer) read a bench run like a submission's log.

The log is MLPerf's view of the run: it stops (``run_stop``, status ``success``) at the first
evaluation that reaches ``--target-top1``, as an MLPerf run does, even when bench trains on
(without ``--stop-at-target``; the record keeps every epoch). Without a target, ``run_stop``
comes after the last epoch with status ``success``; a run that fails, diverges or is
interrupted ends with status ``aborted``. Accuracy is a fraction (0.72), as MLPerf logs it.

A run torchrun starts again (``--max-restarts``) keeps every attempt in the one log: the failed
attempt's events, ending ``aborted`` (said by the next attempt where its rank 0 died
without a word), then the next from ``init_start`` on. Its time runs from
the first ``run_start``, as the run's did; a log that began again at the restart read as a
clean run that took only the last attempt's time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

import bench
from bench.tools import terminal
from bench.tools.errors import ConfigError
from bench.tools.folders import file_to_write
from bench.tools.restarts import restart_count

PACKAGE_HINT = "pip install mlperf-logging (or pip install -e '.[mllog]')"


def check_mllog_path(path: str, run_id: str, made_before: tuple[Path, ...] = ()) -> str:
    """The absolute log path for this run (``{run_id}`` in the name is replaced), once the
    package is importable and the folder writable; otherwise a ConfigError naming the fix.
    MADE_BEFORE: folders the run makes before it writes the log (its --output, and runs/
    under it), which need not exist yet when the run is checked."""
    if importlib.util.find_spec("mlperf_logging") is None:
        raise ConfigError(f"--mllog needs the mlperf-logging package: {PACKAGE_HINT}")
    typed = Path(path)
    if "{run_id}" in str(typed.parent):  # a folder that cannot exist before the run
        folder = Path(*[p for p in typed.parent.parts if "{run_id}" not in p] or ["."])
        name = typed.name if "{run_id}" in typed.name else "{run_id}-" + typed.name
        raise ConfigError(f"--mllog {path}: {{run_id}} goes in the file's name, not its "
                          f"folder's, e.g. {folder / name}")
    return str(file_to_write("--mllog", path.replace("{run_id}", run_id), "run.log",
                             typed=path, made_before=made_before))


class MLPerfLog:
    """One run's MLPerf events. ``open`` writes the submission fields and hyper-parameters
    and ``init_start``; the trainer calls the rest in order. After ``run_stop`` nothing more
    is written."""

    def __init__(self, path: str) -> None:
        from mlperf_logging.mllog import constants, mllog

        self.constants = constants
        self._logger = logging.getLogger(f"parallel-bench.mllog.{os.getpid()}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        again = restart_count() > 0  # after the attempt before: every attempt stays in it
        if again:
            _end_last_line(path)
        self._handler = _LogFile(path, mode="a" if again else "w", encoding="utf-8")
        self._logger.addHandler(self._handler)
        # call sites as the trainer's lines, relative to the checkout
        self._log = mllog.MLLogger(logger=self._logger, default_stack_offset=2,
                                   root_dir=str(Path(bench.__file__).resolve().parents[1]))
        self.stopped = False
        if again:
            self._stop_the_attempt_before(path)

    def _stop_the_attempt_before(self, path: str) -> None:
        """The attempt before this one ends ``aborted`` though its rank 0 could not say so:
        killed (SIGKILL, the kernel's out-of-memory killer, torchrun's kill of a rank that
        outlived its grace) or stuck in a collective until its launcher ended it, it left a
        ``run_start`` without a ``run_stop``, and the log read as one run whose first
        attempt never ended. The stop takes the time of that attempt's last event."""
        import json

        events = []
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    if line.startswith(":::MLLOG "):
                        event = json.loads(line[len(":::MLLOG "):])
                        if isinstance(event, dict):
                            events.append(event)
        c = self.constants
        starts = [i for i, e in enumerate(events) if e.get("key") == c.INIT_START]
        attempt = events[starts[-1]:] if starts else events
        started = [e.get("key") for e in attempt]
        if c.RUN_START in started and c.RUN_STOP not in started:
            time_ms = attempt[-1].get("time_ms")
            self._log.end(key=c.RUN_STOP, metadata={c.STATUS: c.ABORTED},
                          time_ms=time_ms if isinstance(time_ms, (int, float)) else None)

    @staticmethod
    def constants_module():
        """``mlperf_logging.mllog.constants``: MLPerf's names for events and fields."""
        from mlperf_logging.mllog import constants

        return constants

    @classmethod
    def open(cls, path: str, *, benchmark: str, platform: str, hyperparameters: dict,
             target_top1: float | None) -> MLPerfLog:
        log = cls(path)
        c = log.constants
        log._log.event(key=c.CACHE_CLEAR, value=True)
        log._log.start(key=c.INIT_START)
        for key, value in ((c.SUBMISSION_BENCHMARK, benchmark),
                           (c.SUBMISSION_ORG, "parallel-bench"),
                           (c.SUBMISSION_DIVISION, c.OPEN),
                           (c.SUBMISSION_STATUS, c.RESEARCH),
                           (c.SUBMISSION_PLATFORM, platform), *hyperparameters.items()):
            log._log.event(key=key, value=value)
        if target_top1 is not None:
            log._log.event(key="target_accuracy", value=target_top1 / 100)
        return log

    def run_start(self) -> None:
        self._log.end(key=self.constants.INIT_STOP)
        self._log.start(key=self.constants.RUN_START)

    def epoch_start(self, epoch: int) -> None:
        self._event("start", self.constants.EPOCH_START, epoch)

    def epoch_stop(self, epoch: int) -> None:
        self._event("end", self.constants.EPOCH_STOP, epoch)

    def eval_start(self, epoch: int) -> None:
        self._event("start", self.constants.EVAL_START, epoch)

    def eval_stop(self, epoch: int, top1: float, reached: bool) -> None:
        """The evaluation's end and its accuracy; at the target, the run's end too."""
        self._event("end", self.constants.EVAL_STOP, epoch)
        self._event("event", self.constants.EVAL_ACCURACY, epoch, value=top1)
        if reached:
            self.run_stop(success=True)

    def run_stop(self, success: bool) -> None:
        if self.stopped:
            return
        c = self.constants
        self._log.end(key=c.RUN_STOP,
                      metadata={c.STATUS: c.SUCCESS if success else c.ABORTED})
        self.stopped = True
        self._handler.flush()

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()

    @property
    def failure(self) -> str | None:
        """Why the log stopped before the run did (None: it is whole), for the record."""
        return self._handler.failure

    def _event(self, kind: str, key: str, epoch: int, value=None) -> None:
        """Called from the method the trainer called: the call site is 3 frames up."""
        if self.stopped:
            return
        getattr(self._log, kind)(key=key, value=value, stack_offset=3,
                                 metadata={self.constants.EPOCH_NUM: epoch})


def _end_last_line(path: str) -> None:
    """A newline after the log's last line where it has none: a rank killed mid-write cut
    it short, and the next attempt's first event would be read as part of it."""
    with contextlib.suppress(OSError), open(path, "rb+") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


class _LogFile(logging.FileHandler):
    """The log's file, which cannot end the run: the training is what matters. A write that
    fails (a full disk, a quota) is one warning on the terminal, the log stops there, and
    the record's notes say so; logging's own handler would print a traceback per event, and
    its flush at the target or the end raised and failed the run in its evaluation."""

    failure: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failure is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        self._failed(sys.exc_info()[1])

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            self._failed(exc)

    def close(self) -> None:
        try:
            super().close()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException | None) -> None:
        if self.failure is not None:
            return
        why = getattr(exc, "strerror", None) or str(exc)
        self.failure = (f"MLPerf log {self.baseFilename} incomplete: a write failed ({why}); "
                        "the run went on without it")
        print(terminal.fill(f"bench: warning: {self.failure}", subsequent_indent="  "),
              file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):
            if self.stream is not None:
                self.stream.close()  # what it still buffers can never be written
        self.stream = None


class NoLog:
    """Stands in for MLPerfLog when the run has no --mllog (and on every rank but 0)."""

    failure = None

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None
