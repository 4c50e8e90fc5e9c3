"""What a launcher and its ranks print: passed on to bench's terminal as it comes, kept (the
end of it) to find what a rank could not say itself (the signal that killed it, the
collective NCCL's watchdog ended), and, for horovodrun, given back as the ranks wrote it."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TextIO

from bench.tools import terminal
from bench.train.scratch import Scratch, first_cause, signal_name

Rewrite = Callable[[str], str]


class _EchoedLine:
    """Whether what the ranks printed last left a line open (a progress bar's redraw ends
    without a newline): bench's own line after it would be glued to the bar's end."""

    open = False


def end_open_line(out: TextIO | None = None) -> None:
    """End the line the ranks' output left open, before bench prints its own."""
    if _EchoedLine.open:
        (out or sys.stderr).write("\n")
        _EchoedLine.open = False


def tee(stream, tail: collections.deque[str], echo: threading.Event,
        quiet_after_failure: Scratch | None = None, out: TextIO | None = None,
        rewrite: Rewrite | None = None) -> None:
    """Pass ``stream`` on to ``out`` (stderr by default) as it comes, not line by line (a
    progress bar redraws its line with carriage returns), while ``echo`` is set, through
    ``rewrite`` if given; keep the end of it as it came. Once a rank of
    ``quiet_after_failure`` has written its error file, nothing more is passed on: its own
    traceback, its peers' (broken connections, a consequence) and the launcher's report would
    bury the cause, which bench prints once at the end."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            text = rewrite("") if rewrite is not None else ""
        else:
            text = chunk.decode(errors="replace") if isinstance(chunk, bytes) else chunk
            tail.append(text)
            if rewrite is not None:
                text = rewrite(text)
        if quiet_after_failure is not None and echo.is_set():
            with contextlib.suppress(OSError):
                if quiet_after_failure.has_errors():
                    echo.clear()
        if echo.is_set() and text:
            target = out or sys.stderr
            target.write(text)
            target.flush()
            _EchoedLine.open = text[-1] not in "\r\n"
        if not chunk:
            return


class InheritedStderr:
    """The stderr of ranks this process starts itself (``mp.spawn``), passed on by ``tee``:
    a started process inherits file descriptor 2 as it is at that moment, so during their
    start it is a pipe that this process reads. What the ranks write from C++ (NCCL's
    watchdog, before it aborts one) is then kept too, as a launcher's output is."""

    def __init__(self, quiet_after_failure: Scratch | None) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=4000)
        self.echo = threading.Event()
        self.echo.set()
        self._quiet_after_failure = quiet_after_failure
        self._done = threading.Event()
        self._read_fd = -1
        self._terminal: TextIO | None = None
        self._pump: threading.Thread | None = None

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Inside, whatever starts gets the pipe as its stderr (so does this process's own
        output, passed on like the ranks')."""
        sys.stderr.flush()
        self._read_fd, write_fd = os.pipe()
        self._terminal = terminal = os.fdopen(os.dup(2), "w", errors="replace")
        self._pump = threading.Thread(
            target=tee, args=(_UntilDone(self._read_fd, self._done), self.tail, self.echo,
                              self._quiet_after_failure, terminal, OnceAcrossRanks()),
            daemon=True)
        self._pump.start()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(terminal.fileno(), 2)

    def close(self) -> str:
        """Once the ranks have ended: pass on what is left and return the end of it all."""
        if self._pump is not None:
            self._done.set()
            self._pump.join(timeout=5)
            if not self._pump.is_alive():
                os.close(self._read_fd)
                self._terminal.close()
        return "".join(self.tail)


class _UntilDone:
    """A pipe's read end whose ``read1`` ends (b"") at its end or, once ``done`` is set,
    when nothing more is waiting in it: a process the ranks started may outlive them with a
    copy of its write end (a loader worker being reaped)."""

    def __init__(self, fd: int, done: threading.Event) -> None:
        self.fd, self.done = fd, done

    def read1(self, size: int) -> bytes:
        while True:
            if select.select([self.fd], [], [], 0.1)[0]:
                return os.read(self.fd, size)
            if self.done.is_set():
                return b""


_REPORT = "Root Cause (first observed failure):"
_FAILURE = re.compile(r"time\s*:\s*(\S+).*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_AFTER_A_PEER = {signal.SIGABRT, signal.SIGTERM}  # how ranks end once a peer has died


def own_death(signum: int) -> bool:
    """Whether a rank ended by ``signum`` (0 or less: none) was killed for its own sake, not
    aborted on a broken collective or stopped by its launcher once a peer had died."""
    return signum > 0 and signum not in _AFTER_A_PEER


def torchrun_root_cause(text: str) -> tuple[int, int] | None:
    """(rank, signal) when torchrun's failure report blames, or should blame, a rank killed
    by a signal.

    torchrun lists every rank that ended, the peers it stopped (SIGTERM) included, and names
    the earliest as root cause; failures seen in one poll share a timestamp (to the second),
    so it names the lowest rank. A peer that failed at once on its broken collective (exit
    code 1, or SIGABRT), or that torchrun stopped, can then take the blame of a rank killed by
    another signal in the same poll: that one is named.
    """
    at = text.rfind(_REPORT)
    root = _FAILURE.search(text, at) if at >= 0 else None
    if root is None:
        return None
    time, rank, code = root.group(1), int(root.group(2)), int(root.group(3))
    if own_death(-code):
        return rank, -code
    listed = text.rfind("Failures:", 0, at)
    for other_time, other, other_code in _FAILURE.findall(text[listed if listed >= 0 else at:]):
        if other_time == time and own_death(-int(other_code)):
            return int(other), -int(other_code)
    return (rank, -code) if code < 0 else None


# What ProcessGroupNCCL's watchdog logs before it aborts a rank whose collective outlived
# the group's timeout (WorkNCCL::checkTimeout; "[PG ID 0 PG GUID 0(default_pg) Rank 1] ",
# "[Rank 1] " in older torch): the rank, the operation and how long it ran.
_NCCL_TIMEOUT = re.compile(r"Rank (\d+)\] Watchdog caught collective operation timeout: "
                           r"WorkNCCL\(SeqNum=\d+, OpType=(\w+)[^\n]*?\) ran for (\d+) "
                           r"milliseconds")


def nccl_watchdog_timeout(text: str) -> tuple[int, str, float] | None:
    """(rank, operation, seconds it ran) of the first collective NCCL's watchdog ended."""
    found = _NCCL_TIMEOUT.search(text)
    if found is None:
        return None
    return int(found.group(1)), found.group(2), int(found.group(3)) / 1000


# What torchrun's (and torch.distributed.launch's) agent logs once a rank has ended: the
# SIGTERM it sends the others, the rank's exit code, then its ChildFailedError traceback and
# report. Like the peers' broken connections, a consequence of the death bench names itself.
_AGENT_AFTER_A_DEATH = re.compile(
    r"^[^\n]*torch/distributed/elastic/[^\n]*\] (?:Sending process \d+ closing signal"
    r"|failed \(exitcode: -?\d+\))", re.M)


# A warning torch's C++ logs in a rank ("[rank1]:[W1130 14:19:16.639759459 reducer.cpp:1529]
# Warning: find_unused_parameters=True was specified ..."): every rank logs the same one
_RANK_WARNING = re.compile(r"^\[rank\d+\]:\[W\d{4} \S+ (\S+)\] ([^\n]*)\n", re.M)


class OnceAcrossRanks:
    """Each warning torch's C++ logs, once for all the ranks (the first rank's line): every
    rank logs it (DDP's `find_unused_parameters=True was specified ... but did not find any
    unused parameters`, 8 copies of a long line at 8 ranks)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, text: str) -> str:
        def first(found: re.Match) -> str:
            key = (found.group(1), found.group(2))
            if key in self.seen:
                return ""
            self.seen.add(key)
            return found.group(0)

        return _RANK_WARNING.sub(first, text)


class TorchrunLines:
    """torchrun's stderr, passed on until its agent logs that a rank has ended, then held
    back: what follows (its report, the peers' tracebacks of a broken connection) only buries
    the cause. A rank that can say why it failed writes its error file first, and bench goes
    quiet then (``tee``); a rank killed by a signal cannot, and torchrun may stop its peers
    before any of them does. Shown only where bench finds no cause (``withheld``)."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.once = OnceAcrossRanks()

    def __call__(self, text: str) -> str:
        text = self.once(text)
        if self.held:
            self.held.append(text)
            return ""
        found = _AGENT_AFTER_A_DEATH.search(text)
        if found is None:
            return text
        self.held.append(text[found.start():])
        return text[:found.start()]

    def withheld(self) -> str:
        return "".join(self.held)


# torchrun's agent's line for a rank that ended (its local rank, exit code: minus a signal)
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


class RestartLines:
    """torchrun's stderr where it may start the ranks again (--max-restarts): passed on,
    but from an attempt's failure to the next attempt's start, one account of it instead of
    what the failure printed (the rank's traceback, its peers' broken connections, the
    agent's lines): which rank failed and why, its traceback where its line does not say
    enough, and the restart. The last attempt torchrun allows fails as any run does: its
    output is held, and bench names the cause at the end (``withheld`` if it cannot)."""

    def __init__(self, scratch: Scratch, restarts: int, nodes: int = 1) -> None:
        self.scratch, self.restarts, self.nodes = scratch, restarts, nodes
        self.attempt = 0  # torchrun's restart count of the attempt running (or that failed)
        self.failed = False  # quiet until the next attempt starts
        self.said = False  # the failure is accounted for
        self.held: list[str] = []
        self.once = OnceAcrossRanks()

    def __call__(self, text: str) -> str:
        text = self.once(text)
        if self.failed:
            if self.scratch.attempt() <= self.attempt:
                self.held.append(text)
                return self._account()
            self.failed, self.held = False, []
        # the attempt running: one of several machines restarts where another's rank failed
        self.attempt = max(self.attempt, self.scratch.attempt())
        death = _AGENT_AFTER_A_DEATH.search(text)
        if death is None and not self.scratch.said_errors(self.attempt):
            return text
        self.failed, self.said = True, False
        self.held.append(text)
        before = text[:death.start()] if death is not None else ""
        return before + self._account(after=before)

    def _account(self, after: str = "") -> str:
        """The failure, said once the agent has logged it (so the cause is known: the
        rank that died of a signal, not the peer whose broken connection came first) and
        where torchrun starts the ranks again, on a line of its own (not glued to a progress
        bar's end, in ``after`` or passed on before); "" until then, and after."""
        account = self._said()
        line_open = after[-1:] not in "\n\r" if after else _EchoedLine.open
        return "\n" + account if account and line_open else account

    def _said(self) -> str:
        """The account's lines, once (``_account``)."""
        if self.said or self.attempt >= self.restarts:
            return ""  # the last attempt's failure: the run's end says it
        agent = _AGENT_FAILED.search("".join(self.held))
        if agent is None:
            return ""
        self.said = True
        code, local = int(agent.group(1)), agent.group(2)
        who = f"local rank {local}" if self.nodes > 1 else f"rank {local}"
        errors = self.scratch.said_errors(self.attempt)
        ranks_said = {rank for rank, _ in errors}  # one may have said it, then died of a signal
        cause = first_cause(errors)
        silent = sorted(set(self.scratch.ranks()) - ranks_said, key=int)
        traceback = ""  # the failing rank's, where its line does not say enough
        wrapped = False  # said within 120 columns (a rank's own line is said whole)
        ended = [(rank, error) for rank, error in errors if error.ended_for_restart]
        if ended:  # the watchdog killed a stuck rank (Launch.end_stuck_rank)
            causes = [error.said_by(rank) for rank, error in ended]
        elif own_death(-code) and (self.nodes > 1 or local not in ranks_said):
            causes = [f"{who} was killed by signal {-code} ({signal_name(-code)})"
                      if self.nodes > 1 else self.scratch.killed_line(local, -code)]
        elif cause is not None and (not cause[1].peer_gone() or not silent):
            rank, error = cause
            causes = [error.said_by(rank) if error.line.startswith("timeout: ")
                      else f"rank {rank} failed: {error.line}"]
            if not error.explained and error.traceback_tail():
                traceback = f"bench: the traceback of rank {rank}:\n{error.traceback_tail()}"
        elif silent:  # torchrun logs one rank's end: the first it saw, not the cause
            causes = [f"rank {rank} ended without a word, as one killed by a signal does (kill "
                      f"-9, the OOM killer) [in {self.scratch.last_phase(rank)}]"
                      for rank in silent]
            wrapped = True
        else:
            causes = [f"{who} exited with code {code} without saying why"]
        # in one line for the next attempt's record (restart_cause): a rank killed outright
        # could not write it itself
        self.scratch.tell_failed_attempt(self.attempt, "; ".join(causes))
        lines = [terminal.fill(f"bench: {c}", subsequent_indent="  ") if wrapped
                 else f"bench: {c}" for c in causes]
        lines += [traceback] if traceback else []
        lines.append(terminal.fill(
            f"bench: torchrun starts the ranks again (restart {self.attempt + 1} of "
            f"--max-restarts {self.restarts}); the record will hold the last attempt's epochs",
            subsequent_indent="  "))
        return "\n".join(lines) + "\n"

    def withheld(self) -> str:
        return "".join(self.held)


# horovodrun's own lines, in the order it sees its ranks end (each rank runs under a shell:
# a signal shows as 128 + its number, or as minus it where the shell gave way to the rank)
_HOROVOD_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$", re.M)
_HOROVOD_OWN = re.compile(r"^(?:Process \d+ exit with status code -?\d+|Terminating remaining "
                          r"workers after failure of Process \d+)\.\n", re.M)
# what horovodrun puts before every line (and every carriage-return redraw) of a rank's
_HOROVOD_PREFIX = re.compile(r"(?:^|(?<=[\r\n]))\[\d+\]<std(?:out|err)>:")
# What is printed only because a rank died: the signal as the shell that ran it reports it,
# and the broken connection the peers' Horovod background loop then reports. bench names the
# dead rank in its own line; these are shown only where bench finds no cause (withheld()).
_PEER_GONE = re.compile(
    r"^\[\d+\]<stderr>:(?:Killed|Terminated|Aborted|Segmentation fault)(?: \(core dumped\))?\n"
    r"|^[^\n]*Horovod background loop uncaught exception: [^\n]*(?:Connection reset by peer"
    r"|Connection closed by peer|Broken pipe)[^\n]*\n", re.M)


def horovod_root_cause(text: str) -> tuple[int, int] | None:
    """(rank, signal) when the first rank horovodrun saw end was killed by a signal (not the
    SIGTERM it sends the others once one has failed)."""
    first = _HOROVOD_EXIT.search(text)
    if first is None:
        return None
    code = int(first.group(2))
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum <= 0 or signum == signal.SIGTERM:
        return None
    return int(first.group(1)), signum


class HorovodLines:
    """horovodrun's output as its ranks wrote it: without the ``[rank]<stdout>:`` it puts
    before each of their lines, and without its own lines about ranks' exit codes (bench
    names the failure in its own line). ``whole_lines``: hold a partial line back until it
    ends (stdout, where horovodrun's own lines may come in two writes); stderr is passed on
    as it comes (a progress bar's redraws end in carriage returns)."""

    def __init__(self, whole_lines: bool) -> None:
        self.whole_lines = whole_lines
        self.partial = ""
        self.peer_gone: list[str] = []

    def __call__(self, text: str) -> str:
        """What to pass on of ``text``; "" is the end of the stream (what was held comes)."""
        if self.whole_lines:
            held, self.partial = self.partial + text, ""
            if text:
                cut = held.rfind("\n") + 1
                held, self.partial = held[:cut], held[cut:]
            text = held
        self.peer_gone += _PEER_GONE.findall(text)
        text = _PEER_GONE.sub("", text)
        return _HOROVOD_OWN.sub("", _HOROVOD_PREFIX.sub("", text))

    def withheld(self) -> str:
        """The lines kept back as a dead rank's consequences, as the ranks wrote them."""
        return _HOROVOD_PREFIX.sub("", "".join(self.peer_gone))
