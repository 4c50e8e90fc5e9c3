"""The per-rank entry point, the same for 1 and N processes and for every strategy.

Started as ``python -m bench.train.rank SPEC.json`` by torchrun / torch.distributed.launch /
horovodrun, or called in-process (inline, mp.spawn, an srun task). It joins the strategy's
group, builds the rank's parts, hands them to the ``Trainer`` and reports a failure with the
phase it happened in. Rank 0 alone writes the record."""

from __future__ import annotations

import os

from bench.tools.collector import pause_collector, resume_collector
from bench.tools.lifetime import die_with_parent

if __name__ == "__main__":
    # Started by a launcher agent (torchrun, torch.distributed.launch, horovodrun): arm the
    # death signal before the slow imports below, so that killing bench while this rank
    # imports torch takes it down too (a parent already gone: exit at once); the collector
    # waits until the rank is built (bench.tools.collector).
    die_with_parent(os.getppid())
    pause_collector()

import contextlib
import gc
import re
import sys
import traceback
import warnings
from pathlib import Path

import torch

import strategies
from bench.data.loaders import build_loaders, quiet_worker_count_warning
from bench.measure.machine_load import LoadMeter
from bench.measure.memory_parts import cap_gpu_memory, mark_baseline
from bench.models.registry import mlperf_model_name
from bench.records.run_record import RunRecord
from bench.tools.errors import CannotWrite, ConfigError, without_source_location
from bench.tools.faults import Fault, defect_from_env, inject_defect, slow_communication_from_env
from bench.tools.restarts import restart_count
from bench.train.build import build_model_and_optimizer
from bench.train.mllog import MLPerfLog
from bench.train.out_of_memory import is_out_of_memory, out_of_memory_line
from bench.train.schedule import BatchSplit
from bench.train.scratch import Heartbeat, RankError, Scratch
from bench.train.spec import WorkerSpec
from bench.train.trainer import Trainer
from bench.train.verify_steps import run_verify
from strategies.base import Strategy, cpu_threads_per_process


def build_trainer(spec: WorkerSpec, strategy: Strategy, heartbeat: Heartbeat) -> Trainer:
    """Threads, model and optimizer, loaders and (rank 0) the record, for a joined rank."""
    cfg = spec.config
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", strategy.world_size))
    threads = cpu_threads_per_process(local_processes)
    torch.set_num_threads(threads)
    slow_communication_from_env(strategy)
    parts = build_model_and_optimizer(cfg, strategy)
    split = BatchSplit.of(cfg.batch_size, cfg.grad_accum, strategy)
    loaders = build_loaders(cfg, strategy, micro_batch=split.micro,
                            eval_batch=split.eval_batch,
                            workers=spec.workers_per_process, augment=cfg.verify_steps is None)
    defect = defect_from_env()
    if defect:
        inject_defect(defect, parts, loaders.sampler, strategy)
    record, mllog = None, None
    if strategy.is_main:
        if restart_count():  # the attempt before left its epochs in the record: start anew
            record = RunRecord.restarted(spec.record_path, dict(spec.record), restart_count(),
                                         cfg.max_restarts, _failure_before(spec.scratch))
        else:
            record = (RunRecord.load(spec.record_path) if spec.record_path.exists()
                      else RunRecord(spec.record_path, dict(spec.record)))
        if spec.scratch.exists():  # tells this machine's launcher that global rank 0 ran here
            spec.scratch.rank0_here.touch()
        if cfg.mllog and cfg.verify_steps is None:
            mllog = open_mllog(cfg, strategy, loaders)
    load = LoadMeter.here(run_root(spec)) if record is not None else None
    fault = Fault.from_env(spec.scratch.root if spec.scratch.exists() else None)
    return Trainer(cfg, strategy, parts, loaders, split, record, heartbeat, fault,
                   threads=threads, workers=spec.workers_per_process, mllog=mllog, load=load)


def run_root(spec: WorkerSpec) -> int:
    """The process this machine's processes of the run live under, whose CPU time is the
    run's own: the bench that launched them here, or, for an srun task, Slurm's step
    daemon, whose tasks are the run's ranks on this node."""
    if spec.record.get("launcher") == "slurm":
        return os.getppid()
    launcher = spec.scratch.launcher_pid()
    return launcher if launcher is not None else os.getppid()


