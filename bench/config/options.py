"""The options of `bench run` (shared by sweep, verify and slurm, which pass them on) and
the frozen RunConfig they make: option names are the config's field names."""

from __future__ import annotations

import argparse

from bench.config.run_config import (
    APEX_DDP,
    APEX_OPT_LEVELS,
    BACKENDS,
    DATASETS,
    DDP_COMM_HOOKS,
    HVD_COMPRESSION,
    LOADERS,
    OPTIMIZER_IMPLS,
    PRECISIONS,
    SYNTHETIC_DIFFICULTY,
    TF32,
    RunConfig,
    default_data_dir,
)
from bench.tools.errors import ConfigError


class BenchParser(argparse.ArgumentParser):
    """argparse whose errors are one line that names the fix, with exit code 2. Options are
    never abbreviated (``--epoch`` is not ``--epochs``): a typo is an error, not a guess."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message}; see `{self.prog} --help`")


def run_parser() -> BenchParser:
    """``bench run``'s parser alone (its options, its prog in every error)."""
    parser = BenchParser(prog="bench run", add_help=False)
    add_run_options(parser)
    return parser


def run_options_for(command: str, run_args: list[str]) -> argparse.Namespace:
    """``bench run``'s options given to another command, which passes on what it does not
    know itself; an option neither knows is named with both helps."""
    run, unknown = run_parser().parse_known_args(run_args)
    if unknown:
        raise ConfigError(f"unrecognized arguments: {' '.join(unknown)}; neither "
                          f"`bench {command} --help` nor `bench run --help` lists it")
    return run


def given(run_args: list[str], flag: str) -> bool:
    """Whether ``flag`` is among the options passed on (``--flag VALUE`` or ``--flag=VALUE``)."""
    return any(a == flag or a.startswith(flag + "=") for a in run_args)


def without(run_args: list[str], flags: tuple[str, ...]) -> list[str]:
    """The options passed on less ``flags`` and their values (each takes one: ``--flag
    VALUE`` or ``--flag=VALUE``)."""
    out, skip = [], False
    for arg in run_args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not any(arg.startswith(flag + "=") for flag in flags):
            out.append(arg)
    return out


