"""A run's plan, made before anything starts: the strategy, topology, launcher, loader
workers, the record's skeleton, each checked with one line naming the fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from bench.config.run_config import RunConfig, group_timeout
from bench.config.strategy_parts import Topology, host_slots
from bench.data.datasets import model_spec
from bench.launch.preflight import (
    check_data_fits,
    check_launch_options,
    check_output_writable,
    check_processes_fit,
    check_srun_task,
    check_strategy_options,
    data_sizes,
    default_workers,
    resolve_device,
    resolve_strategy,
    say_notes,
    shares_gpus,
)
from bench.launch.slurm import default_rdzv_id, slurm_cpus_per_task, slurm_note, slurm_task
from bench.measure.flops import cached_train_flops_per_image
from bench.models.registry import check_model_builds
from bench.models.stochastic import random_layers
from bench.records.environment import cpu_bf16_instructions, emulated_bf16_note
from bench.records.files import new_run_id, runs_dir
from bench.records.run_record import RunRecord
from bench.tools.errors import ConfigError
from bench.tools.faults import Fault, defect_from_env
from bench.train.build import tf32_label
from bench.train.mllog import check_mllog_path
from strategies.base import batchnorm_layers, cpu_threads_per_process


def watchdog_timeout(timeout: float) -> float:
    """The watchdog ends a run whose ranks stopped beating a little after the collectives'
    own timeout (which, when it fires first, names the waiting rank and the phase)."""
    return timeout + max(5.0, 0.1 * timeout)


def shared_run_id(strategy: str, world: int, device_type: str, run_tag: str) -> str:
    """A run id every machine of one multi-node run computes alike."""
    import datetime as _dt

    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d")
    return f"{day}-{strategy}-{world}{device_type}-{run_tag}"


def _refuse_a_second_run(record_path: Path, rdzv_id: str | None) -> None:
    """A multi-node run's id is the day and its rendezvous id, which every node derives
    from the command: the same command again the same day would overwrite the record of
    the first. A record there that is not ``running`` (another node's start of this run)
    is such an earlier run: refused, with the fix."""
    if not record_path.exists():
        return
    try:
        status = json.loads(record_path.read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = "unreadable"
    if status != "running":
        raise ConfigError(f"a run with rendezvous id {rdzv_id} already ended today ({status}, "
                          f"{record_path}): pass --rdzv-id NAME, a new name, the same on "
                          "every node, to keep both records")


class RunPlan:
    """What a validated ``bench run`` will do; built before anything is written. Its
    ``cfg`` is derived from the one given (defaults resolved), never that one changed."""

    reserve: Path | None = None  # room kept for the record's closing (open_record makes it)

    def __init__(self, cfg: RunConfig, probe_output: bool = True,
                 srun_step: bool = False, elsewhere: bool = False) -> None:
        """``srun_step``: validate the run as the srun step it will be (a job array's task
        over several nodes: `bench sweep --slurm` plans it before any Slurm exists).
        ``elsewhere``: the run is for another machine (a Slurm job's nodes, planned on a
        login node without a GPU): its device is the one asked for, and this machine's
        GPUs and memory say nothing of it."""
        cfg.validate()
        Fault.from_env()  # the test hooks' variables are read by every rank: checked here
        defect_from_env()
        self.spec = model_spec(cfg)  # the data's classes and the run's image size
        built = check_model_builds(self.spec)
        self.random_layers = len(random_layers(built))  # bench verify switches them off
        if cfg.ghost_bn is not None and not batchnorm_layers(built):
            raise ConfigError(f"--ghost-bn groups BatchNorm's statistics; --model {cfg.model} "
                              "has no BatchNorm layer: drop --ghost-bn")
        self.strategy = resolve_strategy(cfg)
        self.device_type = ("cpu" if cfg.cpu else "cuda") if elsewhere else resolve_device(cfg)
        resolved: dict[str, Any] = {
            "precision": cfg.precision or self.strategy.default_precision(self.device_type)
        }
        if resolved["precision"] == "fp16" and self.device_type != "cuda":
            raise ConfigError("--precision fp16 needs CUDA; use --precision bf16 on CPU")
        # said before the run, and kept in its record: an hour where fp32 takes minutes
        self.precision_note = (
            emulated_bf16_note() if resolved["precision"] == "bf16" and not elsewhere
            and self.device_type == "cpu" and cpu_bf16_instructions() is False else None)
        self.slurm = slurm_task() if cfg.use_slurm else None
        self.slurm_note = slurm_note() if cfg.use_slurm else None
        self.launcher = self.strategy.launcher
        if self.slurm is not None:
            check_srun_task(self.strategy, " (or --no-slurm)")
            asked = cfg.gpus * self.slurm.nodes
            if self.slurm.world_size != asked:
                raise ConfigError(
                    f"this srun step has {self.slurm.world_size} tasks on "
                    f"{self.slurm.nodes} node(s) (SLURM_STEP_NUM_TASKS), but --gpus {cfg.gpus} "
                    f"asks for {asked} ranks: start one task per rank (srun "
                    f"--ntasks-per-node={cfg.gpus}), pass --gpus "
                    f"{max(1, self.slurm.world_size // self.slurm.nodes)}, or --no-slurm to "
                    "launch the ranks from each task yourself")
            resolved.update(nodes=self.slurm.nodes, node_rank=0)
            self.launcher = "slurm"
        cfg = cfg.derive(**resolved)
        self.topology = Topology(
            device_type=self.device_type, gpus=cfg.gpus, nodes=cfg.nodes, hosts=cfg.hosts,
            rdzv_endpoint=cfg.rdzv_endpoint, under_srun=self.slurm is not None or srun_step,
            timeout=group_timeout(cfg.timeout, cfg.compile, cfg.gpus * cfg.nodes),
            backend=cfg.backend or ("nccl" if self.device_type == "cuda" else "gloo"),
            gpu_shared=(self.slurm is None and not elsewhere
                        and shares_gpus(cfg, self.device_type)),
        )
        self.strategy.check(self.topology, cfg.features)
        check_strategy_options(cfg, self.strategy)
        # an srun step's tasks are its ranks, as under a job's srun here
        check_launch_options(cfg, self.strategy, "slurm" if srun_step else self.launcher)
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
            cfg.workers if cfg.workers is not None else default_workers(
                self.device_type, self.replicas_here, self.threads_per_process())
        )
        self.workers_per_process = self.loader_workers_per_process(self.workers_per_replica)
        # horovodrun starts every host's slots from here; one machine holds its own
        on_one_machine = max(host_slots(cfg.hosts)) if cfg.hosts else self.local_processes
        if not elsewhere:
            check_processes_fit(on_one_machine, self.workers_per_process,
                                max(1, self.replicas_here // self.local_processes))
        self.per_replica_batch = cfg.check_batch_split(self.replicas)
        cfg.check_batch_split(self.processes)
        cfg.check_ghost_bn(self.per_replica_batch // cfg.grad_accum,
                           self.strategy.syncs_batchnorm and self.device_type == "cuda"
                           and self.replicas > 1)
        if cfg.mllog:  # checked before anything is written; it may go in the run's --output
            check_mllog_path(cfg.mllog, "run-id", (Path(cfg.output), runs_dir(cfg.output)))
        if not probe_output:  # a dry check (bench sweep validates every combination first)
            return
        self.runs, self.created_dirs = check_output_writable(cfg.output)
        self.port = cfg.master_port
        # One record per run, whatever the number of machines: every node (or Slurm task)
        # derives the same run id, and only global rank 0 fills it.
        self.writes_record = True
        if self.slurm is not None:
            # every task derives it alike; the command's digest sets apart the runs of one
            # step (a sweep's repeats differ in seed and tag)
            digest = hashlib.sha1(json.dumps(
                {k: v for k, v in cfg.to_dict().items() if k not in ("node_rank", "progress")},
                sort_keys=True, default=str).encode()).hexdigest()[:6]
            self.run_id = shared_run_id(cfg.strategy, self.replicas, self.device_type,
                                        f"slurm{self.slurm.job_id}.{self.slurm.step_id}-{digest}")
            self.writes_record = self.slurm.rank == 0
            self.port = cfg.master_port or self.slurm.default_port()
        elif cfg.nodes > 1:
            self.run_id = shared_run_id(cfg.strategy, self.replicas, self.device_type,
                                        cfg.rdzv_id)
        else:
            self.run_id = new_run_id(cfg.strategy, self.replicas, self.device_type)
        self.record_path = self.runs / f"{self.run_id}.json"
        if cfg.nodes > 1 and self.slurm is None:
            _refuse_a_second_run(self.record_path, cfg.rdzv_id)
        if cfg.mllog:
            self.cfg = cfg.derive(mllog=check_mllog_path(cfg.mllog, self.run_id))

    def threads_per_process(self) -> int:
        """CPU threads for each process here: a Slurm task's own CPUs where Slurm says how
        many (its affinity already is its share: dividing it by the tasks again left one
        thread and no loader worker), else this machine's cores split over its processes."""
        if self.slurm is not None and slurm_cpus_per_task():
            return slurm_cpus_per_task() or 1
        return cpu_threads_per_process(self.local_processes)

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
            notes=[self.precision_note] if self.precision_note else None,
        )


def check_data(plans: list[RunPlan]) -> None:
    """The data of runs that differ only in strategy, N and batch made ready once (read,
    CIFAR-100 fetched if absent) and each run's share of it checked, as each run would
    before it starts: what every run would refuse is refused once, before any starts (a
    search of tries, a sweep's or verify's runs each failed on it in turn)."""
    if not plans:
        return
    notes: list[str] = []
    _, train, test = data_sizes(plans[0].cfg, notes)
    for plan in plans:
        check_data_fits(plan.cfg, train, test, plan.local_processes)
    say_notes(notes)