def open_mllog(cfg, strategy: Strategy, loaders) -> MLPerfLog:
    """The run's MLPerf log, opened with what MLPerf logs before init ends."""
    device = (torch.cuda.get_device_name(strategy.device) if strategy.device.type == "cuda"
              else "cpu")
    c = MLPerfLog.constants_module()
    return MLPerfLog.open(
        cfg.mllog, benchmark=f"{mlperf_model_name(cfg.model)}-{cfg.data}",
        platform=f"{strategy.replicas}x{device} ({cfg.strategy})",
        hyperparameters={
            c.GLOBAL_BATCH_SIZE: cfg.batch_size, c.GRADIENT_ACCUMULATION_STEPS: cfg.grad_accum,
            c.OPT_NAME: c.SGD, c.OPT_BASE_LR: cfg.peak_lr, c.OPT_WEIGHT_DECAY: cfg.weight_decay,
            c.OPT_LR_WARMUP_EPOCHS: cfg.warmup_epochs, c.EPOCH_COUNT: cfg.epochs,
            c.SEED: cfg.seed, c.TRAIN_SAMPLES: loaders.train_size,
            c.EVAL_SAMPLES: loaders.test_size,
        },
        target_top1=cfg.target_top1)


def _error_line(exc: BaseException) -> str:
    """The exception's first line; bad input found only once the run is under way (an image
    that does not decode) is its message alone, as bad input is at the start."""
    text = str(exc).strip().splitlines()
    if isinstance(exc, (ConfigError, CannotWrite)) and text:
        return text[0]
    first = without_source_location(text[0]) if text else ""
    return f"{type(exc).__name__}: {first}".strip()


_LOADER_TIMEOUT = re.compile(r"DataLoader timed out after (\d+(?:\.\d+)?) seconds")
# DDP's reducer when a parameter took no part in the loss (torch's message runs 8 lines and
# names the fix as a keyword argument bench users never type)
_UNUSED_PARAMETERS = re.compile(r"Expected to have finished reduction in the prior iteration")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: "
                             r"([\d ]+)")


def _rank_error(exc: BaseException, spec: WorkerSpec, strategy: Strategy,
                phase: str) -> RankError:
    """The line that names the failure and its phase, and whether it says what to do."""
    line, explained = _error_line(exc), isinstance(exc, (ConfigError, CannotWrite))
    if is_out_of_memory(exc):
        explained = True
        with contextlib.suppress(Exception):  # a group never joined has no batch split
            cfg = spec.config
            split = BatchSplit.of(cfg.batch_size, cfg.grad_accum, strategy)
            line = out_of_memory_line(exc, cfg, strategy.device, split, phase)
    stuck = _LOADER_TIMEOUT.search(line) if isinstance(exc, RuntimeError) else None
    if stuck:
        waited = float(stuck.group(1))
        line = f"its DataLoader workers served no batch for {waited:g} s (--timeout): one is stuck"
    if isinstance(exc, RuntimeError) and _UNUSED_PARAMETERS.search(str(exc)):
        indices = _UNUSED_INDICES.search(str(exc))
        which = (f"the model's parameters {', '.join(indices.group(1).split())} "
                 "(model.parameters() order)" if indices else "some of the model's parameters")
        line, explained = (f"DDP: {which} took no part in the loss; run with "
                           "--find-unused-parameters"), True
    if "timed out" in line.lower() or "timeout" in line.lower():
        line, explained = f"timeout: {line}", True
    return RankError(f"{line} [in {phase}]", explained, traceback.format_exc(),
                     attempt=restart_count())


def _launched_rank(default: str) -> str:
    """This rank's number as its launcher set it (horovodrun: HOROVOD_RANK, not RANK), for
    its files in the scratch folder."""
    return os.environ.get("RANK") or os.environ.get("HOROVOD_RANK") or default


# DDP's reducer warns when a gradient's strides differ from its bucket view's. A 1x1 kernel's
# gradient from a compiled backward (the shortcut convs') differs only in the strides of its
# two size-1 dims, where the memory is laid out alike: spurious, per PyTorch's maintainers
# (pytorch/pytorch#47163), and printed by every rank. The same sizes and the same strides of
# the two real dims are required: any other mismatch still shows.
SPURIOUS_STRIDES = (
    r"(?s)Grad strides do not match bucket view strides.*"
    r"grad\.sizes\(\) = \[(\d+), (\d+), 1, 1\], strides\(\) = \[(\d+), (\d+), \d+, \d+\]\s*"
    r"bucket_view\.sizes\(\) = \[\1, \2, 1, 1\], strides\(\) = \[\3, \4, \d+, \d+\]")


