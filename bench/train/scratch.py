"""A run's scratch folder: the files through which ranks talk to the process that launched
them. One place names them, for the worker, the runner and the launchers alike."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.tools.lifetime import still_running
from bench.tools.restarts import restart_count

# A folder without its launcher file is being created (for microseconds) or removed, or is
# what a dying torchrun agent made again after its run removed it: gone after this long, if
# its name is one that ``Scratch.create`` gives (a run id's date, mkdtemp's suffix).
_UNOWNED_S = 600
_SCRATCH_NAME = re.compile(r"bench-\d{8}\S*-[a-z0-9_]{8}")
# What a rank raises once a peer has died (gloo's transport; a pipe to it)
_BROKEN_CONNECTION = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe")


# The end of the error line the launcher's watchdog writes for a rank it ended so that
# torchrun starts the ranks again (Launch.end_stuck_rank; the terminal's account reads it)
ENDED_FOR_RESTART = "bench ended it for torchrun to start the ranks again"


def read_beat(path: Path) -> tuple[str, int]:
    """(phase, attempt) of a heartbeat file: its first line the rank's phase, its second the
    attempt (torchrun's restart count) of the rank that wrote it."""
    phase, _, attempt = path.read_text(errors="replace").partition("\n")
    try:
        return phase.strip(), int(attempt or 0)
    except ValueError:  # half-written
        return phase.strip(), 0


def remove_orphans() -> None:
    """Scratch folders of this user whose launcher (on this host) no longer runs, and those
    without a launcher file left untouched for ``_UNOWNED_S``."""
    host = socket.gethostname()
    for folder in Path(tempfile.gettempdir()).glob("bench-*"):
        try:
            info = folder.stat()
            if info.st_uid != os.getuid():
                continue
            try:
                pid, owner_host = (folder / "launcher").read_text().split()
            except FileNotFoundError:
                if (time.time() - info.st_mtime < _UNOWNED_S
                        or not _SCRATCH_NAME.fullmatch(folder.name)):
                    continue
            else:
                if owner_host != host or still_running(int(pid)):
                    continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Scratch:
    """``root/spec.json`` (the WorkerSpec), per rank ``pid-rank{r}`` (to reap it),
    ``beat-rank{r}`` (heartbeat: mtime, phase and attempt) and ``error-rank{r}.json`` (its
    ``RankError``), ``attempt`` (torchrun's restart count, once it has restarted the
    ranks), ``failed-attempt-{a}`` (the launcher's account of what ended attempt a, for the
    next attempt's record), ``rank0-here`` (global rank 0 ran on this machine) and
    ``root-cause.txt`` (how a rank died that could not say so, from its launcher's output)."""

    root: Path

    @classmethod
    def create(cls, run_id: str) -> Scratch:
        """A new folder, owned by this (launching) process; folders left behind by launchers
        that were killed outright (SIGKILL: no chance to clean up) are removed first."""
        remove_orphans()
        scratch = cls(Path(tempfile.mkdtemp(prefix=f"bench-{run_id}-")))
        scratch.launcher.write_text(f"{os.getpid()} {socket.gethostname()}\n")
        return scratch

    @property
    def launcher(self) -> Path:
        """``PID HOST`` of the launching process that owns the folder."""
        return self.root / "launcher"

    def launcher_pid(self) -> int | None:
        """The launching process's pid, where it runs on this machine (else None)."""
        try:
            pid, host = self.launcher.read_text().split()
            return int(pid) if host == socket.gethostname() else None
        except (OSError, ValueError):
            return None

    def exists(self) -> bool:
        return self.root.is_dir()

    def remove(self) -> None:
        """The folder and all in it, once the run (or probe) is over; a launcher killed
        outright leaves it to the next ``create``."""
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def spec(self) -> Path:
        return self.root / "spec.json"

    @property
    def rank0_here(self) -> Path:
        return self.root / "rank0-here"

    @property
    def root_cause(self) -> Path:
        """Written by a launcher whose output told how a rank died that could not say so (a
        signal, NCCL's watchdog)."""
        return self.root / "root-cause.txt"

    def signal_death(self, rank: int | str, signum: int) -> None:
        """Record that ``rank`` was killed by ``signum``, with the phase it last reported."""
        self.root_cause.write_text(self.killed_line(rank, signum) + "\n")

    def killed_line(self, rank: int | str, signum: int) -> str:
        """'rank 1 was killed by signal 9 (SIGKILL) [in the phase it last reported]'."""
        return (f"rank {rank} was killed by signal {signum} ({signal_name(signum)}) "
                f"[in {self.last_phase(rank)}]")

    def collective_timeout(self, rank: int | str, operation: str, waited_s: float) -> None:
        """Record that NCCL's watchdog ended ``rank``'s collective (it aborts the process,
        which then says nothing itself): a peer stopped taking part."""
        self.root_cause.write_text(
            f"timeout: rank {rank}: NCCL's watchdog ended its {operation} after {waited_s:.0f} s "
            f"(--timeout): a rank stopped taking part [in {self.last_phase(rank)}]\n")

    def last_phase(self, rank: int | str) -> str:
        """The phase ``rank`` last wrote to its heartbeat file."""
        try:
            return read_beat(self.beat(rank))[0] or "start-up"
        except OSError:
            return "start-up"

    def pid(self, rank: int | str) -> Path:
        return self.root / f"pid-rank{rank}"

    def beat(self, rank: int | str) -> Path:
        return self.root / f"beat-rank{rank}"

    def error(self, rank: int | str) -> Path:
        return self.root / f"error-rank{rank}.json"

    def write_error(self, rank: int | str, error: RankError) -> None:
        """Write whole or not at all (renamed into place): the launcher reads it."""
        part = self.root / f"part-error-rank{rank}"
        part.write_text(json.dumps(asdict(error)))
        part.replace(self.error(rank))

    def pids(self) -> list[Path]:
        return list(self.root.glob("pid-rank*"))

    def ranks(self) -> list[str]:
        """The ranks that started here (their pid files)."""
        return [p.name.removeprefix("pid-rank") for p in self.pids()]

    def rank_pids(self) -> list[int]:
        """The pids the ranks wrote (unreadable or half-written files skipped)."""
        pids = []
        for path in self.pids():
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text()))
        return pids

    def beats(self) -> list[tuple[str, Path]]:
        """(rank, heartbeat file) for every rank that has beaten."""
        return [(p.name.removeprefix("beat-rank"), p) for p in self.root.glob("beat-rank*")]

    @property
    def attempt_file(self) -> Path:
        """torchrun's restart count of the attempt that started last (--max-restarts),
        written by its ranks as they start; no file: the first attempt."""
        return self.root / "attempt"

    def failed_attempt(self, attempt: int) -> Path:
        """What ended ``attempt`` as its launcher told it (RestartLines): the cause where no
        rank could say one (a rank killed outright), which the next attempt's record keeps."""
        return self.root / f"failed-attempt-{attempt}"

    def tell_failed_attempt(self, attempt: int, cause: str) -> None:
        part = self.root / f"part-failed-{os.getpid()}"
        part.write_text(cause)
        part.replace(self.failed_attempt(attempt))

    def start_attempt(self, attempt: int) -> None:
        part = self.root / f"part-attempt-{os.getpid()}"
        part.write_text(str(attempt))
        part.replace(self.attempt_file)

    def attempt(self) -> int:
        """The attempt running, or the last that ran (0: the first)."""
        try:
            return int(self.attempt_file.read_text())
        except (OSError, ValueError):
            return 0

    def has_errors(self) -> bool:
        """Whether a rank of the attempt running has written its error file (cheaper than
        ``errors`` where torchrun never restarted the ranks)."""
        if not self.attempt_file.exists():
            return next(self.root.glob("error-rank*.json"), None) is not None
        with contextlib.suppress(OSError):
            return bool(self.errors())
        return False

    def _errors(self, attempt: int | None) -> list[tuple[str, Path, RankError | None]]:
        """(rank, error file, its error; None where it could not be read) of ``attempt``
        (None: the last attempt that started), oldest first, each file read once; one that
        cannot be read counts as the attempt's."""
        files = sorted(self.root.glob("error-rank*.json"), key=lambda p: p.stat().st_mtime)
        if attempt is None:
            attempt = self.attempt()
        found = []
        for path in files:
            error = None
            with contextlib.suppress(OSError, ValueError, KeyError):
                error = RankError.read(path)
            if error is None or error.attempt == attempt:
                found.append((path.stem.removeprefix("error-rank"), path, error))
        return found

    def errors(self, attempt: int | None = None) -> list[tuple[str, Path]]:
        """(rank, error file), oldest first: the first is the failure, the rest followed.
        Where torchrun restarted the ranks, those of ``attempt`` (0: the first), of the
        last attempt that started by default: the files of an attempt before (a rank that
        failed and then ran clean, or was killed without a word) would name its failure
        as the run's."""
        return [(rank, path) for rank, path, _ in self._errors(attempt)]

    def said_errors(self, attempt: int | None = None) -> list[tuple[str, RankError]]:
        """(rank, its error) of ``attempt`` (``errors``'s default: the attempt running),
        oldest first; a file that went away or is not whole is left out."""
        try:
            return [(rank, error) for rank, _, error in self._errors(attempt)
                    if error is not None]
        except OSError:  # a file went away while the folder was read
            return []

    def cause_of(self, attempt: int) -> tuple[str, RankError] | None:
        """(rank, its error) of the rank whose failure ended ``attempt``, as its ranks said
        it: the first that is not a broken connection (a peer's death, a consequence), else
        the first; None where no rank said one (a rank killed by a signal cannot)."""
        return first_cause(self.said_errors(attempt))


