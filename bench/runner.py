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
from typing import Any, NoReturn

from bench import launch
from bench.cluster import default_rdzv_id, slurm_task
from bench.config import RunConfig, Topology, group_timeout, host_slots
from bench.datasets import model_spec
from bench.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    ConfigError,
    Interrupted,
    catch_stop_signals,
    restore_signals,
)
from bench.faults import Fault, defect_from_env
from bench.flops import cached_train_flops_per_image
from bench.folders import remove_created
from bench.lifetime import kill_children
from bench.mlperf_log import check_mllog_path
from bench.models import check_model_builds
from bench.parts import tf32_label
from bench.ports import free_port, port_in_use
from bench.preflight import (
    check_launch_options,
    check_output_writable,
    check_processes_fit,
    check_srun_task,
    check_strategy_options,
    default_workers,
    prepare_data,
    resolve_device,
    resolve_strategy,
    shares_gpus,
)
from bench.provenance import current_status
from bench.record import RunRecord
from bench.results import (
    new_run_id,
    read_record,
    release_space,
    remove_dead_temporaries,
    reserve_space,
)
from bench.run_summary import print_ok, print_start
from bench.scratch import RankError, Scratch
from bench.spec import WorkerSpec
from strategies.base import cpu_threads_per_process


def watchdog_timeout(timeout: float) -> float:
    """The watchdog ends a run whose ranks stopped beating a little after the collectives'
    own timeout (which, when it fires first, names the waiting rank and the phase)."""
    return timeout + max(5.0, 0.1 * timeout)


def _interruption(exc: BaseException) -> str:
    """What stopped the run, for its record and the terminal."""
    return str(exc) if isinstance(exc, Interrupted) else "Ctrl-C (SIGINT)"


def shared_run_id(strategy: str, world: int, device_type: str, run_tag: str) -> str:
    """A run id every machine of one multi-node run computes alike."""
    import datetime as _dt

    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    return f"{day}-{strategy}-{world}{device_type}-{run_tag}"


