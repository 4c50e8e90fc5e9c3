"""`bench slurm`: write (and optionally submit) an sbatch script whose tasks are ranks."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

from bench.config.options import config_from_args, given, run_options_for
from bench.records.files import write_text_atomic
from bench.tools.errors import ConfigError
from bench.tools.folders import file_to_write

PASSES_RUN_OPTIONS = True  # any option it does not know is a `bench run` option


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench slurm``'s options (``help``: its line in ``bench --help``)."""
    slurm = sub.add_parser(
        "slurm", help=help,
        description="Any other option is a `bench run` option, passed to every task.",
    )
    slurm.add_argument("--strategy", required=True,
                       help="a strategy whose ranks can be srun tasks (see `bench list`)")
    slurm.add_argument("--nodes", type=int, required=True, help="machines to allocate")
    slurm.add_argument("--gpus", type=int, required=True, help="GPUs (tasks) per node")
    slurm.add_argument("--time", default="01:00:00",
                       help="wall-clock limit, HH:MM:SS (default 01:00:00)")
    slurm.add_argument("--job-name", default="parallel-bench",
                       help="Slurm job name (default parallel-bench)")
    slurm.add_argument("--partition", default=None, help="Slurm partition (default: the site's)")
    slurm.add_argument("--cpus-per-task", type=int, default=None,
                       help="CPU cores per task: its threads and loader workers (default 8 "
                            "per GPU, 1 per CPU process with --cpu)")
    slurm.add_argument("--exclusive", action="store_true",
                       help="the job's nodes whole (#SBATCH --exclusive): no other job shares "
                            "their cores, GPUs or network while it is timed (a record flags "
                            "shared cores; the rest it cannot see)")
    slurm.add_argument("--out", default="bench-slurm.sbatch",
                       help="script path (default bench-slurm.sbatch)")
    slurm.add_argument("--submit", action="store_true", help="run sbatch on the script")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    from bench.launch.preflight import check_launch_options, check_srun_task, resolve_strategy
    from bench.launch.slurm import note_forced_sharing, sbatch_script

    for flag in ("--nodes", "--gpus", "--strategy", "--node-rank", "--rdzv-endpoint"):
        if given(passed_on, flag):
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
    run = run_options_for("slurm", ["--strategy", args.strategy, "--gpus", str(args.gpus),
                                    *passed_on])
    cfg = config_from_args(run)
    cfg.validate()
    strategy = resolve_strategy(cfg)
    check_srun_task(strategy)
    check_launch_options(cfg, strategy, "slurm")  # what each task would refuse, after the queue
    if args.nodes < 1 or args.gpus < 1:
        raise ConfigError("--nodes and --gpus must be at least 1")
    cfg.check_batch_split(args.nodes * args.gpus)
    # Where the data and the records are, said in the script as absolute paths: left to
    # their defaults, every node would fill its own home's CIFAR cache and each job's
    # records would land wherever it started (and the job starts in this folder: --chdir)
    shared = [] if given(passed_on, "--output") else ["--output", str(Path(cfg.output).resolve())]
    if cfg.data != "synthetic" and not given(passed_on, "--data-dir"):
        shared += ["--data-dir", str(Path(cfg.data_dir).resolve())]
    script = sbatch_script(strategy=args.strategy, nodes=args.nodes, gpus=args.gpus,
                           time=args.time, job_name=args.job_name,
                           run_args=[*passed_on, *shared], partition=args.partition,
                           cpus_per_task=args.cpus_per_task or (1 if cfg.cpu else 8),
                           workdir=str(Path.cwd()), cpu=cfg.cpu, exclusive=args.exclusive)
    if args.submit and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run this on a Slurm login node, or drop "
                          "--submit and copy the script there")
    write_text_atomic(file_to_write("--out", args.out, "job.sbatch"), script)
    print(f"wrote {args.out}")
    if args.exclusive:
        note_forced_sharing("bench slurm", args.partition)
    if args.submit:
        return subprocess.run(["sbatch", args.out]).returncode
    return 0
