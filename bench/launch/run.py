"""``bench run`` in the launching process: validate, write the record's skeleton, start the
ranks through the strategy's launcher, and close the record whatever happened."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from bench.config.run_config import RunConfig
from bench.launch import launchers
from bench.launch.job import Launch, RunTimeout
from bench.launch.output import end_open_line
from bench.launch.plan import RunPlan, watchdog_timeout
from bench.launch.preflight import prepare_data
from bench.launch.summary import print_ok, print_start
from bench.records.files import (
    read_record,
    release_space,
    remove_dead_temporaries,
    reserve_space,
)
from bench.records.provenance import current_status
from bench.records.run_record import RunRecord
from bench.tools.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    ConfigError,
    Interrupted,
    catch_stop_signals,
    restore_signals,
)
from bench.tools.folders import remove_created
from bench.tools.lifetime import kill_children
from bench.tools.ports import free_port, port_in_use, release_port
from bench.train.scratch import RankError, Scratch, first_cause
from bench.train.spec import WorkerSpec


def _interruption(exc: BaseException) -> str:
    """What stopped the run, for its record and the terminal."""
    return str(exc) if isinstance(exc, Interrupted) else "Ctrl-C (SIGINT)"


@dataclass(frozen=True)
class Outcome:
    """How the launch ended: the record's status and error, the launcher's exit code and
    the scratch folder the ranks reported through."""

    status: str  # failed | interrupted until the record says ok
    error: str | None
    rc: int
    scratch: Scratch
    rank_error: RankError | None = None  # what the failing rank said, when it raised

    @property
    def traceback(self) -> str | None:
        """The end of the failing rank's traceback (where the cause is), if it raised."""
        if self.rank_error is None:
            return None
        return self.rank_error.traceback_tail() or None


def _first_failure(scratch: Scratch) -> tuple[str | None, RankError | None]:
    """The failure that ended the run: what the launcher's output told of a rank that could
    not say it (killed by a signal, its collective ended by NCCL's watchdog; its peers then
    fail with broken connections, a consequence), else the first error a rank wrote that
    is not a broken connection (else the first), its line prefixed with the rank; (None,
    None) if neither."""
    if scratch.root_cause.exists():
        return scratch.root_cause.read_text().strip(), None
    found = first_cause(scratch.said_errors())
    if found is None:
        return None, None
    rank, error = found
    return error.said_by(rank), error


def reap_ranks(scratch: Scratch) -> None:
    """Kill any rank of this run that outlived its launcher (found by its pid file)."""
    for pid in scratch.rank_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if pid == os.getpid():
            continue
        if str(scratch.root).encode() in cmdline or b"spawn_main" in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def execute(cfg: RunConfig, argv: list[str]) -> int:
    """Run one configuration; returns the exit code. Bad input raises ConfigError before
    anything is written."""
    plan = RunPlan(cfg)
    if plan.slurm_note:  # Slurm's variables are set, and not followed: say why
        print(f"bench: {plan.slurm_note}", file=sys.stderr)
    record: RunRecord | None = None
    previous = catch_stop_signals()
    try:
        record = open_record(plan, argv)
        if record.status == "unavailable":
            print(f"bench: {plan.cfg.strategy} is unavailable here: {record.data['error']}",
                  file=sys.stderr)
            print(f"record: {plan.record_path}")
            return EXIT_UNAVAILABLE
        outcome = launch_ranks(plan, record)
    except (KeyboardInterrupt, Interrupted) as exc:
        # Before the ranks started (launch_ranks handles what comes later): no record may
        # stay `running` with nobody left to close it.
        why = f"{_interruption(exc)} before the ranks started"
        return _end_early(plan, record, "interrupted", why, f"bench: interrupted: {why}",
                          EXIT_INTERRUPTED)
    except OSError as exc:  # a full disk, a quota, a file-size limit while bench writes
        return _cannot_write(plan, record, exc)
    finally:
        restore_signals(previous)
    try:
        return close_record(plan, outcome)
    except OSError as exc:
        return _cannot_write(plan, record, exc)


def _cannot_write(plan: RunPlan, record: RunRecord | None, exc: OSError) -> int:
    reason = f"cannot write files ({exc.strerror or exc})"
    return _end_early(plan, record, "failed", reason,
                      f"bench: run failed: {reason}; free some space or choose another "
                      f"--output (record {plan.record_path})", EXIT_FAILED)


