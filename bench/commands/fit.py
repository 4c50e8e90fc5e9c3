"""`bench fit`: the largest per-replica batch a strategy trains a few steps and evaluates
at without running out of memory — doubling, then closing in to within 5 % (aimed at where
the peaks the tries measured reach the limit, bisection where they cannot say), each try a
fresh `bench run` (an out-of-memory must not poison the next), bounded in tries and time.
On CPU under a real limit on the try's processes (--memory-limit: a cgroup it makes as
root); on CUDA against the device, or a share of it (--gpu-memory). Prints each try and a
table with the record's memory parts at the batch found. On CPU a try's freed memory leaves
its resident set at once (CPU_TRY_ENV), so that what fits is what the strategy holds, not
what the C allocator kept."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.config.options import config_from_args, given, run_options_for
from bench.tools import terminal
from bench.tools.errors import EXIT_FAILED, EXIT_OK, ConfigError

PASSES_RUN_OPTIONS = True  # any option it does not know is a `bench run` option
USES_TORCH = True
STEPS = 3  # training steps a try takes (the first is its warm-up), then one evaluation
WITHIN = 0.05  # the search stops when the failing batch is within this of the largest ok one
MAX_AIMS = 2  # tries aimed by the tries' peaks (`aim`) before plain bisection
MAX_TRIES, MAX_MINUTES = 12, 20.0  # the search's bounds unless told otherwise
# Run options each try sets itself (a user's are refused; a sweep's are left out of a try)
TRY_SETS = ("--batch-size", "--epochs", "--train-limit", "--test-limit", "--output",
            "--strategy", "--gpus")
# torchrun's restarts: a try that ran out of memory would only run out again, the search
# waiting each time (a sweep's are left out of its tries; a user's are refused)
TRY_NEVER = ("--max-restarts",)
# A CPU try's processes give freed blocks of 1 MiB or more back to the system at once
# (glibc's mmap threshold fixed; setting it stops glibc raising it to 32 MiB as blocks are
# freed). Otherwise freed blocks stay resident, and a strategy that frees and gathers again
# what it uses looks as if it held it: FSDP2, which frees each unit's gathered parameters
# after use, peaked at 2.41 GB of RSS on ViT-B/16 (2 ranks, batch 64 a rank) against 1.38
# GB with this, where DDP went 2.23 -> 2.05 GB. The cost is speed (ResNet-18 on CPU: 53 ->
# 34 img/s), which a try does not measure.
CPU_TRY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**20)}
OOM_WORDS = ("out of memory", "outofmemory", "cannot allocate memory", "std::bad_alloc",
             "defaultcpuallocator: can't allocate memory")


@dataclass
class Try:
    batch: int  # per replica
    ok: bool
    cause: str
    seconds: float
    record: dict[str, Any] | None = field(default=None, repr=False)
    peak: int | None = None  # bytes, measured as the limit counts them (a try that fit)

    @property
    def out_of_memory(self) -> bool:
        return self.cause.startswith("out of memory")

    @property
    def failed_otherwise(self) -> bool:
        """Failed for another reason than memory: it says nothing of fit."""
        return not self.ok and not self.out_of_memory


def _record(folder: Path) -> dict[str, Any] | None:
    found = sorted((folder / "runs").glob("*.json"))
    try:
        return json.loads(found[-1].read_text()) if found else None
    except (OSError, ValueError):
        return None


def one_try(batch: int, replicas: int, args: list[str], limit: int | None,
            gpu_memory: float | None, timeout: float) -> Try:
    """Train STEPS steps and evaluate at ``batch`` per replica in a fresh process (under the
    memory limit), and say why it failed: the kernel's OOM killer, torch's out-of-memory
    error, or anything else (the record's error)."""
    from bench.tools.memory_limit import MemoryCage
    from bench.train.scratch import signal_name

    started = time.monotonic()
    global_batch = batch * replicas
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "bench", "run", *args, "--batch-size", str(global_batch),
               "--epochs", "1", "--train-limit", str(STEPS * global_batch),
               "--test-limit", str(global_batch), "--comm-probe-steps", "0",
               "--no-progress", "--output", str(out)]
        env = None
        if gpu_memory is not None:
            env = {**os.environ, "BENCH_GPU_MEMORY_GIB": f"{gpu_memory:g}"}
        elif limit is not None:
            env = {**os.environ, **CPU_TRY_ENV}
        # removed however the try ends (an interrupted search too; one killed with SIGKILL
        # leaves it to the next cage made: memory_limit.clear_abandoned)
        with MemoryCage(limit) if limit is not None else contextlib.nullcontext() as cage:
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                      env=env, preexec_fn=cage.enter if cage else None)
                rc, text = proc.returncode, proc.stdout + proc.stderr
                if rc < 0:  # bench run itself was killed: its last line says nothing of it
                    text = (f"bench run was killed by signal {-rc} ({signal_name(-rc)}) "
                            "before it closed its record")
            except subprocess.TimeoutExpired as exc:
                rc, text = -1, f"timeout after {exc.timeout:.0f} s"
            killed = cage.oom_killed() if cage else False
            peak = cage.peak() if cage else None
        rec = _record(out)
    seconds = time.monotonic() - started
    if rc == 0 and rec is not None and rec.get("status") == "ok":
        cause = "ok" + (f" (the try's processes peaked at {peak / 2**30:.2f} GiB)"
                        if peak else "")
        if gpu_memory is not None:  # the share caps what torch's allocator reserves
            peak = (rec.get("memory_parts") or {}).get("reserved")
        return Try(batch, True, cause, seconds, rec, peak or None)
    error = str((rec or {}).get("error") or (text.strip().splitlines() or ["failed"])[-1])
    if killed:
        cause = (f"out of memory: the kernel's OOM killer ended a process at the "
                 f"{limit / 2**30:g} GiB limit ({error.splitlines()[0][:120]})")
    elif any(word in (error + text).lower() for word in OOM_WORDS):
        cause = f"out of memory: {error.splitlines()[0][:160]}"
    else:
        cause = f"failed: {error.splitlines()[0][:200]}"
    return Try(batch, False, cause, seconds, rec)


