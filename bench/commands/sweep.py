"""``bench sweep``: every strategy x world size (x repeat) with one recipe, one after another,
each in its own ``bench run`` process. Resumable: a combination that already has an ``ok``
record with the same sweep key is skipped."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bench.commands.largest_batch import LargestBatch, take_max
from bench.config.options import config_from_args, given, parse_list, run_options_for
from bench.config.run_config import RunConfig
from bench.launch.plan import RunPlan, check_data
from bench.launch.preflight import check_output_writable
from bench.launch.slurm import (
    SRUN_CPUS_LINES,
    in_batch_step,
    note_forced_sharing,
    sbatch_header,
)
from bench.records.claims import Claim
from bench.records.files import (
    records_by_tag,
    runs_dir,
    utc_now,
    write_atomic,
    write_text_atomic,
)
from bench.records.provenance import current_status
from bench.tools import terminal
from bench.tools.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ConfigError,
    Interrupted,
    catch_stop_signals,
    restore_signals,
)
from bench.tools.lifetime import start_dying_with_me

# Options that do not change what a run measures (where files are, how ranks meet, how many
# loader workers feed them), left out of the sweep key.
_NOT_IN_KEY = {"strategy", "gpus", "output", "progress", "master_port", "tag", "timeout",
               "data_dir", "download", "workers", "node_rank", "rdzv_endpoint", "rdzv_id",
               "max_restarts", "use_slurm",
               # steps taken after the timed epochs: they change no recorded figure
               "comm_probe_steps", "loader_probe_steps", "profile_steps"}


@dataclass
class Combo:
    strategy: str
    gpus: int
    repeat: int
    key: str

    @property
    def tag(self) -> str:
        return f"sweep:{self.key}:r{self.repeat}"

    def label(self) -> str:
        return f"{self.strategy} N={self.gpus} repeat {self.repeat + 1}"


def sweep_key(cfg: RunConfig) -> str:
    """Same key = same strategy, world size and recipe. An explicit ``--workers`` is part of
    it (a sweep run again with more workers, after an input-bound one, runs again); the
    default is not, so that keys made before it counted stay. An ImageFolder's folder is
    part of it: a sweep of another folder into the same output is other work, not done."""
    recipe = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_IN_KEY}
    if cfg.batch_fits_in is None:  # a batch given: keys made before the field stay
        del recipe["batch_fits_in"]
    if not cfg.cpu_syncbn:  # likewise
        del recipe["cpu_syncbn"]
    if cfg.ghost_bn is None:  # likewise
        del recipe["ghost_bn"]
    if cfg.workers is not None:
        recipe["workers"] = cfg.workers
    if cfg.data == "imagefolder":  # the folder is the data (CIFAR-100's is only where it is)
        recipe["data_dir"] = str(Path(cfg.data_dir).expanduser().resolve())
    text = json.dumps([cfg.strategy, cfg.gpus, recipe], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def plan_combos(base: RunConfig, strategies: list[str], gpus: list[int],
                repeats: int, srun_steps: bool = False, data: bool = False,
                elsewhere: bool = False, left_out: list[str] | None = None) -> list[Combo]:
    """Every combination, validated before anything runs (bad input: ConfigError);
    ``srun_steps``: as the srun steps of a job array over several nodes; ``data``: the data
    is made ready here (read once, CIFAR-100 fetched if absent) and each run's share of it
    checked, as each run would before it starts (a sweep that runs here: data missing
    would otherwise fail every run in turn, after writing its folders); ``elsewhere``: for
    a Slurm job's nodes, not this machine (its GPUs, or their absence, are not theirs).

    A combination that would run what an earlier one of its strategy runs (dp at N > 1 on
    CPU: nn.DataParallel without CUDA is one replica in one process) is left out, and
    ``left_out`` gets a line saying so: its record would be a second, mislabelled repeat of
    the other's row."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1 (got {repeats})")
    combos, plans = [], []
    shapes: dict[tuple[str, int, int], int] = {}  # (strategy, replicas, processes): first N
    for strategy in strategies:
        for n in gpus:
            cfg = base.derive(strategy=strategy, gpus=n)
            if base.batch_fits_in:  # each run's batch is found later; one that splits here
                cfg = cfg.derive(batch_size=n)
            plan = RunPlan(cfg, probe_output=False, srun_step=srun_steps, elsewhere=elsewhere)
            shape = (strategy, plan.replicas, plan.processes)
            if shapes.setdefault(shape, n) != n:
                if left_out is not None:
                    left_out.append(
                        f"{strategy} N={n} left out: on {plan.device_type} it is "
                        f"{terminal.count(plan.replicas, 'replica')} in "
                        f"{terminal.count(plan.processes, 'process', 'processes')}, the same "
                        f"run as {strategy} N={shapes[shape]}")
                continue
            plans.append(plan)
            key = sweep_key(cfg)
            combos.extend(Combo(strategy, n, r, key) for r in range(repeats))
    if data:  # after the options' checks: a misspelt name must not wait for a download
        check_data(plans)
    return combos