def _end_early(plan: RunPlan, record: RunRecord | None, status: str, reason: str,
               line: str, code: int) -> int:
    """A run ended outside close_record: one line instead of a traceback, the record closed
    if it still can be (a full disk may forbid it: its owner is then gone, and the report
    says so), or, with no record yet, the folders this run made removed."""
    if record is None and plan.writes_record and plan.record_path.exists():
        # written, but the signal came before open_record returned it (preparing the data)
        with contextlib.suppress(OSError, ValueError):
            record = RunRecord.load(plan.record_path)
    release_space(plan.reserve)  # the room the record's closing needs on a full disk
    if record is not None and plan.writes_record and record.status == "running":
        with contextlib.suppress(OSError):
            record.fail(status, reason)
    elif record is None:
        remove_created(plan.created_dirs)
    print(line, file=sys.stderr)
    return code


def open_record(plan: RunPlan, argv: list[str]) -> RunRecord:
    """The record's skeleton with the data set's facts, written (by the machine that owns
    it), or closed at once as ``unavailable``. Bad input leaves nothing behind."""
    cfg = plan.cfg
    try:
        if (plan.port is not None and plan.launcher not in ("inline", "slurm")
                and cfg.nodes == 1 and port_in_use(plan.port)):
            raise ConfigError(
                f"--master-port {plan.port} is in use; choose another or leave it out"
            )
        record = plan.skeleton(argv)
        reason = plan.strategy.requires(plan.device_type, plan.topology.backend)
        if reason:
            record.unavailable(reason)
            return record
        dataset, train_size, test_size = prepare_data(cfg, plan.local_processes)
    except ConfigError:
        remove_created(plan.created_dirs)
        raise
    record.set_data(dataset, train_size, test_size,
                    None if dataset == "synthetic" else str(Path(cfg.data_dir).resolve()))
    if plan.slurm is not None:
        record.set_rendezvous({"slurm_job": plan.slurm.job_id,
                               "master": plan.slurm.master_addr, "port": plan.port,
                               # where Slurm put the step's tasks (this run's ranks)
                               "step_nodes": os.environ.get("SLURM_STEP_NODELIST")})
    elif cfg.nodes > 1:
        record.set_rendezvous({"endpoint": cfg.rdzv_endpoint, "id": cfg.rdzv_id})
    if plan.writes_record:
        record.write()
        _clear_stale_reserves(plan.runs)
        remove_dead_temporaries(plan.runs)  # of a rank killed while it wrote a record
        plan.reserve = reserve_space(plan.runs, plan.run_id)
    return record


def _clear_stale_reserves(runs: Path) -> None:
    """Remove the space reserves of runs that no longer run (killed outright, their owner
    gone), so that they never pile up: each is checked against its own record alone."""
    for reserve in runs.glob(".*.reserve"):
        record = runs / f"{reserve.name[1:-len('.reserve')]}.json"
        try:
            running = current_status(read_record(record))[0] == "running"
        except (OSError, ValueError, AttributeError):  # gone, unreadable, not an object
            running = False
        if not running:
            release_space(reserve)


def launch_ranks(plan: RunPlan, record: RunRecord) -> Outcome:
    """Start the ranks through the plan's launcher and wait; SIGTERM and Ctrl-C end them."""
    cfg = plan.cfg
    scratch = Scratch.create(plan.run_id)
    try:  # until the launcher's own clean-up below takes over, nothing of it may stay
        print_start(plan, record)  # first: what it adds to the record (oversubscribed) is
        # the launcher's, which a restarted attempt's record starts from again (the spec's)
        spec_path = WorkerSpec(
            config=cfg, topology=plan.topology, record_path=plan.record_path.resolve(),
            scratch=scratch, workers_per_process=plan.workers_per_process,
            record=record.data,
        ).write()
    except BaseException:
        scratch.remove()
        raise
    return _launch(plan, scratch, spec_path)