def aim(lo: int, hi: int, peaks: dict[int, int], cap: int | None) -> int | None:
    """The batch to try next between ``lo`` (the largest that fit) and ``hi`` (the smallest
    that did not), or None where the tries' peaks cannot say (then bisection's midpoint).

    A try's peak grows about linearly with its batch, so the line through the peaks of the
    two largest tries that fit (``peaks``: batch -> bytes, measured as ``cap`` counts them)
    says at which batch the cap is reached. Where that is within the stopping width above
    ``lo``, the try goes the width above ``lo``, where it should not fit, and closes the
    search; else half the width below it, where it should fit, so that the next can close.
    Peaks that flatten near the cap (a cgroup reclaiming its page cache) make the line aim
    low: `search` aims MAX_AIMS times at most, then bisects."""
    width = max(1, math.floor(WITHIN * lo))
    measured = sorted(peaks.items())
    if cap is None or len(measured) < 2:
        return None
    (b1, p1), (b2, p2) = measured[-2:]
    if p2 <= p1:
        return None
    at_cap = b2 + (cap - p2) * (b2 - b1) / (p2 - p1)
    batch = lo + width if at_cap < lo + width else math.floor(at_cap - width / 2)
    return batch if lo < batch < hi else None


def search(start: int, replicas: int, args: list[str], limit: int | None,
           gpu_memory: float | None, max_tries: int, max_seconds: float,
           say=print, run_try: Callable[..., Try] = one_try,
           max_aims: int = MAX_AIMS) -> tuple[int | None, list[Try]]:
    """Doubling from ``start`` until a try runs out of memory, then closing in (``aim``,
    ``max_aims`` times at most, else bisection) until the failing batch is within WITHIN
    of the largest that trained; (that batch or None, the tries). A failure that is not out
    of memory ends the search (it says nothing of fit). ``run_try`` takes ``one_try``'s
    arguments."""
    tries: list[Try] = []
    deadline = time.monotonic() + max_seconds
    lo, hi = None, None  # largest ok, smallest out of memory (per replica)
    batch = start

    def attempt(b: int) -> Try:
        t = run_try(b, replicas, args, limit, gpu_memory,
                    timeout=max(60.0, deadline - time.monotonic()))
        tries.append(t)
        # a cause can be long ('out of memory: the kernel's OOM killer ... (rank 1 was
        # killed by signal 9 ...)'): wrapped to the terminal's 120 columns, indented
        say(terminal.fill(f"bench fit: batch {b} per replica ({b * replicas} global): "
                          f"{t.cause} [{t.seconds:.0f} s]", subsequent_indent="    "))
        return t

    def budget() -> bool:
        return len(tries) < max_tries and time.monotonic() < deadline

    while budget():  # a bracket: doubling up from an ok size, halving down from a failure
        t = attempt(batch)
        if t.ok:
            lo = batch
            if hi is not None:
                break
            batch *= 2
        elif t.out_of_memory:
            hi = batch
            if lo is not None or batch == 1:
                break
            batch = max(1, batch // 2)
        else:
            return lo, tries
    cap = limit if gpu_memory is None else int(gpu_memory * 2**30)
    aims = 0
    while budget() and lo is not None and hi is not None and (
            hi - lo > max(1, math.floor(WITHIN * lo))):
        peaks = {t.batch: t.peak for t in tries if t.ok and t.peak}
        aimed = aim(lo, hi, peaks, cap) if aims < max_aims else None
        aims += aimed is not None
        t = attempt((lo + hi) // 2 if aimed is None else aimed)
        if t.ok:
            lo = t.batch
        elif t.out_of_memory:
            hi = t.batch
        else:
            break
    return lo, tries


def smallest_out_of_memory(lo: int | None, tries: list[Try]) -> int | None:
    """The smallest batch above ``lo`` that ran out of memory, or None."""
    return min((t.batch for t in tries if t.out_of_memory and (lo is None or t.batch > lo)),
               default=None)


def unclosed(lo: int | None, tries: list[Try]) -> str | None:
    """Why ``lo`` is not yet the answer, where the search ended before it closed in: a try
    that failed for another reason, or the budget (--max-tries, --max-minutes) spent while
    every try fitted or before the bracket narrowed to WITHIN; None where it closed (or
    nothing fitted). Without it, 12 doublings from 8 that all fitted (a small model on a
    large GPU) read as "the largest batch is 16384"."""
    if lo is None:
        return None
    other = next((t for t in tries if t.failed_otherwise), None)
    hi = smallest_out_of_memory(lo, tries)
    if other is not None:
        return (f"{lo}, the largest that trained (batch {other.batch} {other.cause}; whether "
                "more fits is not known)")
    if hi is None:
        return (f"at least {lo} (every try fitted before the search's budget ran out); raise "
                f"--max-tries or --max-minutes, or --start {2 * lo}")
    if hi - lo > max(1, math.floor(WITHIN * lo)):
        return (f"{lo} to {hi - 1} ({hi} ran out of memory, and the search's budget ran out "
                f"before it closed within {100 * WITHIN:g} %); raise --max-tries or "
                "--max-minutes")
    return None


def _answer(lo: int, tries: list[Try], replicas: int = 1) -> str:
    """The table's cell: the batch, or the range the largest lies in (``replicas``: of the
    global batch)."""
    if unclosed(lo, tries) is None:
        return str(lo * replicas)
    hi = smallest_out_of_memory(lo, tries)
    other = any(t.failed_otherwise for t in tries)
    return (f"≥ {lo * replicas}" if hi is None or other
            else f"{lo * replicas}–{(hi - 1) * replicas}")


def _table(strategy: str, n: int, lo: int | None, tries: list[Try]) -> str:
    best = next((t for t in tries if t.ok and t.batch == lo), None)
    lines = [f"{'strategy':<10} {'N':>3} {'largest batch/replica':>22} {'global':>11} "
             f"{'img/s':>7} {'params':>8} {'grads':>8} {'optim.':>8} {'activ.':>8} "
             f"{'peak/rank':>10}"]
    if best is None or best.record is None:
        lines.append(f"{strategy:<10} {n:>3} {'none fits':>22}")
        return "\n".join(lines)
    rec = best.record
    mem = rec.get("memory_parts") or {}
    epochs = rec.get("per_epoch") or [{}]
    speed = epochs[-1].get("images_per_s")

    def mib(key: str) -> str:
        value = mem.get(key)
        return f"{value / 2**20:.0f} MiB" if isinstance(value, (int, float)) else "—"

    lines.append(f"{strategy:<10} {n:>3} {_answer(lo, tries):>22} "
                 f"{_answer(lo, tries, rec.get('world_size', n)):>11} "
                 f"{speed if speed is None else round(speed):>7} {mib('parameters'):>8} "
                 f"{mib('gradients'):>8} {mib('optimizer_state'):>8} "
                 f"{mib('activations_and_workspace'):>8} {mib('peak'):>10}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench fit``'s options (``help``: its line in ``bench --help``)."""
    fit = sub.add_parser(
        "fit", help=help,
        description="Any other option is a `bench run` option (model, data, precision...).")
    fit.add_argument("--strategy", required=True, help="see `bench list`")
    fit.add_argument("--gpus", type=int, default=1, help="GPUs (with --cpu, processes; default 1)")
    fit.add_argument("--memory-limit", type=float, default=None, metavar="GiB",
                     help="CPU: every process of a try together (launcher and ranks), "
                          "enforced by a memory cgroup this command makes (root)")
    fit.add_argument("--gpu-memory", type=float, default=None, metavar="GiB",
                     help="CUDA: each rank may use this much of its GPU "
                          "(torch.cuda.set_per_process_memory_fraction)")
    fit.add_argument("--start", type=int, default=8, help="first batch per replica (default 8)")
    fit.add_argument("--max-tries", type=int, default=MAX_TRIES,
                     help=f"tries at most (default {MAX_TRIES})")
    fit.add_argument("--max-minutes", type=float, default=MAX_MINUTES,
                     help=f"stop searching after this long (default {MAX_MINUTES:g})")
    fit.add_argument("--json", action="store_true", help="print the result as JSON")


def memory_cap(cfg, memory_limit: float | None, gpu_memory: float | None) -> int | None:
    """The try's memory limit in bytes (CPU, --memory-limit), or None; one line naming the
    fix where the limits asked for cannot hold here."""
    limit = None
    if memory_limit is not None:
        from bench.tools.memory_limit import unavailable

        if memory_limit <= 0:
            raise ConfigError(f"--memory-limit must be above 0 GiB (got {memory_limit:g})")
        why = unavailable()
        if why:
            raise ConfigError(f"--memory-limit cannot be enforced here: {why}; run as root "
                              "on a machine with cgroup v1's memory controller, or drop it")
        limit = int(memory_limit * 2**30)
    if gpu_memory is not None and (cfg.cpu or gpu_memory <= 0):
        raise ConfigError("--gpu-memory takes GiB above 0 and a CUDA run (not --cpu)")
    if limit is None and gpu_memory is None and cfg.cpu:
        raise ConfigError("on CPU, bench fit needs --memory-limit GiB (without a limit the "
                          "machine's swap, not the strategy, would decide)")
    return limit


def fits_in(cfg, memory_limit: float | None, gpu_memory: float | None) -> str:
    """The memory a batch was found to fit, as a workload names it ('batch: largest that
    fits 6 GiB (CPU, all processes)')."""
    if cfg.cpu:
        return f"{memory_limit:g} GiB (CPU, all processes)"
    return f"{gpu_memory:g} GiB a GPU" if gpu_memory is not None else "the GPU"


def replicas_of(strategy: str, gpus: int, cpu: bool) -> int:
    """Replicas a global batch is split over (dp on CPU is one process, one replica)."""
    return 1 if strategy == "dp" and cpu else gpus


def as_json(strategy: str, gpus: int, memory_limit: float | None, gpu_memory: float | None,
            lo: int | None, tries: list[Try]) -> dict[str, Any]:
    """The search's result as `bench fit --json` prints it (and `bench sweep --batch-size
    max` caches it)."""
    return {"strategy": strategy, "gpus": gpus, "memory_limit_gib": memory_limit,
            "gpu_memory_gib": gpu_memory, "largest_batch_per_replica": lo,
            "smallest_out_of_memory_per_replica": smallest_out_of_memory(lo, tries),
            "unclosed": unclosed(lo, tries),
            "tries": [{"batch": t.batch, "ok": t.ok, "cause": t.cause,
                       "seconds": round(t.seconds, 1),
                       "memory_parts": (t.record or {}).get("memory_parts")} for t in tries]}


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    for flag in (*TRY_SETS, *TRY_NEVER):
        if given(passed_on, flag):
            raise ConfigError(f"bench fit sets {flag} itself for each try" if flag in TRY_SETS
                              else f"bench fit takes no {flag}: a try that ran out of memory "
                              "would only run out again; drop it")
    if args.start < 1 or args.max_tries < 1 or args.max_minutes <= 0:
        raise ConfigError("--start and --max-tries must be at least 1, --max-minutes above 0")
    run_args = ["--strategy", args.strategy, "--gpus", str(args.gpus), *passed_on]
    cfg = config_from_args(run_options_for("fit", run_args))
    cfg.validate()
    limit = memory_cap(cfg, args.memory_limit, args.gpu_memory)
    replicas = replicas_of(args.strategy, args.gpus, cfg.cpu)
    # every try's own checks, once, before any starts (CIFAR-100 fetched once): a try
    # refused as bad input (no GPU here, another strategy's option, no data) would end the
    # search as "none fits", exit 1
    from bench.launch.plan import RunPlan, check_data

    first = args.start * replicas
    plan = RunPlan(cfg.derive(batch_size=first, train_limit=STEPS * first, test_limit=first),
                   probe_output=False)
    check_data([plan])
    if plan.precision_note:  # the tries' img/s are the emulation's, as a run's would be
        print(terminal.fill(f"bench fit: note: {plan.precision_note}", subsequent_indent="    "),
              file=sys.stderr)
    lo, tries = search(args.start, replicas, run_args, limit, args.gpu_memory,
                       args.max_tries, 60 * args.max_minutes,
                       say=lambda line: print(line, file=sys.stderr, flush=True))
    failed = next((t for t in tries if t.failed_otherwise), None)
    if args.json:
        print(json.dumps(as_json(args.strategy, args.gpus, args.memory_limit, args.gpu_memory,
                                 lo, tries), indent=1))
    else:
        print(_table(args.strategy, args.gpus, lo, tries))
    if failed is not None and lo is None:
        print(f"bench fit: a try failed for another reason than memory: {failed.cause}",
              file=sys.stderr)
        return EXIT_FAILED
    if lo is None and tries:
        cap = (f"--memory-limit {args.memory_limit:g} GiB" if args.memory_limit is not None
               else f"--gpu-memory {args.gpu_memory:g} GiB" if args.gpu_memory is not None
               else "the GPU's memory")
        least = min(t.batch for t in tries)
        print(terminal.fill(f"bench fit: even {least} image{'s' * (least != 1)} per "
                            f"replica ran out of memory within {cap}: give it more, or "
                            "train a smaller model or image (--width, --image-size)",
                            subsequent_indent="    "), file=sys.stderr)
    why = unclosed(lo, tries)
    if why:
        print(terminal.fill(f"bench fit: the search did not close in on the largest batch "
                            f"per replica: {why}",
                            subsequent_indent="    "), file=sys.stderr)
    return EXIT_OK if lo is not None else EXIT_FAILED
