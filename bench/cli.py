"""bench: which PyTorch data-parallel strategy is fastest on your hardware, and does it cost
accuracy? Commands: list, run, sweep, verify, report, compare, probe, loader, project,
slurm."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import NoReturn

from bench import __version__, terminal
from bench.config import (
    BACKENDS,
)
from bench.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    STOP_SIGNALS,
    BenchError,
    ConfigError,
    Interrupted,
    raise_interrupted,
    signals_held,
)
from bench.run_options import add_run_options, config_from_args, parse_list


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line that names the fix, with exit code 2. Options are
    never abbreviated (``--epoch`` is not ``--epochs``): a typo is an error, not a guess."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{message}; see `{self.prog} --help`")


class _Version(argparse.Action):
    """``bench --version``: this package's version and torch's (imported only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print bench's and torch's versions and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import torch

        print(f"bench {__version__} (torch {torch.__version__}, CUDA {torch.version.cuda})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bench", description=__doc__)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="registered strategies and whether they run here")
    run = sub.add_parser("run", help="train with one strategy and write a JSON record")
    add_run_options(run)
    sweep = sub.add_parser(
        "sweep", help="every strategy x world size with one recipe (resumable)",
        description="Any other option is a `bench run` option, used for every run.",
    )
    sweep.add_argument("--strategies", required=True, help="comma-separated strategy names")
    sweep.add_argument("--gpus", required=True, help="comma-separated world sizes, e.g. 1,2,4")
    sweep.add_argument("--repeats", type=int, default=1, help="runs per combination")
    sweep.add_argument("--force", action="store_true", help="re-run combinations that have ok "
                       "records")
    sweep.add_argument("--run-timeout", type=float, default=None,
                       help="seconds after which one run is stopped and recorded as failed")
    verify = sub.add_parser(
        "verify", help="check that every strategy trains exactly like one plain process",
        description="Any other option is a `bench run` option (default --data synthetic), "
                    "so a run's command line can be checked as it is; those of its length "
                    "and output (--epochs, --train-limit, --warmup-epochs, --tf32, --output, "
                    "--tag, --mllog, the probes) have no effect: it trains --steps steps "
                    "(fp32 in float64, TF32 off) and writes nothing.",
    )
    verify.add_argument("--strategies", default=None, help="comma-separated (default: all)")
    verify.add_argument("--gpus", type=int, default=2, help="world size (default 2)")
    verify.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    verify.add_argument("--self-test", action="store_true",
                        help="show the check's power: break one strategy (--strategies, "
                             "default ddp) in five known ways; each must fail")
    verify.add_argument("--defects", default=None,
                        help="with --self-test: comma-separated defects to inject (default: "
                             "all five: sum-gradients, skip-allreduce, bn-grouping, "
                             "batch-order, lr-world-size)")
    loader = sub.add_parser(
        "loader", help="the input pipeline alone at each loader-worker count: how many "
                       "--workers feed faster than the model trains",
        description="Any other option is a `bench run` option (default --strategy ddp): the "
                    "loader is built as that run would build it, so a run's command line can "
                    "be given as it is; options of training and output (--epochs, --output, "
                    "--tag, --mllog, the probes) have no effect and nothing is written.",
    )
    loader.add_argument("--workers", default=None,
                        help="comma-separated loader workers per GPU/replica (default 0, then "
                             "powers of 2 up to the cores each process has)")
    loader.add_argument("--steps", type=int, default=30,
                        help="batches timed per count, after the workers' first (default 30)")
    loader.add_argument("--format", choices=("text", "json"), default="text",
                        help="text (default) or json")
    slurm = sub.add_parser(
        "slurm", help="write (and optionally submit) an sbatch script for a multi-node run",
        description="Any other option is a `bench run` option, passed to every task.",
    )
    slurm.add_argument("--strategy", required=True,
                       help="a strategy whose ranks can be srun tasks (see `bench list`)")
    slurm.add_argument("--nodes", type=int, required=True, help="machines to allocate")
    slurm.add_argument("--gpus", type=int, required=True, help="GPUs (tasks) per node")
    slurm.add_argument("--time", default="01:00:00", help="wall-clock limit, HH:MM:SS")
    slurm.add_argument("--job-name", default="parallel-bench", help="Slurm job name")
    slurm.add_argument("--partition", default=None, help="Slurm partition (default: the site's)")
    slurm.add_argument("--cpus-per-task", type=int, default=None,
                       help="CPU cores per task (loader workers need some)")
    slurm.add_argument("--out", default="bench-slurm.sbatch", help="script path")
    slurm.add_argument("--submit", action="store_true", help="run sbatch on the script")
    compare = sub.add_parser(
        "compare", help="compare two results (folders or record files); exit 1 on a regression")
    compare.add_argument("a", help="the baseline: results folder or record file")
    compare.add_argument("b", help="the candidate: results folder or record file")
    compare.add_argument("--threshold", type=float, default=5.0,
                         help="percent slower in img/s or time to target that counts as a "
                              "regression (default 5); top-1 regresses at p < 0.05")
    compare.add_argument("--format", choices=("text", "markdown", "csv", "json"),
                         default="text",
                         help="text (a block per workload, 120 columns; default), markdown "
                              "(every column), csv or json")
    probe = sub.add_parser(
        "probe", help="all-reduce bandwidth (algbw, busbw) for a backend and world size: the "
                      "comm ceiling the report compares runs with")
    probe.add_argument("--gpus", type=int, default=2,
                       help="ranks per machine (GPUs, or CPU processes with --cpu; default 2)")
    probe.add_argument("--cpu", action="store_true", help="CPU processes (gloo)")
    probe.add_argument("--backend", choices=BACKENDS, default=None,
                       help="default nccl on CUDA, gloo on CPU")
    probe.add_argument("--model", default="resnet18-cifar",
                       help="the model whose gradient size is also probed (as bench run's "
                            "--model; default resnet18-cifar, 100 classes)")
    probe.add_argument("--width", type=float, default=1.0,
                       help="resnet18-cifar's channel multiplier (default 1.0)")
    probe.add_argument("--nodes", type=int, default=1, help="machines (run it on each)")
    probe.add_argument("--node-rank", type=int, default=0, help="this machine's index")
    probe.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT (--nodes > 1)")
    probe.add_argument("--timeout", type=float, default=300.0,
                       help="seconds a collective may wait")
    probe.add_argument("--max-size", type=float, default=256.0,
                       help="largest message in MiB (default 256; the gradient is always "
                            "probed)")
    probe.add_argument("--output", default="results",
                       help="results folder; the record goes to OUTPUT/probes/")
    proj = sub.add_parser(
        "project", help="each measured strategy at 8 to 4,096 GPUs on paper (a model; "
                        "--validate shows its error on measured runs)")
    proj.add_argument("source", nargs="?", default="results",
                      help="results folder or one record (default results)")
    proj.add_argument("--gpus", default="8,64,512,4096", help="GPU counts, comma-separated")
    proj.add_argument("--gpus-per-node", type=int, default=8, help="default 8")
    proj.add_argument("--network", default="h100-nvlink-ndr",
                      help="h100-nvlink-ndr (default), a100-nvlink-hdr, pcie-ethernet-100g, "
                           "or probe (the newest `bench probe` in the results)")
    proj.add_argument("--intra-busbw", type=float, default=None, metavar="GB/s",
                      help="all-reduce busbw inside a node (with --inter-busbw)")
    proj.add_argument("--inter-busbw", type=float, default=None, metavar="GB/s",
                      help="network bandwidth per node (with --intra-busbw)")
    proj.add_argument("--format", choices=("text", "csv", "json"), default="text",
                      help="text (a block per workload; default), csv or json")
    proj.add_argument("--validate", action="store_true",
                      help="predict the measured multi-rank runs instead and print the error")
    proj.add_argument("--plot", default=None, metavar="FILE",
                      help="also draw efficiency against GPUs (.png or .svg), a panel per "
                           "workload, measured runs over the projection")
    report = sub.add_parser("report", help="summarise records into tables")
    report.add_argument("--results", default="results", help="results folder")
    report.add_argument("--reference", default=None,
                        help="STRATEGY[:N]: the row each workload's top-1 is compared with "
                             "(default ddp:1)")
    report.add_argument("--format", choices=("text", "wide", "markdown", "csv", "json"),
                        default="text",
                        help="how the table is printed: text (the key columns, per workload; "
                             "default), wide (every column), markdown, csv, json")
    report.add_argument("--no-write", action="store_true",
                        help="print only; do not write summary files")
    report.add_argument("--update-readme", nargs="?", const="README.md", default=None,
                        metavar="README", help="rewrite the README's comparison table")
    return parser


