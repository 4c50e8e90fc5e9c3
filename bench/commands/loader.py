"""``bench loader``: the input pipeline alone, at each loader-worker count, before a run.

A run measures its own pipeline at the one worker count it used (``loader alone``); this asks
the question before a table is spent: how many ``--workers`` feed this workload faster than the
model trains? Each of the run's processes on this machine builds its own training loader as
``bench run`` would (same data, transforms, sampler shard, per-process batch, pinned memory, or
``--loader gpu``'s device-side crop and flip), draws batches and moves them onto its device,
with no model. All processes draw at once, so they share the machine's cores as in training;
a figure is the rate of all of them at the slowest one's pace."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import queue
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.config.options import config_from_args, given, parse_list, run_options_for
from bench.config.run_config import RunConfig
from bench.records.describe import INPUT_BOUND_SHARE
from bench.tools import terminal
from bench.tools.errors import EXIT_FAILED, EXIT_OK, ConfigError

RANK_TIMEOUT_S = 600.0  # a process that has not answered by then is taken as failed


@dataclass(frozen=True)
class SweepShape:
    """What each process does, fixed before any starts."""

    cfg: RunConfig
    strategy: str
    device_type: str
    processes: int
    replicas: int
    micro_batch: int  # per process and draw
    train_size: int  # training images after --train-limit
    workers_per_process: list[int | None]  # None: --loader gpu (no workers)
    steps: int
    threads: int


@dataclass
class SweepResult:
    shape: SweepShape
    seconds: list[float]  # per worker count: the slowest process
    notes: list[str] = field(default_factory=list)

    def images_per_s(self) -> list[float]:
        drawn = self.shape.steps * self.shape.micro_batch * self.shape.processes
        return [drawn / s for s in self.seconds]


def default_worker_counts(cores_per_process: int) -> list[int]:
    """0, then powers of two up to the cores each process has (its workers share them)."""
    counts, w = [0], 1
    while w <= max(1, cores_per_process):
        counts.append(w)
        w *= 2
    return counts


def plan_sweep(cfg: RunConfig, worker_counts: list[int] | None, steps: int) -> SweepShape:
    """Validate the run options as ``bench run`` would, and the sweep's own; ConfigError on
    bad input, before any process starts."""
    from bench.launch.plan import RunPlan
    from bench.launch.preflight import check_processes_fit, prepare_data
    from strategies.base import cpu_threads_per_process

    if steps < 1:
        raise ConfigError(f"--steps must be at least 1 (got {steps})")
    if worker_counts is not None and any(w < 0 for w in worker_counts):
        raise ConfigError(f"--workers takes counts of 0 or more (got {worker_counts})")
    if cfg.workers is not None:
        raise ConfigError("bench loader sweeps --workers itself: give it a list, e.g. "
                          "--workers 0,2,4,8")
    plan = RunPlan(cfg, probe_output=False)
    if plan.cfg.nodes > 1 or plan.slurm is not None:
        raise ConfigError("bench loader measures this machine's processes: drop --nodes "
                          "(run it on one node; every node feeds its own ranks)")
    if cfg.loader == "gpu" and worker_counts is not None:
        raise ConfigError("--loader gpu has no loader workers: drop --workers, or measure "
                          "--loader torch")
    threads = cpu_threads_per_process(plan.local_processes)
    if cfg.loader == "gpu":
        per_process: list[int | None] = [None]
    else:
        counts = worker_counts if worker_counts is not None else default_worker_counts(threads)
        # --workers is per replica, as in bench run (DataParallel: one process, N replicas)
        per_process = [plan.loader_workers_per_process(w) for w in counts]
        check_processes_fit(plan.local_processes, max(per_process),
                            max(1, plan.replicas // plan.processes))
    _, train_size, _ = prepare_data(plan.cfg, plan.local_processes)
    per_process_batch = plan.cfg.check_batch_split(plan.processes)
    return SweepShape(cfg=plan.cfg, strategy=cfg.strategy, device_type=plan.device_type,
                      processes=plan.processes, replicas=plan.replicas,
                      micro_batch=per_process_batch // plan.cfg.grad_accum, train_size=train_size,
                      workers_per_process=per_process, steps=steps, threads=threads)


def _process_sweep(shape: SweepShape, rank: int, barrier) -> tuple[list[float], list[str]]:
    """One process's draws at every worker count: seconds per count, and its notes."""
    import torch

    import strategies
    from bench.data.datasets import dataset, image_set
    from bench.data.loaders import (
        batch_to_device,
        device_training_loader,
        draw_seconds,
        endless,
        input_memory_format,
        quiet_worker_count_warning,
        seed_augmentation,
        training_loader,
    )
    from bench.measure.across_ranks import sync_devices

    cfg = shape.cfg
    torch.set_num_threads(shape.threads)
    quiet_worker_count_warning()  # the counts above the cores are the sweep's to measure
    site = strategies.get(shape.strategy)  # its sampler; no process group is joined
    site.rank, site.world_size, site.replicas = rank, shape.processes, shape.replicas
    if shape.device_type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        site.device = torch.device("cuda", rank % torch.cuda.device_count())
    aug_seed = seed_augmentation(cfg, rank)
    memory_format = input_memory_format(cfg)
    train_set = dataset(cfg, "train", True) if cfg.loader == "torch" else None

    def move(images, labels) -> None:
        batch_to_device(images, labels, site.device, torch.float32, memory_format)

    seconds = []
    for workers in shape.workers_per_process:
        if workers is None:
            loader = device_training_loader(cfg, site, image_set(cfg, "train"),
                                            micro_batch=shape.micro_batch, augment=True,
                                            aug_seed=aug_seed)
        else:
            loader = training_loader(cfg, site, train_set, micro_batch=shape.micro_batch,
                                     workers=workers, aug_seed=aug_seed)
        barrier.wait()  # every process draws at once, as ranks do
        seconds.append(draw_seconds(endless(loader), workers=workers or 0,
                                    steps=shape.steps, move=move,
                                    sync=lambda: sync_devices(site)))
        del loader
        gc.collect()  # this count's workers leave before the next count's start
    return seconds, list(dict.fromkeys(site.notes))  # a note once, however many loaders