def _failure_before(scratch: Scratch) -> str | None:
    """What ended the attempt before this one (torchrun restarted the ranks), as a rank of
    it on this machine said it, else as this machine's launcher told it (a rank killed by a
    signal says nothing, and its peers' broken connections do not name it: 'rank 1 was
    killed by signal 9 (SIGKILL) [in train epoch 2 step 5]'); None if neither did."""
    if not scratch.exists():
        return None
    found = scratch.cause_of(restart_count() - 1)
    if found and not found[1].peer_gone():  # as the run's error would say it
        return found[1].said_by(found[0])
    try:
        return scratch.failed_attempt(restart_count() - 1).read_text().strip() or None
    except OSError:
        return None


def run_rank(spec_path: str | Path) -> None:
    """Everything one rank does, whatever started it."""
    # FSDP2 calls torch's own deprecated reduce_scatter_tensor (torch 2.14): a warning from
    # torch to itself, in the middle of bench's table, that no user can act on
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.reduce_scatter_tensor` is deprecated")
    warnings.filterwarnings("ignore", category=UserWarning, message=SPURIOUS_STRIDES)
    quiet_worker_count_warning()  # said once, before the ranks start
    pause_collector()  # until the rank is built (mp.spawn's and inline ranks start here)
    spec = WorkerSpec.read(spec_path)
    cfg, scratch = spec.config, spec.scratch
    strategy = strategies.get(cfg.strategy, cfg.strategy_options)
    if scratch.exists():
        scratch.pid(_launched_rank("0")).write_text(str(os.getpid()))
        if restart_count():  # before this rank says anything: its launcher reads it then
            scratch.start_attempt(restart_count())
            # the attempt before's beat: the watchdog times this one from its first own,
            # as it timed the first attempt (its start-up is torchrun's to bound)
            scratch.beat(_launched_rank("0")).unlink(missing_ok=True)
    heartbeat = Heartbeat(scratch)
    clean = False
    try:
        strategy.setup(spec.topology)
        heartbeat.bind(strategy.rank)
        # Beat before the build: a model factory or data set that never returns in a rank is
        # then bounded by --timeout like a stuck collective (the watchdog only sees ranks
        # that beat once; this rank had not, and such a run waited for ever).
        heartbeat("build: model and data")
        cap_gpu_memory(strategy.device)  # bench fit --gpu-memory: a share of the GPU
        # torch's compiler stack (torch._dynamo and what it pulls in: 150 MB of modules on
        # CPU) comes with torch.distributed's setup in a DDP rank, and with the first
        # backward in any: imported before the baseline, so that no rank counts it as its
        # run's memory (dp's inline rank did: its mem/rank at N=1 read 2.4x ddp's)
        import torch._dynamo  # noqa: F401
        mark_baseline(strategy.device)  # what is not the run's memory: before the model
        trainer = build_trainer(spec, strategy, heartbeat)
        resume_collector()
        if spec.config.verify_steps is not None:
            run_verify(trainer)
        else:
            trainer.run()
        # The DDP wrapper must be gone before its process group is destroyed: gloo aborts
        # the process now and then otherwise ("terminate called without an active exception").
        fault = trainer.fault
        del trainer
        gc.collect()
        clean = True
        if fault is not None and fault.exits_after_the_run(strategy.rank):
            os._exit(1)
    except BaseException as exc:
        rank = _launched_rank(str(strategy.rank))
        if scratch.exists():
            with contextlib.suppress(OSError):
                scratch.write_error(rank, _rank_error(exc, spec, strategy, heartbeat.phase))
        fault = Fault.from_env()
        if fault is not None and fault.aborts_after_its_error(strategy.rank):
            os.abort()
        raise
    finally:
        resume_collector()  # a rank that failed in its build, in a process that goes on
        strategy.teardown(clean)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # torch.distributed.launch (legacy) passes --local-rank=N / --local_rank=N unless --use-env.
    spec_path = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(("--local-rank", "--local_rank")):
            value = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
            i += 0 if "=" in arg else 1
            os.environ["LOCAL_RANK"] = value
            os.environ["BENCH_LOCAL_RANK_ARG"] = arg if "=" in arg else f"{arg} {value}"
        else:
            spec_path = arg
        i += 1
    if spec_path is None:
        raise SystemExit("usage: python -m bench.train.rank SPEC.json (started by `bench run`)")
    run_rank(spec_path)


if __name__ == "__main__":
    from bench.tools.streams import guard_standard_streams

    guard_standard_streams()  # a rank's lines must not end it (an ASCII-only encoding)
    from bench.tools.quick_exit import exit_now

    try:
        main()
    except Exception:
        # Python's own report and exit code, without the interpreter's teardown: the
        # traceback keeps the DDP wrapper alive past its group's end, and freeing it there
        # aborted the rank now and then (SIGABRT), after it had said its error.
        traceback.print_exc()
        exit_now(1)
    exit_now(0)