def parse_list(text: str, flag: str, cast=str) -> list:
    """A comma-separated option (--gpus 1,2,4): its values, each once in the order given
    (``ddp,ddp`` ran or measured the same thing twice), or one line naming the fix."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        values = [cast(x) for x in items]
    except ValueError:
        raise ConfigError(f"{flag} takes a comma-separated list (got {text!r})") from None
    if not values:
        raise ConfigError(f"{flag} needs at least one value")
    return list(dict.fromkeys(values))


def add_run_options(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("strategy and devices")
    what.add_argument("--strategy", required=True, help="strategy name (see `bench list`)")
    what.add_argument("--gpus", type=int, default=1,
                      help="GPUs to use, or CPU processes with --cpu (default 1)")
    what.add_argument("--cpu", action="store_true",
                      help="run on CPU (gloo): --gpus = processes")

    data = p.add_argument_group("data")
    data.add_argument("--data", choices=DATASETS, default="cifar100",
                      help="cifar100 (real, default), synthetic (deterministic, learnable) "
                           "or imagefolder (your images: DIR/train/CLASS/*, DIR/val/CLASS/*)")
    data.add_argument("--data-dir", default=str(default_data_dir()),
                      help="CIFAR-100 folder (downloaded there when absent), or the "
                           "ImageFolder's DIR (default %(default)s; $BENCH_DATA_DIR sets it)")
    data.add_argument("--no-download", action="store_true", help="never download CIFAR-100")
    data.add_argument("--synthetic-difficulty", type=float, default=SYNTHETIC_DIFFICULTY,
                      help="0..1: fainter, shifted class patterns and 0.3·d noisy labels, so "
                           f"top-1 does not saturate (default {SYNTHETIC_DIFFICULTY:g}; 0 = easy)")
    data.add_argument("--synthetic-classes", type=int, default=100,
                      help="classes of the synthetic set (default 100)")
    data.add_argument("--image-size", type=int, default=None,
                      help="pixels per side (default: the model's, 32 for resnet18-cifar and "
                           "your own, 224 for torchvision models; CIFAR-100 is resized)")
    data.add_argument("--train-limit", type=int, default=None,
                      help="use the first N training images")
    data.add_argument("--test-limit", type=int, default=None, help="use the first N test images")
    data.add_argument("--workers", type=int, default=None,
                      help="loader workers per GPU/replica (default 0 on CPU, up to 4 per GPU)")
    data.add_argument("--loader", choices=LOADERS, default="torch",
                      help="torch: DataLoader + per-image transforms (the seeds' way); "
                           "gpu: whole set on the device, batch-wide crop/flip (default "
                           "torch)")

    train = p.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=30,
                       help="epochs; the first is reported as warm-up (default 30)")
    train.add_argument("--batch-size", type=int, default=128,
                       help="global batch, split evenly over replicas (default 128)")
    train.add_argument("--lr", type=float, default=None,
                       help="peak lr (default: --base-lr x batch/128)")
    train.add_argument("--base-lr", type=float, default=0.1,
                       help="lr at global batch 128, scaled linearly (default 0.1)")
    train.add_argument("--warmup-epochs", type=float, default=1.0,
                       help="linear warm-up epochs, then cosine decay to 0 (default 1)")
    train.add_argument("--weight-decay", type=float, default=5e-4,
                       help="SGD weight decay; momentum 0.9, Nesterov (default 5e-4)")
    train.add_argument("--grad-accum", type=int, default=1,
                       help="micro-steps per optimizer step (--batch-size stays the "
                            "effective batch; default 1)")
    train.add_argument("--seed", type=int, default=0,
                       help="seed of weights, data order and augmentation (default 0)")
    train.add_argument("--model", default="resnet18-cifar",
                       help="resnet18-cifar (default), torchvision:NAME (random weights, e.g. "
                            "torchvision:resnet50) or package.module:function (called with "
                            "the number of classes, returns an nn.Module)")
    train.add_argument("--width", type=float, default=1.0,
                       help="ResNet-18 channel multiplier (default 1.0, the real model)")
    train.add_argument("--no-syncbn", action="store_true",
                       help="keep per-replica BatchNorm (SyncBatchNorm otherwise, on GPU)")
    train.add_argument("--ghost-bn", type=int, default=None, metavar="G",
                       help="BatchNorm's training statistics over each G images of a "
                            "replica's batch, in one forward: per-replica BN at G a replica")

    target = p.add_argument_group("time to accuracy")
    target.add_argument("--target-top1", type=float, default=None, metavar="P",
                        help="record the wall time from the first step to the end of the "
                             "first evaluation with top-1 >= P %%")
    target.add_argument("--stop-at-target", action="store_true",
                        help="end the run at that evaluation (MLPerf style)")
    target.add_argument("--mllog", default=None, metavar="FILE",
                        help="also write the run's events as an MLPerf log (mlperf-logging's "
                             "mllog; {run_id} in FILE is replaced by the run id)")

    why = p.add_argument_group("where the time goes")
    why.add_argument("--comm-probe-steps", type=int, default=20,
                     help="after the epochs, this many steps with gradient sync off give "
                          "compute_step_s and exposed_comm_fraction (multi-rank; 0: none; "
                          "default 20)")
    why.add_argument("--loader-probe-steps", type=int, default=30,
                     help="after the epochs, this many batches drawn from the input pipeline "
                          "alone (onto the device, no model) give the img/s it can feed at "
                          "most: a row near it is input-bound (0: none; default 30)")
    why.add_argument("--profile-steps", type=int, default=0,
                     help="after the epochs, a torch.profiler trace of this many steps in "
                          "OUTPUT/traces/ (Perfetto, TensorBoard; default 0: none)")

    speed = p.add_argument_group("precision and speed")
    speed.add_argument("--precision", choices=PRECISIONS, default=None,
                       help="default fp32; ddp-amp: fp16 on CUDA, bf16 on CPU")
    speed.add_argument("--tf32", choices=TF32, default=None,
                       help="TF32 for fp32 convolutions and matmuls on Ampere+ GPUs (default: "
                            "torch's, i.e. convolutions in TF32); recorded as allow_tf32")
    speed.add_argument("--channels-last", action="store_true", help="NHWC memory format")
    speed.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                       help="torch.compile the model (compile time recorded apart; the "
                            "warm-up may take up to 30 min); MODE: default, reduce-overhead "
                            "(CUDA graphs), max-autotune or max-autotune-no-cudagraphs")
    speed.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS, default="default",
                       help="SGD implementation (default: torch's choice)")
    speed.add_argument("--no-cudnn-benchmark", action="store_true",
                       help="turn cudnn.benchmark off (on by default on GPU)")

    dist = p.add_argument_group("distributed")
    dist.add_argument("--nodes", type=int, default=1,
                      help="machines; run the same command on each (torchrun c10d "
                           "rendezvous; default 1)")
    dist.add_argument("--node-rank", type=int, default=0,
                      help="this machine's index (0..nodes-1, default 0)")
    dist.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    dist.add_argument("--rdzv-id", default=None,
                      help="run id shared by all nodes (default: derived from the command)")
    dist.add_argument("--max-restarts", type=int, default=0,
                      help="torchrun --max-restarts (default 0)")
    dist.add_argument("--no-slurm", action="store_true",
                      help="ignore Slurm variables (do not act as one srun task)")
    dist.add_argument("--master-port", type=int, default=None,
                      help="rendezvous port on this machine (default: a free port)")
    dist.add_argument("--backend", choices=BACKENDS, default=None,
                      help="process-group backend (default nccl on CUDA, gloo on CPU); gloo "
                           "lets several ranks share one GPU, for correctness checks only")
    dist.add_argument("--timeout", type=float, default=300.0,
                      help="seconds a collective, or a rank waiting for its loader "
                           "workers' next batch, may wait before the run fails (default 300; "
                           "longer while a --compile run compiles)")

    ddp = p.add_argument_group("DDP knobs (torch's defaults; recorded as ddp_options)")
    ddp.add_argument("--bucket-cap-mb", type=float, default=25.0,
                     help="gradient bucket size in MiB (default 25)")
    ddp.add_argument("--gradient-as-bucket-view", action="store_true",
                     help="gradients are views into the all-reduce buckets")
    ddp.add_argument("--static-graph", action="store_true",
                     help="the graph is the same every step (not with --grad-accum > 1)")
    ddp.add_argument("--find-unused-parameters", action="store_true",
                     help="look for parameters without gradients every step")
    ddp.add_argument("--no-broadcast-buffers", action="store_true",
                     help="do not broadcast rank 0's buffers every forward")
    ddp.add_argument("--ddp-comm-hook", choices=DDP_COMM_HOOKS, default="none",
                     help="gradient compression by DDP's communication hooks: fp16 / bf16 "
                          "(cast for the all-reduce; horovod's --hvd-compression fp16 "
                          "counterpart) or powersgd (low-rank, with error feedback); "
                          "default none")
    ddp.add_argument("--powersgd-rank", type=int, default=1,
                     help="PowerSGD's approximation rank (default 1, torch's)")
    ddp.add_argument("--cpu-syncbn", action="store_true",
                     help="CPU ranks: BatchNorm over the global batch, as SyncBatchNorm on "
                          "GPUs (bench's own over gloo: torch's needs an accelerator); "
                          "without it CPU ranks normalise per replica")

    other = p.add_argument_group("horovod, fsdp and apex")
    other.add_argument("--hvd-compression", choices=HVD_COMPRESSION, default="none",
                       help="horovod: gradient compression on the wire (default none)")
    other.add_argument("--no-reshard-after-forward", action="store_true",
                       help="fsdp: keep the gathered parameters from forward to backward "
                            "(ZeRO-2-like: one all-gather less per step, more memory)")
    other.add_argument("--hosts", default=None,
                       help="horovod: host1:4,host2:4 for horovodrun -H")
    other.add_argument("--apex-opt-level", choices=APEX_OPT_LEVELS, default="O1",
                       help="ddp-apex: apex.amp opt level (default O1)")
    other.add_argument("--apex-ddp", choices=APEX_DDP, default="apex",
                       help="ddp-apex: wrap with apex.parallel or torch DDP (default apex)")

    out = p.add_argument_group("output")
    out.add_argument("--output", default="results",
                     help="results folder; records go to OUTPUT/runs/ (default results)")
    out.add_argument("--no-progress", action="store_true",
                     help="no progress bar, nor the lines that say how long the run and "
                          "its steps after the epochs will take")
    out.add_argument("--tag", default=None, help="free-form label stored in the record")
    # bench sweep --batch-size max: where bench fit found --batch-size the largest
    out.add_argument("--batch-fits-in", default=None, help=argparse.SUPPRESS)


# Flags that switch a RunConfig default off: flag dest -> field.
_NEGATED = {
    "no_download": "download", "no_syncbn": "syncbn", "no_progress": "progress",
    "no_slurm": "use_slurm", "no_cudnn_benchmark": "cudnn_benchmark",
    "no_broadcast_buffers": "broadcast_buffers",
    "no_reshard_after_forward": "reshard_after_forward",
}


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed `bench run` options (option names are field names)."""
    values = {}
    for name, value in vars(args).items():
        if name in _NEGATED:
            values[_NEGATED[name]] = not value
        elif name == "compile":  # --compile [MODE]: on, in that mode
            values["compile"], values["compile_mode"] = value is not None, value or "default"
        else:
            values[name] = value
    return RunConfig.from_dict(values)