def _with_reason(status: str, output: str, combo: Combo) -> str:
    """``status: why``, the why from the combination's record (its run has just ended), for
    the sweep's closing list; a run that never wrote a record stays a bare status."""
    ended = [r for _, r in records_by_tag(output).get(combo.tag, [])
             if r.get("status") == status and r.get("error")]
    return f"{status}: {ended[-1]['error']}" if ended else status


def _supersede(paths: list[Path]) -> None:
    """Move a combination's earlier failed/interrupted records aside (kept, not reported)."""
    for path in paths:
        target = path.parent / "superseded" / path.name
        target.parent.mkdir(exist_ok=True)
        os.replace(path, target)


def _stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the run (it stops its ranks and closes its record), SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def say_left_out(lines: list[str], out: TextIO) -> None:
    """The combinations ``plan_combos`` left out, one wrapped line each."""
    for line in lines:
        print(terminal.fill(f"bench sweep: {line}", subsequent_indent="  "), file=out,
              flush=True)


def run_sweep(base: RunConfig, run_args: list[str], strategies: list[str], gpus: list[int],
              repeats: int = 1, force: bool = False, run_timeout: float | None = None,
              only: int | None = None, largest: LargestBatch | None = None) -> int:
    """Every combination in order (``only``: the one of that index, a Slurm array task's;
    ``largest``: each at the largest batch that fits, --batch-size max)."""
    left_out: list[str] = []
    combos = plan_combos(base, strategies, gpus, repeats,
                        srun_steps=base.nodes > 1 and in_batch_step(), data=True,
                        left_out=left_out)
    if only is None:  # an array task's log: said once, when the arrays were written
        say_left_out(left_out, sys.stdout)
    else:
        if not 0 <= only < len(combos):
            raise ConfigError(f"--only {only}: this sweep has combinations 0 to "
                              f"{len(combos) - 1}")
        combos = [combos[only]]
    if run_timeout is not None and run_timeout <= 0:
        raise ConfigError(f"--run-timeout must be positive seconds (got {run_timeout})")
    check_output_writable(base.output)  # its runs' records and the sweep's claims go there
    outcomes: list[tuple[Combo, str]] = []
    took: list[float] = []  # seconds of the runs this sweep ran (not skipped)
    previous = catch_stop_signals()
    try:
        for i, combo in enumerate(combos, start=1):
            eta = (f", about {terminal.duration(statistics.fmean(took) * (len(combos) - i + 1))} "
                   "left" if took else "")
            prefix = f"[sweep {i}/{len(combos)}{eta}] {combo.label()}"
            claim, holder = Claim.take(runs_dir(base.output) / ".claims", combo.tag)
            if claim is None:  # a concurrent sweep runs this combination: share the work
                who = f"pid {holder['pid']}" if holder else "another sweep"
                print(f"{prefix}: being run by another sweep ({who}), skipped", flush=True)
                outcomes.append((combo, "ok (run by another sweep)"))
                continue
            started = time.monotonic()
            try:
                with claim.beating():
                    status = _run_combo(combo, prefix, base, run_args, force, run_timeout,
                                        largest)
            finally:
                claim.release()
            if not status.endswith("(skipped)"):
                took.append(time.monotonic() - started)
            outcomes.append((combo, status))
    except (KeyboardInterrupt, Interrupted):
        print("bench sweep: interrupted; run it again to finish the missing combinations",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        restore_signals(previous)
    bad = [(c, s) for c, s in outcomes if not s.startswith("ok")]
    print(f"bench sweep: {len(outcomes) - len(bad)}/{len(outcomes)} ok" +
          "".join("\n" + terminal.fill(f"{c.label()}: {s}", initial_indent="  ",
                                        subsequent_indent="      ") for c, s in bad))
    # what a sweep is for comes next: its table, its failed rows with their reasons
    print(f"bench sweep: the table and its verdict: `bench report {shlex.quote(base.output)}`")
    return EXIT_OK if not bad else EXIT_FAILED


def _run_combo(combo: Combo, prefix: str, base: RunConfig, run_args: list[str], force: bool,
               run_timeout: float | None, largest: LargestBatch | None = None) -> str:
    """One combination in its own ``bench run``, unless an ok record of it exists."""
    existing = records_by_tag(base.output).get(combo.tag, [])
    done = [r for _, r in existing if current_status(r)[0] == "ok"]
    if not force and done:
        import torch

        # what the key leaves out: a sweep run again after a torch upgrade is not redone
        other = sorted({str((r.get("env") or {}).get("torch")) for r in done}
                       - {torch.__version__, "None"})
        print(terminal.fill(f"{prefix}: ok record exists, skipped" + (
            f" (it ran under torch {' and '.join(other)}, this is {torch.__version__}: "
            "--force runs it again, or --output another folder to compare the two)"
            if other else ""), subsequent_indent="    "), flush=True)
        return "ok (skipped)"
    # Failed, interrupted and stale `running` records (owner gone) move aside, kept.
    _supersede([p for p, r in existing if current_status(r)[0] != "ok" or force])
    print(prefix, flush=True)
    # Repeat r trains with seed S + r (MLPerf: runs differ by their seed), so the spread of
    # accuracy and time to target over repeats is run-to-run variation, not a copy.
    cmd = [sys.executable, "-m", "bench", "run", "--strategy", combo.strategy,
           "--gpus", str(combo.gpus), "--tag", combo.tag, *run_args,
           "--seed", str(base.seed + combo.repeat)]
    if largest is not None:
        batch, how = largest.global_batch(combo.strategy, combo.gpus, combo.key, run_args,
                                          base.output, say=lambda line: print(
                                              f"  {line}", flush=True))
        if batch is None:
            cfg = base.derive(strategy=combo.strategy, gpus=combo.gpus, tag=combo.tag,
                              seed=base.seed + combo.repeat, batch_size=combo.gpus)
            RunPlan(cfg).skeleton(cmd).fail("failed", how)
            print(f"{prefix}: failed: {how}", flush=True)
            return f"failed: {how}"
        print(terminal.fill(f"batch {batch} (global): {how}", initial_indent="  ",
                            subsequent_indent="      "), flush=True)
        cmd += ["--batch-size", str(batch), "--batch-fits-in", largest.fits_in]
    if base.nodes > 1 and in_batch_step():
        # a job array's task over several nodes: the run is one srun step, a task a rank
        cmd = ["srun", f"--nodes={base.nodes}", f"--ntasks-per-node={combo.gpus}",
               "--kill-on-bad-exit=1", *cmd]
    proc = start_dying_with_me(cmd, start_new_session=True)
    started = time.monotonic()
    try:
        rc = proc.wait(timeout=run_timeout)
        status = {0: "ok", 3: "unavailable", 130: "interrupted"}.get(rc, "failed")
        return status if status == "ok" else _with_reason(status, base.output, combo)
    except subprocess.TimeoutExpired:
        _stop(proc)
        seconds = time.monotonic() - started
        what = f"timeout after {seconds:.0f} s (--run-timeout {run_timeout:g})"
        if not _mark_timeout(base.output, combo, seconds):  # stopped before its record
            cfg = base.derive(strategy=combo.strategy, gpus=combo.gpus, tag=combo.tag,
                              seed=base.seed + combo.repeat)
            RunPlan(cfg).skeleton(cmd).fail("failed", f"{what}, before the run wrote a record")
        print(f"{prefix}: failed: {what}", flush=True)
        return f"failed: {what}"
    except BaseException:
        _stop(proc)
        raise


def _mark_timeout(output: str, combo: Combo, seconds: float) -> bool:
    """The stopped run's record becomes failed with the timeout; False if it had none."""
    marked = False
    for path, record in records_by_tag(output).get(combo.tag, []):
        if record.get("status") in ("running", "interrupted", "failed"):
            record.update(status="failed", finished_at=utc_now(),
                          error=f"timeout after {seconds:.0f} s (--run-timeout)")
            write_atomic(path, record)
            marked = True
    return marked


PASSES_RUN_OPTIONS = True  # any option it does not know is a `bench run` option
USES_TORCH = True


def array_scripts(combos: list[Combo], sweep_args: list[str], *, job_name: str, time: str,
                  partition: str | None, max_parallel: int, cpus_per_rank: int,
                  cpu: bool, workdir: str, output: str, nodes: int = 1,
                  exclusive: bool = False) -> dict[int, str]:
    """One sbatch job array per shape (N ranks a node: the cores, or GPUs, one combination
    needs on each of its ``nodes``), each over the indices of its combinations in the
    sweep's fixed order. Task i runs `bench sweep ... --only i`: the local sweep's own path
    (claims, tags, superseded records, the repeat's seed), its run launching N ranks on the
    task's node, or with several nodes one srun step of N tasks a node, a task a rank.
    ``exclusive``: each task's nodes whole (else Slurm may pack tasks, of this array or
    another job, onto one node, whose cores, GPUs and network they then share)."""
    by_shape: dict[int, list[int]] = {}
    for i, combo in enumerate(combos):
        by_shape.setdefault(combo.gpus, []).append(i)
    scripts = {}
    for n, indices in by_shape.items():
        shape = ((("nodes", 1), ("ntasks", 1), ("cpus-per-task", cpus_per_rank * n))
                 if nodes == 1 else
                 (("nodes", nodes), ("ntasks-per-node", n), ("cpus-per-task", cpus_per_rank)))
        lines = sbatch_header(
            ("job-name", f"{job_name}-n{n}"),
            ("array", f"{','.join(map(str, indices))}%{max_parallel}"), *shape,
            ("gpus-per-node", None if cpu else n), ("time", time), ("chdir", workdir),
            ("output", f"{output}/slurm/%x-%A_%a.out"), ("partition", partition),
            ("exclusive", exclusive))
        lines += [
            "",
            f"# Combination $SLURM_ARRAY_TASK_ID of this sweep's {len(combos)} (those of "
            + (terminal.count(n, "CPU process", "CPU processes") if cpu
               else terminal.count(n, "GPU")) + ("" if nodes == 1 else f" a node on {nodes} nodes")
            + "):",
            ("# the sweep's own path, resumable; its run starts its ranks on this node."
             if nodes == 1 else
             f"# the sweep's own path, resumable; its run is one srun step across the job's "
             f"{nodes} nodes."),
            "set -euo pipefail",
            *([] if nodes == 1 else SRUN_CPUS_LINES),
            " ".join([shlex.quote(sys.executable), "-m", "bench", "sweep",
                      *map(shlex.quote, sweep_args),
                      "--only", '"$SLURM_ARRAY_TASK_ID"']),
            "",
        ]
        scripts[n] = "\n".join(lines)
    return scripts


def slurm_sweep(args: argparse.Namespace, base: RunConfig, passed_on: list[str],
                names: list[str], gpus: list[int]) -> int:
    """``bench sweep --slurm``: the job arrays written (and with --submit, submitted)."""
    import shutil

    if args.max_parallel < 1 or (args.cpus_per_task is not None and args.cpus_per_task < 1):
        raise ConfigError("--max-parallel and --cpus-per-task must be at least 1")
    if not re.fullmatch(r"(\d+-)?\d{1,2}(:\d{2}){1,2}", args.time):
        raise ConfigError(f"--time must look like HH:MM:SS (got {args.time!r})")
    if args.submit and shutil.which("sbatch") is None:
        raise ConfigError("sbatch is not on PATH: run this on a Slurm login node, or use "
                          "--dry-run and copy the scripts there")
    left_out: list[str] = []
    combos = plan_combos(base, names, gpus, args.repeats, srun_steps=base.nodes > 1,
                         elsewhere=True, left_out=left_out)
    say_left_out(left_out, sys.stderr)
    output = str(Path(base.output).resolve())
    sweep_args = ["--strategies", args.strategies, "--gpus", args.gpus, "--repeats",
                  str(args.repeats), *(["--force"] if args.force else []),
                  *([f"--run-timeout={args.run_timeout:g}"] if args.run_timeout else []),
                  *passed_on]
    if not given(passed_on, "--output"):
        sweep_args += ["--output", output]
    scripts = array_scripts(combos, sweep_args, job_name=args.job_name, time=args.time,
                            partition=args.partition, max_parallel=args.max_parallel,
                            cpus_per_rank=args.cpus_per_task or (1 if base.cpu else 8),
                            cpu=base.cpu,
                            workdir=str(Path.cwd()), output=output, nodes=base.nodes,
                            exclusive=args.exclusive)
    if args.exclusive:
        note_forced_sharing("bench sweep", args.partition)
    if args.dry_run:
        for n, text in scripts.items():
            shape = (f"{terminal.count(n, 'rank')} a node on {base.nodes} nodes"
                     if base.nodes > 1 else f"world size {n}")
            print(f"# --- {shape} ---\n{text}")
        return EXIT_OK
    folder = Path(output) / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    jobs = []
    for n, text in scripts.items():
        path = folder / f"sweep-{combos[0].key}-n{n}.sbatch"
        write_text_atomic(path, text)
        print(f"wrote {path} ({sum(c.gpus == n for c in combos)} combinations)")
        if args.submit:
            done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True,
                                  text=True)
            if done.returncode:
                print(f"bench sweep: sbatch refused {path}: {done.stderr.strip()}",
                      file=sys.stderr)
                return EXIT_FAILED
            jobs.append(done.stdout.strip().split(";")[0])
    if jobs:
        print(f"submitted job array{'s' * (len(jobs) > 1)} {', '.join(jobs)}: follow with "
              f"`squeue -j {','.join(jobs)}`; the records land in {output}/runs (`bench report "
              f"--results {output}`); submit again to rerun only what did not finish ok")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench sweep``'s options (``help``: its line in ``bench --help``)."""
    sweep = sub.add_parser(
        "sweep", help=help,
        description="Any other option is a `bench run` option, used for every run.",
    )
    sweep.add_argument("--strategies", required=True, help="comma-separated strategy names")
    sweep.add_argument("--gpus", required=True, help="comma-separated world sizes, e.g. 1,2,4")
    sweep.add_argument("--repeats", type=int, default=1, help="runs per combination (default 1)")
    sweep.add_argument("--force", action="store_true", help="re-run combinations that have ok "
                       "records")
    sweep.add_argument("--run-timeout", type=float, default=None,
                       help="seconds after which one run is stopped and recorded as failed")
    slurm = sweep.add_argument_group("Slurm: the sweep as job arrays, one per world size")
    slurm.add_argument("--slurm", action="store_true",
                       help="write one sbatch job array per world size (into OUTPUT/slurm) "
                            "whose task i runs combination i; --submit submits them")
    slurm.add_argument("--submit", action="store_true", help="with --slurm: run sbatch")
    slurm.add_argument("--dry-run", action="store_true", help="with --slurm: print the scripts")
    slurm.add_argument("--partition", default=None, help="Slurm partition")
    slurm.add_argument("--time", default="01:00:00",
                       help="each task's limit, HH:MM:SS (default 01:00:00)")
    slurm.add_argument("--max-parallel", type=int, default=4,
                       help="array tasks running at once (default 4)")
    slurm.add_argument("--cpus-per-task", type=int, default=None,
                       help="cores per rank (x N for a combination of N ranks): its threads "
                            "and loader workers (default 8 per GPU, as bench slurm's, 1 per "
                            "CPU process with --cpu)")
    slurm.add_argument("--exclusive", action="store_true",
                       help="each task's nodes whole (#SBATCH --exclusive): Slurm packs "
                            "array tasks onto shared nodes otherwise, which then share cores, "
                            "GPUs and network while timed (a record flags shared cores; the "
                            "rest it cannot see)")
    slurm.add_argument("--job-name", default="bench-sweep",
                       help="Slurm job name prefix (default bench-sweep)")
    fit = sweep.add_argument_group(
        "--batch-size max: each strategy and N at the largest batch that fits (bench fit's "
        "search, kept in OUTPUT/fits/; lr 0.1 x batch / 128 unless --lr)")
    fit.add_argument("--memory-limit", type=float, default=None, metavar="GiB",
                     help="CPU: the limit every try's processes share (a cgroup; root)")
    fit.add_argument("--gpu-memory", type=float, default=None, metavar="GiB",
                     help="CUDA: the share of its GPU each rank may use")
    fit.add_argument("--fit-start", type=int, default=8,
                     help="the search's first batch per replica (default 8)")
    sweep.add_argument("--only", type=int, default=None, help=argparse.SUPPRESS)


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    for flag in ("--strategy", "--tag"):
        if given(passed_on, flag):
            raise ConfigError(f"bench sweep sets {flag} itself; use --strategies")
    batch_max, passed_on = take_max(passed_on)
    if not batch_max and (args.memory_limit is not None or args.gpu_memory is not None):
        raise ConfigError("--memory-limit and --gpu-memory go with --batch-size max")
    if batch_max and args.slurm:
        raise ConfigError("--batch-size max searches on this machine before each run; not "
                          "with --slurm (run `bench fit` on a node, then sweep with "
                          "--batch-size N)")
    run = run_options_for("sweep", ["--strategy", "ddp", *passed_on])
    base = config_from_args(run)
    largest = None
    if batch_max:
        if base.grad_accum > 1:
            raise ConfigError("--batch-size max finds the batch one step holds at once; "
                              "drop --grad-accum (or give --batch-size N with it)")
        largest = LargestBatch.plan(base, args.memory_limit, args.gpu_memory, args.fit_start)
        base = base.derive(batch_fits_in=largest.fits_in)
    if base.mllog and "{run_id}" not in base.mllog:
        raise ConfigError("in a sweep, --mllog needs {run_id} in its name (one log per run), "
                          "e.g. --mllog 'logs/{run_id}.log'")
    names = parse_list(args.strategies, "--strategies")
    gpus = parse_list(args.gpus, "--gpus", int)
    if (args.submit or args.dry_run or args.exclusive) and not args.slurm:
        raise ConfigError("--submit, --dry-run and --exclusive go with --slurm; a sweep here "
                          "runs one combination at a time")
    if args.slurm:
        return slurm_sweep(args, base, passed_on, names, gpus)
    return run_sweep(base, passed_on, names, gpus, repeats=args.repeats, force=args.force,
                     run_timeout=args.run_timeout, only=args.only, largest=largest)