def _launch(plan: RunPlan, scratch: Scratch, spec_path: Path) -> Outcome:
    """Run the launcher to its end; the outcome's scratch goes once the record is closed, or
    here if something unforeseen escapes (no record will be closed then)."""
    cfg = plan.cfg
    previous = catch_stop_signals()
    status, error, rank_error, escaped = "failed", None, None, False
    port = None
    try:
        port = plan.port or free_port()
        job = Launch(
            spec_path, plan.processes, port, plan.threads_per_process(),
            scratch, timeout=watchdog_timeout(cfg.timeout), nnodes=cfg.nodes,
            node_rank=cfg.node_rank,
            rdzv_endpoint=cfg.rdzv_endpoint if cfg.nodes > 1 else None, rdzv_id=cfg.rdzv_id,
            max_restarts=cfg.max_restarts, hosts=cfg.hosts, slurm=plan.slurm,
            on_stuck=functools.partial(_end_stuck, plan, scratch),
        )
        rc = launchers.LAUNCHERS[plan.launcher](job)
        if rc != 0:
            error, rank_error = _first_failure(scratch)
            error = error or f"launcher {plan.launcher} exited with {rc}"
    except RunTimeout as exc:
        error, rc = str(exc), -1
    except (KeyboardInterrupt, Interrupted) as exc:
        status, rc, error = "interrupted", -1, _interruption(exc)
    except BaseException:
        escaped = True
        raise
    finally:
        if port is not None:
            release_port(port)  # the run is over: its store no longer listens
        restore_signals(previous)
        reap_ranks(scratch)  # by the pids in the scratch folder: before it goes
        if escaped:
            scratch.remove()
    return Outcome(status, error, rc, scratch, rank_error)


def _end_stuck(plan: RunPlan, scratch: Scratch, error: str | None) -> NoReturn:
    """The watchdog's end of a run whose rank runs in this process and stopped beating
    (``error``: its line), or failed and did not end (None: the rank's own error): the
    record closed, the loader workers and the scratch folder gone, one line, exit 1 (from
    the watchdog's thread: the rank's cannot be reached)."""
    if error is None:
        with contextlib.suppress(OSError, ValueError):
            error = _first_failure(scratch)[0]
        error = error or "the rank failed and did not end"
    release_space(plan.reserve)
    with contextlib.suppress(OSError, ValueError):
        if plan.writes_record:
            RunRecord.load(plan.record_path).fail("failed", error)
    kill_children()
    scratch.remove()
    print(f"bench: run failed: {error} (record {plan.record_path})", file=sys.stderr,
          flush=True)
    os._exit(EXIT_FAILED)


def close_record(plan: RunPlan, outcome: Outcome) -> int:
    """Say how the run ended, in the record (unless another machine owns it) and on the
    terminal; returns the exit code."""
    cfg, status, error, rc = plan.cfg, outcome.status, outcome.error, outcome.rc
    release_space(plan.reserve)  # the room the record's closing needs on a full disk
    try:
        if not plan.writes_record:  # a Slurm task other than rank 0: the record is not ours
            if rc == 0:
                return EXIT_OK
            return EXIT_INTERRUPTED if status == "interrupted" else EXIT_FAILED
        if (cfg.nodes > 1 and rc == 0 and not outcome.scratch.rank0_here.exists()
                and RunRecord.load(plan.record_path).status == "running"):
            # Global rank 0 ran on another machine and wrote the record there.
            plan.record_path.unlink(missing_ok=True)
            print("bench: ok; the record was written on the node that hosted global rank 0")
            return EXIT_OK
        final = RunRecord.load(plan.record_path)
        if final.status == "diverged":  # rank 0 said why; the ranks' exit adds nothing
            status, error = "diverged", final.data.get("error")
        elif final.status == "ok":
            # Rank 0 finished the record after the last collective: every epoch and check is
            # in it. A signal, or a rank that died in its teardown (gloo aborts now and then
            # as its group is destroyed), does not undo the run; the record says it.
            if rc != 0 and status != "interrupted":
                final.data["notes"] = [*final.data.get("notes", []),
                                       f"after the record was finished: {error}"]
                final.write()
            status = "ok"
        elif rc == 0:
            error = error or "ranks exited without finishing the record"
        if status not in ("ok", "diverged") or final.status not in ("ok", "diverged"):
            final.fail(status, error, outcome.traceback if status == "failed" else None)
    finally:
        outcome.scratch.remove()
    if status == "ok":
        print_ok(final, plan.cfg.loader, plan.workers_per_replica)
        return EXIT_OK
    end_open_line()  # a progress bar the ranks left: bench's lines start their own
    if status == "failed" and outcome.traceback and not outcome.rank_error.explained:
        print(f"bench: the traceback of {error.split(':', 1)[0]}:\n{outcome.traceback}",
              file=sys.stderr)
    print(f"bench: run {status}: {error} (record {plan.record_path})", file=sys.stderr)
    return EXIT_INTERRUPTED if status == "interrupted" else EXIT_FAILED