def cmd_list() -> int:
    import torch

    import strategies

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    header = ("strategy", "launcher", "available here", "what it is")
    rows, reasons = [], []
    for name in strategies.names():
        strategy = strategies.get(name)
        reason = strategy.requires(device_type)
        rows.append((name, strategy.launcher, "yes" if reason is None else "no (below)",
                     strategy.summary))
        if reason:
            reasons.append(f"  {name}: {reason}")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3])
    print(f"(device here: {device_type})")
    if reasons:
        print("not available here:")
        for reason in reasons:
            print(terminal.fill(reason, subsequent_indent="    "))
    return 0


def _run_options(command: str, run_args: list[str]) -> argparse.Namespace:
    """``bench run``'s options given to another command, which passes on what it does not
    know itself; an option neither knows is named with both helps."""
    run, unknown = build_parser().parse_known_args(["run", *run_args])
    if unknown:
        raise ConfigError(f"unrecognized arguments: {' '.join(unknown)}; neither "
                          f"`bench {command} --help` nor `bench run --help` lists it")
    return run


def cmd_sweep(args: argparse.Namespace, run_args: list[str]) -> int:
    from bench.sweep import run_sweep

    for flag in ("--strategy", "--tag"):
        if any(a == flag or a.startswith(flag + "=") for a in run_args):
            raise ConfigError(f"bench sweep sets {flag} itself; use --strategies")
    run = _run_options("sweep", ["--strategy", "ddp", *run_args])
    base = config_from_args(run)
    if base.mllog and "{run_id}" not in base.mllog:
        raise ConfigError("in a sweep, --mllog needs {run_id} in its name (one log per run), "
                          "e.g. --mllog 'logs/{run_id}.log'")
    strategies = parse_list(args.strategies, "--strategies")
    gpus = parse_list(args.gpus, "--gpus", int)
    return run_sweep(base, run_args, strategies, gpus, repeats=args.repeats, force=args.force,
                     run_timeout=args.run_timeout)


