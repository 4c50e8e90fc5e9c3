"""`bench parity --self-test`: can the accuracy comparison see what it should, and only
that? On one workload (by default the calibrated parity workload, docs/parity.md), two
negative controls that do the same math (dp against ddp at N=1, ddp-spawn against ddp at
N=2) must come out "≈", and two planted accuracy costs (BatchNorm over groups of 2 images;
the learning rate not scaled with the batch, ÷8) "≠" at p < 0.05 — as `bench verify
--self-test` shows that verify catches each classic mistake. Each row is a resumable sweep
of --repeats seeds whose data orders are independent (records: data_order_rule)."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass

from bench.config.options import config_from_args, given, run_options_for
from bench.tools import terminal
from bench.tools.errors import EXIT_FAILED, EXIT_OK, ConfigError
from bench.tools.stats import mean_ci, t_quantile, welch

PASSES_RUN_OPTIONS = True  # any option it does not know is a `bench run` option
USES_TORCH = True

# The calibrated parity workload (docs/parity.md): converges to a plateau below its label
# noise's ceiling within 8 epochs, so that seeds agree to a fraction of a point, on 10,000
# test images (their own sampling error about ±0.3 points), in about 45 s a run on 2 cores.
WORKLOAD = ["--cpu", "--data", "synthetic", "--synthetic-difficulty", "0.25",
            "--train-limit", "8192", "--test-limit", "10000", "--image-size", "16",
            "--width", "0.125", "--batch-size", "128", "--lr", "0.2", "--epochs", "8",
            "--comm-probe-steps", "0", "--no-progress"]
SIGNIFICANT = 0.05
POWER = 0.80


@dataclass(frozen=True)
class Row:
    """One configuration the controls compare: a strategy at N with extra run options."""

    name: str
    strategy: str
    gpus: int
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class Control:
    name: str
    a: Row  # the reference side
    b: Row
    differs: bool  # what a working comparison must find
    why: str


def controls(lr: float) -> list[Control]:
    """The four controls for a workload of learning rate ``lr``."""
    ddp1, ddp2 = Row("ddp N=1", "ddp", 1), Row("ddp N=2", "ddp", 2)
    group = 2
    return [
        Control("same math: dp = ddp", ddp1, Row("dp N=1", "dp", 1), False,
                "one replica either way: the same steps"),
        Control("same math: ddp-spawn = ddp", ddp2, Row("ddp-spawn N=2", "ddp-spawn", 2), False,
                "another launcher, the same ranks and collectives"),
        Control("planted: BatchNorm over 2", ddp1,
                Row(f"ddp N=1 ghost BN {group}", "ddp", 1, ("--ghost-bn", str(group))), True,
                f"BatchNorm's statistics over each {group} images of the batch (ghost "
                f"BatchNorm), as per-replica BN at {group} a replica, or micro-batches of "
                f"{group}"),
        Control("planted: lr not scaled ×8", ddp1,
                Row("ddp N=1 lr ÷8", "ddp", 1, ("--lr", f"{lr / 8:g}")), True,
                "the learning rate of a batch 8 times smaller: what a run on 8 replicas "
                "gets when the rate is not scaled with the global batch"),
    ]


def _finals(output: str, key: str) -> list[float]:
    """Final top-1 (%) of the ok runs a sweep of ``key`` left in ``output``."""
    from bench.records.files import records_by_tag

    finals = []
    for tag, found in records_by_tag(output).items():
        if not tag.startswith(f"sweep:{key}:"):
            continue
        for _, rec in found:
            epochs = rec.get("per_epoch") or []
            if rec.get("status") == "ok" and epochs:
                finals.append(100 * epochs[-1]["top1"])
    return finals


def minimum_detectable(sd: float, n: int) -> float:
    """The smallest difference of two rows of ``n`` runs each with seed-to-seed standard
    deviation ``sd`` that a two-sided test at SIGNIFICANT finds with POWER (t quantiles)."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    df = 2 * n - 2
    return (t_quantile(1 - SIGNIFICANT / 2, df) + t_quantile(POWER, df)) * sd * math.sqrt(2 / n)