def _spawned(shape: SweepShape, rank: int, barrier, results, parent: int) -> None:
    from bench.tools.lifetime import die_with_parent

    die_with_parent(parent)  # nothing of the sweep outlives bench, even after kill -9
    try:
        results.put((rank, *_process_sweep(shape, rank, barrier)))
    except BaseException as exc:  # the parent reports it; the others stop at the barrier
        barrier.abort()
        results.put((rank, None, [f"{type(exc).__name__}: {exc}"]))


class _OneProcess:
    """The barrier of a single process: nothing to wait for."""

    def wait(self) -> None:
        pass


def run_sweep(shape: SweepShape) -> SweepResult:
    """Every worker count, in this process (one process) or in the run's processes at once."""
    if shape.processes == 1:
        seconds, notes = _process_sweep(shape, 0, _OneProcess())
        return SweepResult(shape, seconds, notes)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(shape.processes), ctx.Queue()
    procs = [ctx.Process(target=_spawned, args=(shape, rank, barrier, results, os.getpid()),
                         daemon=False) for rank in range(shape.processes)]
    for proc in procs:
        proc.start()
    answers: dict[int, tuple[list[float] | None, list[str]]] = {}
    try:
        answers = _collect(procs, results)
    finally:  # all answered: they are leaving; else the others are stopped now
        for proc in procs:
            proc.join(timeout=10 if len(answers) == len(procs) else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    failed = [f"process {r}: {answers[r][1][0]}" for r in sorted(answers) if answers[r][0] is None]
    if failed:
        raise RuntimeError(failed[0])
    per_count = zip(*(answers[r][0] for r in range(shape.processes)))
    return SweepResult(shape, [max(s) for s in per_count], answers[0][1])


def _collect(procs, results) -> dict[int, tuple[list[float] | None, list[str]]]:
    """Every process's answer; RuntimeError when one ended without one (killed: no
    exception to report) or none came in RANK_TIMEOUT_S."""
    answers: dict[int, tuple[list[float] | None, list[str]]] = {}
    deadline = time.monotonic() + RANK_TIMEOUT_S
    while len(answers) < len(procs):
        try:
            rank, seconds, notes = results.get(timeout=1.0)
            answers[rank] = (seconds, notes)
            continue
        except queue.Empty:
            pass
        ended = [r for r, p in enumerate(procs) if r not in answers and p.exitcode is not None]
        if ended:  # what a process put is in the pipe before it exits: take it, then judge
            with contextlib.suppress(queue.Empty):
                while True:
                    rank, seconds, notes = results.get(timeout=0.2)
                    answers[rank] = (seconds, notes)
            ended = [r for r in ended if r not in answers]
        if ended:
            code = procs[ended[0]].exitcode
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            raise RuntimeError(f"process {ended[0]} ended without a result ({how})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"a process did not answer in {RANK_TIMEOUT_S:.0f} s")
    return answers


def describe(result: SweepResult) -> dict[str, Any]:
    """The sweep as data (``--format json``)."""
    shape = result.shape
    cfg = shape.cfg
    return {
        "strategy": shape.strategy, "device": shape.device_type, "processes": shape.processes,
        "replicas": shape.replicas, "loader": cfg.loader, "data": cfg.data,
        "train_size": shape.train_size, "input_size": cfg.input_size,
        "global_batch": cfg.batch_size, "micro_batch_per_process": shape.micro_batch,
        "channels_last": cfg.channels_last, "steps": shape.steps,
        "threads_per_process": shape.threads,
        "points": [{"workers_per_replica": _per_replica(shape, w), "workers_per_process": w,
                    "seconds": s, "images_per_s": ips}
                   for w, s, ips in zip(shape.workers_per_process, result.seconds,
                                        result.images_per_s())],
        "notes": result.notes,
    }


def _per_replica(shape: SweepShape, workers: int | None) -> int | None:
    return None if workers is None else workers * shape.processes // shape.replicas


def text_view(result: SweepResult) -> list[str]:
    """What a user reads: what was drawn, then img/s per worker count (≤ 120 columns)."""
    shape, cfg = result.shape, result.shape.cfg
    per = "workers per GPU" if shape.device_type == "cuda" else "workers per replica"
    cores = f"{shape.threads} core{'s' if shape.threads > 1 else ''}"
    who = (f"1 {shape.strategy} process on {shape.device_type}, {cores}" if shape.processes == 1
           else f"{shape.processes} {shape.strategy} processes on {shape.device_type} drawing "
                f"at once, {cores} each")
    lines = [
        f"the input pipeline alone (no model): {who}",
        f"  {cfg.data}, {shape.train_size:,} training images of {cfg.input_size} px, batch "
        f"{cfg.batch_size} ({shape.micro_batch} per "
        f"process and draw), --loader {cfg.loader}"
        + (", channels_last" if cfg.channels_last else ""),
        f"  {shape.steps} draws timed per count, after every worker's first",
    ]
    rates = result.images_per_s()
    bound = f"{INPUT_BOUND_SHARE:.0%}".replace("%", " %")
    if shape.workers_per_process == [None]:
        lines.append(f"  --loader gpu: {rates[0]:,.0f} img/s")
        lines += terminal.wrap(f"A run that trains at {bound} or more of it is input-bound "
                               "(the report's flag).")
    else:
        lines.append(f"  {per:>22}  {'img/s':>9}  {'ms per draw':>11}")
        for w, s, ips in zip(shape.workers_per_process, result.seconds, rates):
            lines.append(f"  {_per_replica(shape, w):>22}  {ips:>9,.0f}  "
                         f"{1000 * s / shape.steps:>11.1f}")
        # the answer, not only the figures: the count to use, and how fast a model may
        # train before even that count sets its pace
        workers, fastest = max(zip(shape.workers_per_process, rates), key=lambda pair: pair[1])
        best = _per_replica(shape, workers)
        lines += terminal.wrap(
            f"→ fastest here: {best} {per} ({fastest:,.0f} img/s). A run that trains at "
            f"{bound} or more of its count's figure is input-bound (the report's flag): with "
            f"{best}, one faster than {INPUT_BOUND_SHARE * fastest:,.0f} img/s is; feed such a "
            "model with --loader gpu.",
            subsequent_indent="  ")
    lines += [line for note in result.notes
              for line in terminal.wrap(f"note: {note}", subsequent_indent="  ")]
    return lines


def cmd_loader(cfg: RunConfig, worker_counts: list[int] | None, steps: int, fmt: str) -> int:
    shape = plan_sweep(cfg, worker_counts, steps)
    try:
        result = run_sweep(shape)
    except RuntimeError as exc:
        print(f"bench: loader sweep failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if fmt == "json":
        print(json.dumps(describe(result), indent=2))
    else:
        print("\n".join(text_view(result)))
    return EXIT_OK


PASSES_RUN_OPTIONS = True  # any option it does not know is a `bench run` option
USES_TORCH = True


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench loader``'s options (``help``: its line in ``bench --help``)."""
    loader = sub.add_parser(
        "loader", help=help,
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


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    if not given(passed_on, "--strategy"):
        passed_on = ["--strategy", "ddp", *passed_on]
    run = run_options_for("loader", passed_on)
    counts = parse_list(args.workers, "--workers", int) if args.workers is not None else None
    return cmd_loader(config_from_args(run), counts, args.steps, args.format)
