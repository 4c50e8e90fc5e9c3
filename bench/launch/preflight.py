"""What ``bench run`` settles before anything starts, each a one-line error naming the fix
(exit 2) when it cannot: the device, the strategy and its options, the output folder, the
data and the loader workers."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import strategies
from bench.config.run_config import GPU_LOADER_WORKERS, RunConfig
from bench.config.strategy_parts import StrategyOptions
from bench.data.datasets import check_memory, physical_memory
from bench.data.image_sets import SYNTHETIC_SIZES, prepare_cifar100
from bench.launch.slurm import slurm_task
from bench.records.files import runs_dir
from bench.tools import terminal
from bench.tools.errors import ConfigError
from bench.tools.folders import missing_folders, remove_created
from strategies.base import Strategy, cpu_threads_per_process


def resolve_device(cfg: RunConfig) -> str:
    """``cuda`` or ``cpu``; asking for GPUs that are not there is bad input naming --cpu."""
    if cfg.cpu:
        return "cpu"
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        raise ConfigError(
            "no CUDA GPU is visible here; add --cpu to run "
            f"{terminal.count(cfg.gpus, 'CPU process', 'CPU processes')} instead"
        )
    if cfg.gpus > visible and cfg.backend != "gloo" and not (cfg.use_slurm and slurm_task()):
        raise ConfigError(
            f"--gpus {cfg.gpus} but only {terminal.count(visible, 'CUDA GPU')} "
            f"{'is' if visible == 1 else 'are'} visible; use --gpus "
            f"{visible} or fewer, --cpu, or --backend gloo to let ranks share a GPU "
            "(a correctness check: its timings are not comparable)"
        )
    return "cuda"


# The least a rank and a loader worker hold before their data: the interpreter, torch, the
# process group. Measured (proportional set size, shared pages split): 0.49 GB for a CPU rank
# of ResNet-18 x0.125, 0.95 GB at full width; 0.087 GB for each of its 4 loader workers.
RANK_FLOOR_BYTES = int(0.45 * 2**30)
WORKER_FLOOR_BYTES = int(0.08 * 2**30)


def check_processes_fit(processes: int, workers_per_process: int = 0,
                        replicas_per_process: int = 1) -> None:
    """Refuse more ranks, or loader workers, than this machine's memory could hold even for
    the smallest model (64 CPU ranks asked of 24 GiB, or 100,000 workers, swapped it to a halt
    until the kernel killed processes at random)."""
    have = physical_memory()
    if have is None:
        return
    room = 0.8 * have
    ranks = processes * RANK_FLOOR_BYTES
    need = ranks + processes * workers_per_process * WORKER_FLOOR_BYTES
    if need <= room:
        return
    one = processes == 1
    said = (f"{processes} process{'' if one else 'es'} on this machine"
            + (f" with {workers_per_process:,} loader workers{'' if one else ' each'}"
               if workers_per_process else "")
            + f" hold{'s' if one else ''} at least {need / 2**30:,.0f} GiB before any data, "
            f"more than its {have / 2**30:.0f} GiB")
    if ranks > room:
        most = max(1, int(room // RANK_FLOOR_BYTES))
        raise ConfigError(f"{said}; lower --gpus (even the smallest model's ranks fit {most} "
                          "at most here)")
    per_process = int((room - ranks) // (processes * WORKER_FLOOR_BYTES))
    per_replica = per_process // replicas_per_process
    raise ConfigError(f"{said}; lower --workers (at most {per_replica} per replica fit here)")


def shares_gpus(cfg: RunConfig, device_type: str) -> bool:
    """More ranks than GPUs on this machine (allowed with gloo only, see resolve_device)."""
    if device_type != "cuda":
        return False
    import torch

    return cfg.gpus > torch.cuda.device_count()


def resolve_strategy(cfg: RunConfig) -> Strategy:
    """The run's strategy, built with its own options; an unknown name is bad input."""
    try:
        return strategies.get(cfg.strategy, cfg.strategy_options)
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None


# Each part of StrategyOptions: its fields' flags, and whose options they are.
_OPTION_FLAGS = {
    "ddp": {"bucket_cap_mb": "--bucket-cap-mb",
            "gradient_as_bucket_view": "--gradient-as-bucket-view",
            "static_graph": "--static-graph", "find_unused_parameters": "--find-unused-parameters",
            "broadcast_buffers": "--no-broadcast-buffers", "comm_hook": "--ddp-comm-hook",
            "powersgd_rank": "--powersgd-rank", "cpu_syncbn": "--cpu-syncbn"},
    "apex": {"opt_level": "--apex-opt-level", "ddp": "--apex-ddp"},
    "horovod": {"compression": "--hvd-compression"},
    "fsdp": {"reshard_after_forward": "--no-reshard-after-forward"},
}
_WHOSE = {"ddp": ("a", "torch DDP"), "apex": ("a", "ddp-apex"), "horovod": ("a", "horovod"),
          "fsdp": ("an", "fsdp")}


def check_strategy_options(cfg: RunConfig, strategy: Strategy) -> None:
    """Options that belong to some strategies only change nothing elsewhere: refused there
    rather than recorded as if they had run."""
    given, defaults = cfg.strategy_options, StrategyOptions()
    for part, flags in _OPTION_FLAGS.items():
        if part in strategy.own_options:
            continue
        named = [flag for name, flag in flags.items()
                 if getattr(getattr(given, part), name) != getattr(getattr(defaults, part), name)]
        if named:
            raise ConfigError(_refusal(part, named, strategy.name))