def cmd_slurm(args: argparse.Namespace, run_args: list[str]) -> int:
    import re
    import shutil
    import subprocess

    from bench.cluster import sbatch_script
    from bench.folders import file_to_write
    from bench.results import write_text_atomic

    for flag in ("--nodes", "--gpus", "--strategy", "--node-rank", "--rdzv-endpoint"):
        if any(a == flag or a.startswith(flag + "=") for a in run_args):
            raise ConfigError(f"bench slurm sets {flag} itself")
    if not re.fullmatch(r"(\d+-)?\d{1,2}(:\d{2}){1,2}", args.time):
        raise ConfigError(f"--time must look like HH:MM:SS (got {args.time!r})")
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        raise ConfigError(f"--cpus-per-task must be at least 1 (got {args.cpus_per_task})")
    for flag, value in (("--job-name", args.job_name), ("--partition", args.partition)):
        # an #SBATCH line takes one word: a space or a quote would end or garble it
        if value is not None and not re.fullmatch(r"[\w.,+-]+", value):
            raise ConfigError(f"{flag} takes letters, digits and . , + - _ (got {value!r})")
    # Validate the run options as the tasks will see them.
    run = _run_options("slurm", ["--strategy", args.strategy, "--gpus", str(args.gpus),
                                 *run_args])
    cfg = config_from_args(run)
    cfg.validate()
    from bench.preflight import check_srun_task, resolve_strategy

    check_srun_task(resolve_strategy(cfg))
    if args.nodes < 1 or args.gpus < 1:
        raise ConfigError("--nodes and --gpus must be at least 1")
    cfg.check_batch_split(args.nodes * args.gpus)
    script = sbatch_script(strategy=args.strategy, nodes=args.nodes, gpus=args.gpus,
                           time=args.time, job_name=args.job_name, run_args=run_args,
                           partition=args.partition, cpus_per_task=args.cpus_per_task)
    if args.submit and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run this on a Slurm login node, or drop "
                          "--submit and copy the script there")
    write_text_atomic(file_to_write("--out", args.out, "job.sbatch"), script)
    print(f"wrote {args.out}")
    if args.submit:
        return subprocess.run(["sbatch", args.out]).returncode
    return 0


