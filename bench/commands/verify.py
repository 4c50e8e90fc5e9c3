"""``bench verify``: every available strategy trains K steps from the same weights on the
same global batches, and is compared with a plain single-process loop.

BatchNorm: the reference reproduces each strategy's grouping (bench/train/reference.py).

Precision. fp32 strategies and their reference run in float64, where rounding noise is
~1e-16 and a tolerance of 1e-8 cannot be crossed by summation order, while every defect the
self-test injects moves the numbers by 1e-4 or more. Mixed-precision strategies are compared
with a reference under the same autocast dtype and loss scaler, with a tolerance set between
the measured noise and the smallest injected defect (see ``TOLERANCE``).

``--self-test`` runs one strategy unbroken and with each defect of ``SELF_TEST_DEFECTS``
injected into its ranks, and fails unless the check passes the first and fails every other.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import torch

import strategies
from bench.config.options import config_from_args, given, parse_list, run_options_for
from bench.config.run_config import RunConfig
from bench.launch.plan import RunPlan, check_data
from bench.launch.run import execute
from bench.models.registry import DEFAULT_MODEL
from bench.tools import terminal
from bench.tools.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, ConfigError, Interrupted
from bench.tools.faults import DEFECT_ENV
from bench.train.reference import compare, layout_of, reference

VERIFY_LR = 0.001
VERIFY_WIDTH = "0.125"  # float64 makes the check as sharp at any width; narrow keeps it fast


# Relative tolerance on every step's loss and on the whole parameter vector.
@dataclass(frozen=True)
class Tolerance:
    """Largest relative difference that passes: per-step loss, and the whole parameter
    vector. Each is set from measured noise and from the smallest defect the self-test
    injects (docs/verify.md)."""

    loss: float
    params: float


TOLERANCE = {
    # float64 runs: rounding noise measured at <= 2e-16; defects move the numbers >= 1e-4.
    "fp32": Tolerance(1e-8, 1e-8),
    # autocast against an autocast reference: noise <= 1.4e-4 (loss) and 1.6e-5 (params)
    # over 20 steps; the smallest defect moved the parameters by 1.4e-4 (docs/verify.md).
    "mixed": Tolerance(5e-4, 5e-5),
    # FSDP's MixedPrecisionPolicy is not autocast (bf16 parameters in every layer but
    # BatchNorm, low-precision logits): noise 5.8e-3 (loss) and 7.6e-5 (params).
    "fsdp-mixed": Tolerance(2e-2, 2e-4),
    # --ddp-comm-hook fp16 / bf16 (float64 model): the reference casts each rank's share as
    # the ranks do, their bits at 2 ranks; at 3 or more the collective's order of addition
    # (or, under SyncBN, a reference casting the sum) rounds otherwise: measured against a
    # cast sum over 10 steps: 2.4e-7 / 7.1e-7 (fp16) and 7.8e-7 / 2.2e-6 (bf16); the smallest
    # defect moved the parameters by 1.4e-4. Rounding and defects both grow with the steps
    # (30 steps, fp16: noise 7.2e-6 / 1.3e-5, smallest defect 2.2e-4 / 2.7e-4), so this is
    # the tolerance at 10 steps, scaled by steps / 10 beyond.
    "cast-hook": Tolerance(1e-5, 2e-5),
}
# fp16 + GradScaler uses the mixed tolerance, which was set from bf16 on CPU. One H100 run
# (2026-11-23, 2 ranks sharing the GPU, 20 steps) gave 3.9e-5 (loss) and 2.8e-5 (params).
FP16_TOLERANCE_NOTE = "its tolerance was set on CPU bf16 (one H100 fp16 run: 3.9e-5 / 2.8e-5)"


@dataclass
class Outcome:
    strategy: str
    status: str  # pass | FAIL | skipped
    precision: str = ""
    norm: str = ""
    loss_diff: float = math.nan
    param_diff: float = math.nan
    tolerance: Tolerance = Tolerance(math.nan, math.nan)
    detail: str = ""

    def line(self) -> str:
        """One row of HEADER's table, wrapped to the terminal's width (at most 120)."""
        if self.status == "skipped":
            return textwrap.fill(f"{self.strategy:<11} skipped  {self.detail}",
                                 width=terminal.columns(), subsequent_indent=" " * 21)
        row = (f"{self.strategy:<11} {self.status:<7}  {self.precision:<7}  {self.norm:<14}  "
               f"{_against(self.loss_diff, self.tolerance.loss):<16}  "
               f"{_against(self.param_diff, self.tolerance.params):<17}  ")
        return textwrap.fill(row + self.detail, width=terminal.columns(),
                             subsequent_indent=" " * len(row)) if self.detail else row.rstrip()


HEADER = (f"{'strategy':<11} {'result':<7}  {'prec.':<7}  {'BatchNorm':<14}  "
          f"{'loss diff (tol.)':<16}  {'param diff (tol.)':<17}  reference")


def _against(diff: float, tolerance: float) -> str:
    """'3.9e-05 (5e-04)': the largest relative difference and its tolerance."""
    return "—" if math.isnan(diff) else f"{diff:.1e} ({tolerance:.0e})"


def cast_on_the_wire(cfg: RunConfig) -> str:
    """The DDP comm hook whose reference stands for the run's compression: its own hook, or
    for Horovod's fp16 compression the fp16 hook (both cast each rank's share to fp16 before
    the sum; verify compared it with an uncompressed reference at the fp32 tolerance and
    failed it, 7.8e-7 against 1e-8)."""
    if cfg.strategy == "horovod" and cfg.hvd_compression == "fp16":
        return "fp16"
    return cfg.ddp_comm_hook


def tolerance_of(strategy: str, precision: str, comm_hook: str = "none",
                 steps: int = 10) -> Tolerance:
    """The check's tolerance: its precision's, or a cast on the wire's (grown with the
    steps); under mixed precision and a cast, the larger of the two in each figure (the
    reference casts each rank's share as the ranks do: what is left is the mixed noise)."""
    plain = (TOLERANCE["fp32"] if precision == "fp32"  # PowerSGD too: exact (_compressed_like)
             else TOLERANCE["fsdp-mixed" if strategy == "fsdp" else "mixed"])
    if comm_hook not in ("fp16", "bf16"):
        return plain
    grow = max(1.0, steps / 10)
    cast = Tolerance(TOLERANCE["cast-hook"].loss * grow, TOLERANCE["cast-hook"].params * grow)
    if precision == "fp32":
        return cast
    return Tolerance(max(plain.loss, cast.loss), max(plain.params, cast.params))


def in_float64(plan: RunPlan) -> bool:
    """Whether the run computes in fp32, which verify checks in float64 (ddp-amp's
    precision is mixed whatever --precision says)."""
    return plan.cfg.precision == "fp32" and plan.strategy.precision_label("fp32") == "fp32"


def cast_not_checkable(plan: RunPlan) -> str | None:
    """Why a cast on the wire under mixed precision cannot be told from a defect here (None:
    it can). The reference casts each rank's gradient as the ranks do, which at 2 ranks is
    their all-reduce to the bit; at 3 or more the collective adds the casts in an order of
    its own, and under SyncBatchNorm each rank's gradient is not its own to cast: the
    rounding then differs, and autocast's forward amplifies it to the size of the smallest
    defect (bf16 at 3 ranks: 6.5e-5 of the parameters in 10 steps, 1.4e-4 in 20; the
    smallest defect moves them by 1.3e-4). In fp32 (float64) it stays far below that."""
    hook = cast_on_the_wire(plan.cfg)
    fp32 = in_float64(plan)
    if hook not in ("fp16", "bf16") or fp32:
        return None
    label = plan.strategy.precision_label(plan.cfg.precision)
    synced = plan.replicas > 1 and (plan.cfg.cpu_syncbn if plan.device_type == "cpu" else
                                    plan.cfg.syncbn and plan.strategy.syncs_batchnorm)
    if synced:
        instead = "without --cpu-syncbn" if plan.device_type == "cpu" else "with --no-syncbn"
        return (f"{hook} on the wire under {label} and SyncBatchNorm cannot be told from a "
                "defect (each rank's gradient is not its own to cast in the reference); "
                f"check it {instead}")
    if plan.replicas > 2:
        return (f"{hook} on the wire under {label} is checked at 2 ranks (beyond, the "
                "all-reduce adds the casts in an order of its own); run with --gpus 2")
    return None


@dataclass
class Checker:
    """Runs strategies K steps for real (bench run's own path) and compares each with the
    plain reference of its BatchNorm layout; references are computed once per layout."""

    base: RunConfig
    steps: int
    references: dict = field(default_factory=dict)

    def check(self, plan: RunPlan, defect: str | None = None) -> Outcome:
        name = plan.cfg.strategy
        fp32 = in_float64(plan)
        work = Path(tempfile.mkdtemp(prefix=f"bench-verify-{name}-"))
        try:
            cfg = self.base.derive(strategy=name, verify_steps=self.steps,
                                   verify_dir=str(work), output=str(work / "results"),
                                   verify_float64=fp32)
            with _defect_env(defect), contextlib.redirect_stdout(io.StringIO()):
                code = execute(cfg, ["bench", "verify", name])
            if code == EXIT_INTERRUPTED:  # the user stopped verify, not the strategy failing
                raise Interrupted(f"{name}'s run was interrupted")
            if code != 0 or not (work / "losses.json").exists():
                return Outcome(name, "FAIL", detail=f"run exited with {code}")
            meta = json.loads((work / "losses.json").read_text())
            params = torch.load(work / "params.pt")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        layout = layout_of(meta)
        hook = cast_on_the_wire(plan.cfg)
        sum_first = plan.cfg.strategy == "horovod"  # its Average: the sum, then 1/W
        key = (layout, meta["precision"], fp32, hook, sum_first and hook != "none")
        if key not in self.references:
            # apex O1 patches ops to fp16 with a dynamic loss scale: torch.amp's fp16 twin.
            mixed = "fp16" if meta["precision"].startswith("apex") else plan.cfg.precision
            cpu = plan.device_type != "cuda"
            # CPU: each rank's thread count, on which oneDNN's cut of a reduction depends
            # (under bf16 a different cut flips a rounding now and then)
            with _threads(plan.threads_per_process() if cpu else None):
                self.references[key] = reference(
                    self.base.derive(ddp_comm_hook=hook), self.steps, layout,
                    precision=mixed, float64=fp32,
                    device="cpu" if cpu else "cuda", sum_first=sum_first,
                )
        ref_losses, ref_params, ref_skipped = self.references[key]
        loss_diff, param_diff = compare(meta["losses"], params, ref_losses, ref_params)
        tol = tolerance_of(name, meta["precision"], hook, self.steps)
        ok = loss_diff <= tol.loss and param_diff <= tol.params
        detail = f"{layout.describe()}{', float64' if fp32 else ''}"
        skipped = meta.get("scaler_skipped_steps")
        if skipped is not None and ref_skipped is not None:
            # Same initial scale on both sides: a different skip is a different update.
            detail += f", {skipped} scaler skips (ref {ref_skipped})"
            ok = ok and skipped == ref_skipped
        return Outcome(name, "pass" if ok else "FAIL", meta["precision"], meta["norm"],
                       loss_diff, param_diff, tol, detail=detail)


@contextlib.contextmanager
def _threads(count: int | None):
    """torch's intra-op threads set to ``count`` (None: left alone) for the block."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _defect_env(defect: str | None):
    """Sets BENCH_INJECT_DEFECT for the ranks of one run (only --self-test does)."""
    if defect is None:
        yield
        return
    os.environ[DEFECT_ENV] = defect
    try:
        yield
    finally:
        del os.environ[DEFECT_ENV]


def _ranks(base: RunConfig) -> str:
    return (terminal.count(base.gpus, "CPU process", "CPU processes") if base.cpu
            else terminal.count(base.gpus, "GPU"))


def _verify_base(base: RunConfig, steps: int) -> RunConfig:
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1 (got {steps})")
    # TF32 off: an fp32 GPU check must compute in fp32 (float64 runs never use TF32 anyway;
    # on CPU there is no such switch, and a run refuses it).
    return base.derive(train_limit=steps * base.batch_size, epochs=1, warmup_epochs=0.0,
                       progress=False, lr=VERIFY_LR if base.lr is None else base.lr,
                       tf32=None if base.cpu else "off")


def run_verify(base: RunConfig, names: list[str], steps: int) -> int:
    base = _verify_base(base, steps)
    # Validate everything first: bad input writes nothing. A strategy that refuses what the
    # others accept (dp when ranks share a GPU, fsdp with channels_last) is skipped with its
    # reason; input every strategy refuses is bad input.
    plans: dict[str, RunPlan] = {}
    refused: dict[str, ConfigError] = {}
    for name in names:
        try:
            plans[name] = RunPlan(base.derive(strategy=name), probe_output=False)
        except ConfigError as exc:
            refused[name] = exc
    if not plans:
        raise next(iter(refused.values()))
    check_data(list(plans.values()))  # no data: bad input, before the table starts
    dropping = max(plan.random_layers for plan in plans.values())
    off = (f"dropout: off in the ranks and the reference ({terminal.count(dropping, 'layer')}; "
           "each rank would draw its own masks)\n") if dropping else ""
    print(f"bench verify: {terminal.count(steps, 'step')}, global batch {base.batch_size}, "
          f"lr {base.lr}, "
          f"{f'width {base.width}' if base.model == DEFAULT_MODEL else base.model}, "
          f"{_ranks(base)}, no augmentation\n{off}reference: one plain process with the "
          "strategy's BatchNorm grouping; fp32 strategies run in float64\n" + HEADER,
          flush=True)
    checker = Checker(base, steps)
    outcomes = [Outcome(name, "skipped", detail=f"refused: {exc}") for name, exc in refused.items()]
    for line in (o.line() for o in outcomes):
        print(line, flush=True)
    for name, plan in plans.items():
        reason = plan.strategy.requires(plan.device_type, plan.topology.backend)
        if reason:
            outcomes.append(Outcome(name, "skipped", detail=f"unavailable: {reason}"))
        elif (why := cast_not_checkable(plan)) is not None:
            outcomes.append(Outcome(name, "skipped", detail=f"not checked: {why}"))
        else:
            if sys.stdout.isatty():  # a strategy takes up to minutes: say which one runs
                print(f"{name:<11} running {steps} steps and its reference ...", end="\r",
                      flush=True)
            outcomes.append(checker.check(plan))
        print(f"{outcomes[-1].line()}\033[K" if sys.stdout.isatty() else outcomes[-1].line(),
              flush=True)
    if any(o.precision == "fp16" for o in outcomes):
        print(f"fp16: {FP16_TOLERANCE_NOTE}")
    failed = [o for o in outcomes if o.status == "FAIL"]
    print(f"bench verify: {sum(o.status == 'pass' for o in outcomes)} passed, "
          f"{len(failed)} failed, {sum(o.status == 'skipped' for o in outcomes)} skipped")
    return EXIT_FAILED if failed else EXIT_OK


SELF_TEST_DEFECTS = ("sum-gradients", "skip-allreduce", "bn-grouping", "batch-order",
                     "lr-world-size")


def defect_does_not_apply(defect: str, plan: RunPlan) -> str | None:
    """Why ``defect`` cannot be injected into the run ``plan`` (None: it can); a run "with"
    it would be the unbroken run, which the check rightly passes. skip-allreduce clears
    torch DDP's ``require_backward_grad_sync``, which other wrappers do not read;
    bn-grouping normalises each half of a replica's batch apart, which --ghost-bn groups
    that divide the half already do."""
    strategy, ghost = plan.strategy, plan.cfg.ghost_bn
    if defect == "skip-allreduce" and "ddp" not in strategy.own_options:
        return f"{strategy.name} has no torch DDP sync flag to clear"
    half = plan.per_replica_batch // plan.cfg.grad_accum // 2
    if defect == "bn-grouping" and ghost is not None and half % ghost == 0:
        return f"--ghost-bn {ghost} already normalises each half of a replica's batch apart"
    return None


def run_self_test(base: RunConfig, name: str, steps: int,
                  defects: list[str] | None = None) -> int:
    """The check against deliberately broken variants of one strategy (``defects``, default
    all of ``SELF_TEST_DEFECTS``): the unbroken one must pass and every variant must fail,
    or the check has no power."""
    defects = list(SELF_TEST_DEFECTS) if defects is None else defects
    unknown = [d for d in defects if d not in SELF_TEST_DEFECTS]
    if unknown:
        raise ConfigError(f"--defects: no defect {unknown[0]!r}; choose from "
                          f"{', '.join(SELF_TEST_DEFECTS)}")
    base = _verify_base(base, steps)
    plan = RunPlan(base.derive(strategy=name), probe_output=False)
    reason = plan.strategy.requires(plan.device_type, plan.topology.backend)
    if reason:
        raise ConfigError(f"{name} is unavailable here ({reason}); self-test another strategy "
                          "with --strategies")
    if plan.replicas < 2:
        raise ConfigError("--self-test needs at least 2 replicas (--gpus 2): most defects "
                          "are invisible to one")
    if (why := cast_not_checkable(plan)) is not None:
        raise ConfigError(f"--self-test: {why}")
    check_data([plan])
    print(f"bench verify --self-test: {name}, {terminal.count(steps, 'step')}, global batch "
          f"{base.batch_size}, lr {base.lr}, width {base.width}, {_ranks(base)}", flush=True)
    # the columns of the check's own table (HEADER): a figure beside its tolerance
    print(f"{'variant':<16}  {'loss diff (tol.)':<16}  {'param diff (tol.)':<17}  result")
    checker = Checker(base, steps)
    escaped = []
    moot = {d: why for d in defects if (why := defect_does_not_apply(d, plan))}
    defects = [d for d in defects if d not in moot]
    for defect in (None, *defects):
        outcome = checker.check(plan, defect)
        broken = defect is not None
        caught = outcome.status == "FAIL"
        if broken != caught:
            escaped.append(defect or "unbroken")
        verdict = ("caught" if caught else "ESCAPED") if broken else (
            "passes" if not caught else "FAILS (the check or the strategy is wrong)")
        tol = outcome.tolerance
        print(f"{defect or 'unbroken':<16}  {_against(outcome.loss_diff, tol.loss):<16}  "
              f"{_against(outcome.param_diff, tol.params):<17}  {verdict}"
              f"{'  ' + outcome.detail if outcome.detail.startswith('run') else ''}",
              flush=True)
    for defect, why in moot.items():
        print(f"{defect:<16}  {'—':<16}  {'—':<17}  does not apply: {why}")
    print(f"bench verify --self-test: {len(defects) + 1 - len(escaped)}/"
          f"{len(defects) + 1} as expected"
          + (f"; wrong: {', '.join(escaped)}" if escaped else "")
          + (f" ({', '.join(moot)} not injected)" if moot else ""))
    return EXIT_FAILED if escaped else EXIT_OK


def default_strategies() -> list[str]:
    return strategies.names()


PASSES_RUN_OPTIONS = True  # any option it does not know is a `bench run` option
USES_TORCH = True


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench verify``'s options (``help``: its line in ``bench --help``)."""
    verify = sub.add_parser(
        "verify", help=help,
        description="Any other option is a `bench run` option (default --data synthetic), "
                    "so a run's command line can be checked as it is; those of its length "
                    "and output (--epochs, --train-limit, --warmup-epochs, --tf32, --output, "
                    "--tag, --mllog, the probes) have no effect: it trains --steps steps "
                    "(fp32 in float64, TF32 off, without augmentation or dropout) and "
                    "writes nothing.",
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


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    # the narrow ResNet-18 by default; --width scales only that model
    defaults = [("--data", "synthetic")] + ([] if given(passed_on, "--model") else
                                            [("--width", VERIFY_WIDTH)])
    for flag, default in defaults:
        if not given(passed_on, flag):
            passed_on = [flag, default, *passed_on]
    run = run_options_for("verify", ["--strategy", "ddp", "--gpus", str(args.gpus),
                                     *passed_on])
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