def _refusal(part: str, flags: list[str], strategy: str) -> str:
    article, whose = _WHOSE[part]
    which = (f"{flags[0]} is {article} {whose} option" if len(flags) == 1
             else f"{', '.join(flags)} are {whose} options")
    if part != "ddp":
        hint = " (torch DDP's counterpart: --ddp-comm-hook fp16)" if part == "horovod" else ""
        return f"{which}{hint}; drop {'it' if len(flags) == 1 else 'them'} for {strategy}"
    if strategy == "ddp-apex":
        return f"{which}; ddp-apex wraps the model in apex's DDP: add --apex-ddp torch or drop it"
    instead = ""
    if strategy == "horovod" and "--ddp-comm-hook" in flags:
        instead = " (its counterpart: --hvd-compression fp16)"
    return f"{which}; {strategy} does not wrap the model in torch's DDP{instead}"


_STARTS_RANKS = {"inline": "runs in one process", "spawn": "starts its ranks with mp.spawn",
                 "torch.distributed.launch": "starts its ranks with torch.distributed.launch",
                 "horovodrun": "starts its ranks with horovodrun",
                 "slurm": "runs as srun tasks here"}


def check_launch_options(cfg: RunConfig, strategy: Strategy, launcher: str) -> None:
    """torchrun's restarts asked of a run that torchrun does not start change nothing:
    refused, as other strategies' options are."""
    if cfg.max_restarts and launcher != "torchrun":
        raise ConfigError(f"--max-restarts is a torchrun option; {strategy.name} "
                          f"{_STARTS_RANKS.get(launcher, 'starts its ranks with ' + launcher)}"
                          ": drop it")


def check_srun_task(strategy: Strategy, alternative: str = "") -> None:
    """Under srun each task is one rank: only strategies that find their rank in the
    environment can run that way."""
    if not strategy.runs_as_srun_task:
        raise ConfigError(
            f"under srun each task is one rank; {strategy.name} cannot run that way: use "
            f"{', '.join(strategies.srun_capable())}{alternative}"
        )


def check_output_writable(output: str) -> tuple[Path, list[Path]]:
    """The runs folder, made if absent and probed; also the folders this call created, so
    that a run refused later can leave nothing behind."""
    return writable_folder(runs_dir(output))


def writable_folder(folder: Path) -> tuple[Path, list[Path]]:
    """``folder`` (under ``--output``), made if absent and probed with a file of a record's
    name length; also the folders made, for a refusal later to remove."""
    folder = Path(folder).absolute()
    created: list[Path] = []
    try:
        created = missing_folders(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # As long a name as a record's temporary file (.<run id>.json.XXXXXXXX.tmp), so a
        # path too long for one fails here, before anything runs.
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-" + "x" * 56,
                                         suffix=".tmp"):
            pass
    except OSError as exc:
        remove_created(created)
        where = str(folder) if len(str(folder)) <= 200 else str(folder)[:197] + "..."
        raise ConfigError(
            f"cannot write results to {where} ({exc.strerror or exc}); choose another --output"
        ) from None
    return folder, created


def prepare_data(cfg: RunConfig, processes: int = 1) -> tuple[str, int, int]:
    """Dataset kind and the train / test sizes after limits (downloads CIFAR-100 if absent);
    a set this machine's ``processes`` cannot hold in memory is refused. What the data's
    reading noticed is said once all is well (bad input stays one line)."""
    notes: list[str] = []
    kind, train, test = data_sizes(cfg, notes)
    check_data_fits(cfg, train, test, processes)
    say_notes(notes)
    return kind, train, test


def say_notes(notes: list[str]) -> None:
    """Each note on stderr as bench's, within 120 columns."""
    for note in notes:
        print(terminal.fill(f"bench: {note}", subsequent_indent="    "), file=sys.stderr)


def data_sizes(cfg: RunConfig, notes: list[str] | None = None) -> tuple[str, int, int]:
    """Dataset kind and the train / test sizes after limits, the data made ready (CIFAR-100
    downloaded if absent and allowed): what differs between runs only in strategy, N and
    batch is read once. ``notes`` gets what a user should hear of it (the files of an
    ImageFolder that are no images it reads)."""
    if cfg.data == "synthetic":  # drawn at any size: a limit is the size (image_set)
        train = cfg.train_limit or SYNTHETIC_SIZES["train"]
        test = cfg.test_limit or SYNTHETIC_SIZES["test"]
        kind = "synthetic"
    elif cfg.data == "imagefolder":
        from bench.data.imagefolder import sizes_and_left_out

        train, test, note = sizes_and_left_out(cfg.data_dir)
        kind = "imagefolder"
        if note and notes is not None:
            notes.append(note)
    else:
        kind, train, test = prepare_cifar100(Path(cfg.data_dir), download=cfg.download)
    return kind, min(train, cfg.train_limit or train), min(test, cfg.test_limit or test)


def check_data_fits(cfg: RunConfig, train: int, test: int, processes: int) -> None:
    """A training set of at least one global batch, that ``processes`` here can hold."""
    if train < cfg.batch_size:
        raise ConfigError(
            f"{train} training images are fewer than one global batch ({cfg.batch_size}); "
            "raise --train-limit or lower --batch-size"
        )
    check_memory(cfg, train, test, processes)


def default_workers(device_type: str, replicas: int, threads: int | None = None) -> int:
    """Loader workers per replica: none on CPU (they would steal the compute cores),
    up to GPU_LOADER_WORKERS per GPU otherwise, one core left to the process (``threads``:
    its cores where the caller knows them, else this machine's split over ``replicas``)."""
    if device_type == "cpu":
        return 0
    cores = threads if threads is not None else cpu_threads_per_process(replicas)
    return max(0, min(GPU_LOADER_WORKERS, cores - 1))