def cmd_loader(args: argparse.Namespace, run_args: list[str]) -> int:
    from bench.loader_sweep import cmd_loader as sweep_loader

    if not any(a == "--strategy" or a.startswith("--strategy=") for a in run_args):
        run_args = ["--strategy", "ddp", *run_args]
    run = _run_options("loader", run_args)
    counts = parse_list(args.workers, "--workers", int) if args.workers is not None else None
    return sweep_loader(config_from_args(run), counts, args.steps, args.format)


def cmd_verify(args: argparse.Namespace, run_args: list[str]) -> int:
    from bench.verify import VERIFY_WIDTH, default_strategies, run_self_test, run_verify

    def given(flag: str) -> bool:
        return any(a == flag or a.startswith(flag + "=") for a in run_args)

    # the narrow ResNet-18 by default; --width scales only that model
    defaults = [("--data", "synthetic")] + ([] if given("--model") else
                                            [("--width", VERIFY_WIDTH)])
    for flag, default in defaults:
        if not given(flag):
            run_args = [flag, default, *run_args]
    run = _run_options("verify", ["--strategy", "ddp", "--gpus", str(args.gpus), *run_args])
    names = parse_list(args.strategies, "--strategies") if args.strategies else None
    defects = parse_list(args.defects, "--defects") if args.defects else None
    if defects is not None and not args.self_test:
        raise ConfigError("--defects chooses what --self-test injects; add --self-test")
    if args.self_test:
        if names is not None and len(names) != 1:
            raise ConfigError("--self-test breaks one strategy: give one name to --strategies")
        return run_self_test(config_from_args(run), (names or ["ddp"])[0], args.steps,
                             defects)
    return run_verify(config_from_args(run), names or default_strategies(), args.steps)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for signum in STOP_SIGNALS:  # like Ctrl-C: exit 130 (not under a harness's own handler,
        if signal.getsignal(signum) is signal.SIG_DFL:  # nor where nohup ignores SIGHUP)
            signal.signal(signum, raise_interrupted)
    try:
        return _dispatch(argv)
    except (KeyboardInterrupt, Interrupted):
        print("bench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `bench report | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def entry() -> NoReturn:
    """The ``bench`` command and ``python -m bench``: ``main``, then an exit that skips the
    interpreter's teardown (bench.quick_exit; ~0.8 s once torch is imported)."""
    from bench.quick_exit import exit_now
    from bench.streams import guard_standard_streams

    guard_standard_streams()
    exit_now(main())


# Commands that take any other option as a `bench run` option.
_PASS_RUN_OPTIONS = {"sweep": cmd_sweep, "slurm": cmd_slurm, "loader": cmd_loader,
                     "verify": cmd_verify}
# Commands that import torch: they import it first, with the signals held (errors.signals_held).
_IMPORT_TORCH = {"list", "run", "sweep", "verify", "probe", "loader"}


def _dispatch(argv: list[str]) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown and args.command not in _PASS_RUN_OPTIONS:  # argparse would name `bench
            raise ConfigError(f"unrecognized arguments: {' '.join(unknown)}; "  # --help`
                              f"see `bench {args.command} --help`")
        if args.command in _IMPORT_TORCH:
            with signals_held():
                import torch  # noqa: F401
        if args.command in _PASS_RUN_OPTIONS:
            return _PASS_RUN_OPTIONS[args.command](args, unknown)
        if args.command == "list":
            return cmd_list()
        if args.command == "run":
            from bench.runner import execute

            return execute(config_from_args(args), ["bench", *argv])
        if args.command == "probe":
            from bench.probe import run_probe

            return run_probe(gpus=args.gpus, cpu=args.cpu, backend=args.backend,
                             width=args.width, model=args.model, output=args.output,
                             nodes=args.nodes,
                             node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                             timeout=args.timeout, max_mib=args.max_size)
        if args.command == "compare":
            from bench.compare import cmd_compare

            return cmd_compare(args.a, args.b, args.threshold, args.format)
        if args.command == "project":
            from bench.project import cmd_project

            return cmd_project(args.source, parse_list(args.gpus, "--gpus", int),
                               args.gpus_per_node, args.network, args.intra_busbw,
                               args.inter_busbw, args.format, args.validate, args.plot)
        if args.command == "report":
            from bench.report import cmd_report

            return cmd_report(args.results, args.format, write=not args.no_write,
                              readme=args.update_readme, reference=args.reference)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return EXIT_BAD_INPUT