def run_self_test(passed_on: list[str], repeats: int) -> int:
    from bench.commands.sweep import run_sweep, sweep_key

    args = [*WORKLOAD, *passed_on] if not given(passed_on, "--data") else list(passed_on)
    if not given(args, "--output"):
        args += ["--output", "results/parity-self-test"]
    base = config_from_args(run_options_for("parity", ["--strategy", "ddp", *args]))
    checks = controls(base.peak_lr)
    rows = list({r.name: r for c in checks for r in (c.a, c.b)}.values())
    keys = {}
    for row in rows:  # every row's runs first (resumable: a sweep skips what is done)
        row_base = config_from_args(run_options_for(
            "parity", ["--strategy", row.strategy, *args, *row.extra]))
        keys[row.name] = sweep_key(row_base.derive(strategy=row.strategy, gpus=row.gpus))
        print(f"bench parity: {row.name} × {repeats}", file=sys.stderr, flush=True)
        code = run_sweep(row_base, [*args, *row.extra], [row.strategy], [row.gpus],
                         repeats=repeats)
        if code not in (EXIT_OK, EXIT_FAILED):
            return code  # interrupted
    finals = {name: _finals(base.output, key) for name, key in keys.items()}
    print(report(checks, finals))
    wrong = [c for c in checks if verdict(c, finals)[2] is not True]
    return EXIT_FAILED if wrong else EXIT_OK


def verdict(control: Control, finals: dict[str, list[float]]) -> tuple[float, float, bool | None]:
    """Δ top-1 (b - a), Welch's p and whether the control came out as it must (None: too
    few runs to test)."""
    delta, p = welch(finals[control.b.name], finals[control.a.name])
    if math.isnan(p):
        return delta, p, None
    return delta, p, (p < SIGNIFICANT) == control.differs


def report(checks: list[Control], finals: dict[str, list[float]]) -> str:
    lines = [f"{'row':<22} {'runs':>4}  {'final top-1 % (mean ± 95% CI)':<30} {'SD':>5}"]
    sds = []
    unplanted = {r.name for c in checks if not c.differs for r in (c.a, c.b)}
    for name, values in finals.items():
        mean, ci = mean_ci(values)
        sd = statistics.stdev(values) if len(values) > 1 else math.nan
        if name in unplanted:  # the workload's own seed-to-seed spread
            sds.append(sd)
        ci_text = f"{mean:.2f} ± {ci:.2f}" if math.isfinite(ci) else f"{mean:.2f}"
        lines.append(f"{name:<22} {len(values):>4}  {ci_text:<30} {sd:>5.2f}")
    lines += ["", f"{'control':<28} {'compares':<34} {'Δ top-1':>8} {'p':>8}  "
              f"{'must be':<7} result"]
    for c in checks:
        delta, p, right = verdict(c, finals)
        result = {True: "ok", False: "WRONG", None: "too few runs"}[right]
        lines.append(f"{c.name:<28} {c.b.name + ' vs ' + c.a.name:<34} {delta:>+8.2f} "
                     f"{p:>8.2g}  {'≠' if c.differs else '≈':<7} {result}")
    n = min((len(v) for name, v in finals.items() if name in unplanted), default=0)
    spread = [sd for sd in sds if math.isfinite(sd)]
    if spread:
        pooled = math.sqrt(statistics.fmean(sd * sd for sd in spread))
        lines.append("")
        lines += terminal.wrap(
            f"Seed-to-seed SD of final top-1 (the rows without a planted cost): "
            f"{min(spread):.2f} to {max(spread):.2f} points (pooled {pooled:.2f}); with {n} "
            f"runs a row, the smallest difference found with "
            f"{100 * POWER:.0f} % power at p < {SIGNIFICANT:g} is "
            f"{minimum_detectable(pooled, n):.2f} points.")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench parity``'s options (``help``: its line in ``bench --help``)."""
    parity = sub.add_parser(
        "parity", help=help,
        description="Any other option is a `bench run` option (default: the calibrated "
                    "parity workload, docs/parity.md; --output results/parity-self-test).")
    parity.add_argument("--self-test", action="store_true",
                        help="run the four controls and pass only if the negative ones come "
                             "out ≈ and the planted costs ≠ (p < 0.05)")
    parity.add_argument("--repeats", type=int, default=5, help="seeds per row (default 5)")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    if not args.self_test:
        raise ConfigError("bench parity runs its controls: add --self-test (the accuracy "
                          "table over N comes from `make parity`)")
    if args.repeats < 2:
        raise ConfigError(f"--repeats must be at least 2 to test anything (got {args.repeats})")
    for flag in ("--strategy", "--gpus", "--tag", "--grad-accum", "--ghost-bn",
                 "--warmup-epochs"):
        if given(passed_on, flag):
            raise ConfigError(f"bench parity sets {flag} itself for each control")
    return run_self_test(passed_on, args.repeats)