def signal_name(signum: int) -> str:
    """SIGKILL for 9; 'unknown signal' for a number no signal has."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


def first_cause(said: list[tuple[str, RankError]]) -> tuple[str, RankError] | None:
    """Of the errors ranks said, oldest first: the first that is not a broken connection
    (a peer's death, a consequence), else the first; None for none."""
    return next((found for found in said if not found[1].peer_gone()), said[0] if said else None)


@dataclass(frozen=True)
class RankError:
    """What a failing rank says: its one line (ending with the phase), whether that line
    already says what to do (out of memory, a timeout, bad input met under way: its
    traceback, kept in the record, would add nothing on the terminal), and its traceback."""

    line: str
    explained: bool
    traceback: str
    attempt: int = 0  # torchrun's restart count when it failed (--max-restarts)
    # written by the launcher's watchdog for a rank it ended so that torchrun restarts the
    # ranks (Launch.end_stuck_rank), not by the rank: what ended the attempt is the watchdog
    ended_for_restart: bool = False

    def said_by(self, rank: int | str) -> str:
        """Its line with the rank that said it: 'rank 1: RuntimeError: ... [in ...]', and
        'timeout: rank 0: ...' for a timeout (the run's error and the terminal read so)."""
        if self.line.startswith("timeout: "):
            return f"timeout: rank {rank}: {self.line.removeprefix('timeout: ')}"
        return f"rank {rank}: {self.line}"

    def traceback_tail(self) -> str:
        """The end of its traceback (where the cause is), "" where it has none."""
        return self.traceback.strip()[-20_000:]

    def peer_gone(self) -> bool:
        """Whether it is what a rank raises once a peer has died: a consequence."""
        return _BROKEN_CONNECTION.search(self.line) is not None

    @classmethod
    def read(cls, path: Path) -> RankError:
        data = json.loads(path.read_text())
        return cls(str(data["line"]), bool(data["explained"]), str(data["traceback"]),
                   int(data.get("attempt", 0)), bool(data.get("ended_for_restart", False)))


class Heartbeat:
    """Writes this rank's phase into its ``beat-rank{r}`` at every call (a step, a batch),
    so the launcher's watchdog can tell a slow rank from a stuck one by the file's age, and
    name where a stuck rank stopped. It owns the rank's phase: the error report names it.

    Every call rewrites the file in place, in one ``pwrite`` of a fixed length (1.8 us here;
    opening and writing the file took 260): a write at most once a second left a rank
    stopped at step 3 named '[in train epoch 1 step 1]'."""

    PHASE_BYTES = 160  # the phase's room in the file, padded with spaces (longer: cut)

    def __init__(self, scratch: Scratch) -> None:
        self.scratch = scratch
        self.phase = "start-up"
        self.path: Path | None = None  # no file until the rank is known
        self.fd: int | None = None  # opened at the first beat, kept open for the rank's life
        self.attempt = restart_count()  # the watchdog tells an ended attempt's beats by it

    def bind(self, rank: int) -> None:
        """Beat for this rank from now on (once the strategy has joined its group)."""
        self.path = self.scratch.beat(rank) if self.scratch.exists() else None

    @contextlib.contextmanager
    def through(self, phase: str, limit: float):
        """Beat every second from a thread while one long call runs (a compile warm-up,
        whose rank cannot beat from inside it), as ``phase (N s)``, for at most ``limit``
        seconds: past it the beats stop and the watchdog ends the run in that phase."""
        done = threading.Event()
        started = time.monotonic()

        def beat() -> None:
            while not done.wait(1.0) and time.monotonic() - started < limit:
                self(f"{phase} ({time.monotonic() - started:.0f} s of at most {limit:.0f})")

        self(phase)
        thread = threading.Thread(target=beat, name="bench-beat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self(phase)

    def __call__(self, phase: str) -> None:
        self.phase = phase
        if self.path is None:
            return
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        text = phase.encode(errors="replace")[:self.PHASE_BYTES].ljust(self.PHASE_BYTES)
        os.pwrite(self.fd, text + f"\n{self.attempt}".encode(), 0)