class RunPlan:
    """What a validated ``bench run`` will do; built before anything is written. Its
    ``cfg`` is derived from the one given (defaults resolved), never that one changed."""

    reserve: Path | None = None  # room kept for the record's closing (open_record makes it)

    def __init__(self, cfg: RunConfig, probe_output: bool = True) -> None:
        cfg.validate()
        Fault.from_env()  # the test hooks' variables are read by every rank: checked here
        defect_from_env()
        self.spec = model_spec(cfg)  # the data's classes and the run's image size
        check_model_builds(self.spec)
        self.strategy = resolve_strategy(cfg)
        self.device_type = resolve_device(cfg)
        resolved: dict[str, Any] = {
            "precision": cfg.precision or self.strategy.default_precision(self.device_type)
        }
        if resolved["precision"] == "fp16" and self.device_type != "cuda":
            raise ConfigError("--precision fp16 needs CUDA; use --precision bf16 on CPU")
        self.slurm = slurm_task() if cfg.use_slurm else None
        self.launcher = self.strategy.launcher
        if self.slurm is not None:
            check_srun_task(self.strategy, " (or --no-slurm)")
            resolved.update(nodes=self.slurm.nodes, node_rank=0)
            self.launcher = "slurm"
        cfg = cfg.derive(**resolved)
        self.topology = Topology(
            device_type=self.device_type, gpus=cfg.gpus, nodes=cfg.nodes, hosts=cfg.hosts,
            rdzv_endpoint=cfg.rdzv_endpoint, under_srun=self.slurm is not None,
            timeout=group_timeout(cfg.timeout, cfg.compile, cfg.gpus * cfg.nodes),
            backend=cfg.backend or ("nccl" if self.device_type == "cuda" else "gloo"),
            gpu_shared=self.slurm is None and shares_gpus(cfg, self.device_type),
        )
        self.strategy.check(self.topology, cfg.features)
        check_strategy_options(cfg, self.strategy)
        check_launch_options(cfg, self.strategy, self.launcher)
        self.processes = self.strategy.num_processes(self.topology)
        self.replicas = self.strategy.num_replicas(self.topology)
        self.local_processes = self.processes
        if self.slurm is not None:
            self.processes, self.replicas = 1, self.slurm.world_size
            self.local_processes = self.slurm.local_world_size
        if cfg.nodes > 1 and self.slurm is None and cfg.rdzv_id is None:
            cfg = cfg.derive(rdzv_id=default_rdzv_id(cfg.rdzv_endpoint or "", cfg.to_dict()))
        self.cfg = cfg
        # Loader workers are this machine's: per replica here (every node feeds its own).
        self.replicas_here = max(1, self.replicas // cfg.nodes)
        self.workers_per_replica = (
            cfg.workers if cfg.workers is not None else default_workers(self.device_type,
                                                                        self.replicas_here)
        )
        self.workers_per_process = self.loader_workers_per_process(self.workers_per_replica)
        # horovodrun starts every host's slots from here; one machine holds its own
        on_one_machine = max(host_slots(cfg.hosts)) if cfg.hosts else self.local_processes
        check_processes_fit(on_one_machine, self.workers_per_process,
                            max(1, self.replicas_here // self.local_processes))
        self.per_replica_batch = cfg.check_batch_split(self.replicas)
        cfg.check_batch_split(self.processes)
        if cfg.mllog:  # checked before anything is written
            check_mllog_path(cfg.mllog, "run-id")
        if not probe_output:  # a dry check (bench sweep validates every combination first)
            return
        self.runs, self.created_dirs = check_output_writable(cfg.output)
        self.port = cfg.master_port
        # One record per run, whatever the number of machines: every node (or Slurm task)
        # derives the same run id, and only global rank 0 fills it.
        self.writes_record = True
        if self.slurm is not None:
            self.run_id = shared_run_id(cfg.strategy, self.replicas, self.device_type,
                                        f"slurm{self.slurm.job_id}.{self.slurm.step_id}")
            self.writes_record = self.slurm.rank == 0
            self.port = cfg.master_port or self.slurm.default_port()
        elif cfg.nodes > 1:
            self.run_id = shared_run_id(cfg.strategy, self.replicas, self.device_type,
                                        cfg.rdzv_id)
        else:
            self.run_id = new_run_id(cfg.strategy, self.replicas, self.device_type)
        self.record_path = self.runs / f"{self.run_id}.json"
        if cfg.mllog:
            self.cfg = cfg.derive(mllog=check_mllog_path(cfg.mllog, self.run_id))

    def loader_workers_per_process(self, per_replica: int) -> int:
        """A process's loader workers for ``per_replica`` workers per replica on this
        machine (DataParallel's one process feeds all its replicas)."""
        return per_replica * self.replicas_here // self.local_processes

    @property
    def precision_label(self) -> str:
        label = self.strategy.precision_label(self.cfg.precision)
        if self.device_type != "cuda":
            return label
        return tf32_label(label, self.cfg.tf32 != "off")  # torch's default: TF32 convolutions

    def skeleton(self, argv: list[str]) -> RunRecord:
        return RunRecord.skeleton(
            self.record_path, cfg=self.cfg, run_id=self.run_id, launcher=self.launcher,
            device_type=self.device_type, replicas=self.replicas, processes=self.processes,
            per_replica_batch=self.per_replica_batch,
            workers_per_replica=self.workers_per_replica,
            workers_per_process=self.workers_per_process,
            precision=self.precision_label,
            strategy_options=self.strategy.record_options(), command=argv,
            backend=self.strategy.process_group_backend(self.topology),
            gpu_shared=self.topology.gpu_shared,
            train_flops_per_image=cached_train_flops_per_image(self.spec),
        )


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
        return self.rank_error.traceback.strip()[-20_000:] or None


def _first_failure(scratch: Scratch) -> tuple[str | None, RankError | None]:
    """The failure that ended the run: what the launcher's output told of a rank that could
    not say it (killed by a signal, its collective ended by NCCL's watchdog; its peers then
    fail with broken connections, a consequence), else the first error a rank wrote, its
    line prefixed with the rank; (None, None) if neither."""
    if scratch.root_cause.exists():
        return scratch.root_cause.read_text().strip(), None
    errors = scratch.errors()
    if not errors:
        return None, None
    rank, path = errors[0]
    error = RankError.read(path)
    if error.line.startswith("timeout: "):
        return f"timeout: rank {rank}: {error.line.removeprefix('timeout: ')}", error
    return f"rank {rank}: {error.line}", error


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
                               "master": plan.slurm.master_addr, "port": plan.port})
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
        spec_path = WorkerSpec(
            config=cfg, topology=plan.topology, record_path=plan.record_path.resolve(),
            scratch=scratch, workers_per_process=plan.workers_per_process,
            record=record.data,
        ).write()
        print_start(plan, record)
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
    try:
        port = plan.port or free_port()
        job = launch.Launch(
            spec_path, plan.processes, port, cpu_threads_per_process(plan.local_processes),
            scratch, timeout=watchdog_timeout(cfg.timeout), nnodes=cfg.nodes,
            rdzv_endpoint=cfg.rdzv_endpoint if cfg.nodes > 1 else None, rdzv_id=cfg.rdzv_id,
            max_restarts=cfg.max_restarts, hosts=cfg.hosts, slurm=plan.slurm,
            on_stuck=functools.partial(_end_stuck, plan, scratch),
        )
        rc = launch.LAUNCHERS[plan.launcher](job)
        if rc != 0:
            error, rank_error = _first_failure(scratch)
            error = error or f"launcher {plan.launcher} exited with {rc}"
    except launch.RunTimeout as exc:
        error, rc = str(exc), -1
    except (KeyboardInterrupt, Interrupted) as exc:
        status, rc, error = "interrupted", -1, _interruption(exc)
    except BaseException:
        escaped = True
        raise
    finally:
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
        elif final.status == "ok" and (rc == 0 or status == "interrupted"):
            # Every epoch was recorded; a signal during shutdown does not undo the run.
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
    if status == "failed" and outcome.traceback and not outcome.rank_error.explained:
        print(f"bench: the traceback of {error.split(':', 1)[0]}:\n{outcome.traceback}",
              file=sys.stderr)
    print(f"bench: run {status}: {error} (record {plan.record_path})", file=sys.stderr)
    return EXIT_INTERRUPTED if status == "interrupted" else EXIT_FAILED
