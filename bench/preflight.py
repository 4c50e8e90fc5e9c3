"""What ``bench run`` settles before anything starts, each a one-line error naming the fix
(exit 2) when it cannot: the device, the strategy and its options, the output folder, the
data and the loader workers."""

from __future__ import annotations

import tempfile
from pathlib import Path

import strategies
from bench.cluster import slurm_task
from bench.config import GPU_LOADER_WORKERS, RunConfig
from bench.data import SYNTHETIC_SIZES, prepare_cifar100
from bench.datasets import check_memory
from bench.errors import ConfigError
from bench.folders import missing_folders, remove_created
from bench.results import runs_dir
from strategies.base import Strategy, cpu_threads_per_process


def resolve_device(cfg: RunConfig) -> str:
    """``cuda`` or ``cpu``; asking for GPUs that are not there is bad input naming --cpu."""
    if cfg.cpu:
        return "cpu"
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        raise ConfigError(
            f"no CUDA GPU is visible here; add --cpu to run {cfg.gpus} CPU process(es) instead"
        )
    if cfg.gpus > visible and cfg.backend != "gloo" and not (cfg.use_slurm and slurm_task()):
        raise ConfigError(
            f"--gpus {cfg.gpus} but only {visible} CUDA GPU(s) are visible; use --gpus "
            f"{visible} or fewer, --cpu, or --backend gloo to let ranks share a GPU "
            "(a correctness check: its timings are not comparable)"
        )
    return "cuda"


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


def check_strategy_options(cfg: RunConfig, strategy: Strategy) -> None:
    """Options that belong to some strategies only change nothing elsewhere: refused there
    rather than recorded as if they had run."""
    if cfg.ddp_comm_hook != "none" and not strategy.accepts_ddp_comm_hook:
        instead = (" (its counterpart: --hvd-compression fp16)" if strategy.name == "horovod"
                   else "")
        raise ConfigError(f"--ddp-comm-hook is a torch DDP option; {strategy.name} does not "
                          f"wrap the model in torch's DDP{instead}")
    if not cfg.reshard_after_forward and strategy.name != "fsdp":
        raise ConfigError("--no-reshard-after-forward is an fsdp option; drop it for "
                          f"{strategy.name}")


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
    folder = runs_dir(output).absolute()
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
    a set this machine's ``processes`` cannot hold in memory is refused."""
    if cfg.data == "synthetic":
        train, test = SYNTHETIC_SIZES["train"], SYNTHETIC_SIZES["test"]
        kind = "synthetic"
    elif cfg.data == "imagefolder":
        from bench.imagefolder import split_size

        train, test = split_size(cfg.data_dir, "train"), split_size(cfg.data_dir, "test")
        kind = "imagefolder"
    else:
        kind, train, test = prepare_cifar100(Path(cfg.data_dir), download=cfg.download)
    train = min(train, cfg.train_limit or train)
    test = min(test, cfg.test_limit or test)
    if train < cfg.batch_size:
        raise ConfigError(
            f"{train} training images are fewer than one global batch ({cfg.batch_size}); "
            "raise --train-limit or lower --batch-size"
        )
    check_memory(cfg, train, test, processes)
    return kind, train, test


def default_workers(device_type: str, replicas: int) -> int:
    """Loader workers per replica: none on CPU (they would steal the compute cores),
    up to GPU_LOADER_WORKERS per GPU otherwise."""
    if device_type == "cpu":
        return 0
    return max(0, min(GPU_LOADER_WORKERS, cpu_threads_per_process(replicas) - 1))
