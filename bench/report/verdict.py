"""The answer under each workload's table: which strategy is fastest at each N, by how much,
and whether that margin is beyond the run-to-run noise the records show; which rows' top-1
differs from the reference beyond chance, and which cannot be judged. Every sentence says
what it rests on (runs per row, the test, the spread), so none claims more than the data
carries."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.records.describe import short_options
from bench.report.accuracy import parse_reference
from bench.tools.stats import welch

SIGNIFICANT = 0.05  # a two-sided p below this is "beyond noise"
# What one run of a configuration can move by on its own, measured: the committed parity
# rows (results/, `make parity`: 4 configurations x 5 runs on a 2-core CPU) spread by up to
# 1.35x in img/s (fastest run over slowest). Used where a folder has no repeated row of its
# own to measure it by: for CPU rows (measured there), and by `bench compare` for any device
# (a GPU's runs vary less, so the bound errs towards silence).
ONE_RUN_NOISE = 1.35
# It says whose runs those were: a user's folder is judged by them, not by its own.
ONE_RUN_NOISE_SOURCE = ("CPU runs moved by up to 35% on their own in bench's committed repeats, "
                        "not measured here")


@dataclass(frozen=True)
class SpeedCall:
    """The fastest row at one N of a workload, against the next fastest."""

    world_size: int
    fastest: str
    runner_up: str | None
    margin: float  # fastest img/s / runner-up img/s (NaN without a runner-up)
    beyond_noise: bool | None  # None: the records cannot tell
    basis: str  # what the call rests on, in words
    tied: tuple[str, ...] = ()  # other rows within noise of the fastest
    trailing: tuple[str, ...] = ()  # rows within noise of the runner-up (fastest beyond it)
    flagged: bool = False  # the fastest row carries a plausibility flag
    runner_up_flagged: bool = False  # ... the runner-up does (the margin rests on it too)


@dataclass
class WorkloadVerdict:
    """Speed calls per N and the accuracy judgement of one workload's rows."""

    speed: list[SpeedCall] = field(default_factory=list)
    reference: str | None = None
    differs: list[tuple[str, float, float]] = field(default_factory=list)
    not_shown: list[tuple[str, float, float, float]] = field(default_factory=list)
    # not significant, yet the mean lies outside the reference's own 95 % CI: the runs
    # spread too widely for the test to say (more runs would)
    unsettled: list[tuple[str, float, float, float]] = field(default_factory=list)
    reference_ci: float = math.nan  # the reference row's 95 % CI half-width (points)
    one_run: list[str] = field(default_factory=list)
    other_schedule: list[str] = field(default_factory=list)
    own_batches: bool = False  # each row at the largest batch it fits: top-1 not compared
    # no finished reference row among two or more: (the reference asked for, a row of the
    # block that --reference could name instead)
    no_reference: tuple[str, str] | None = None
    # rows with no time to target (more than one run, or its one run, missed it): (label,
    # target %, runs that missed, runs, final top-1 %)
    missed_target: list[tuple[str, float, int, int, float]] = field(default_factory=list)
    # two or more finished configurations, yet none of them shares its N with another: no
    # speed call could be made (each row's label and N)
    no_race: list[tuple[str, int]] = field(default_factory=list)


def _label(r: dict, precisions: set[str]) -> str:
    """A row's name within its N: the strategy, and what sets it apart from the others."""
    parts = [r["strategy"]]
    if r.get("gpus_requested") not in (None, r["world_size"]):
        parts[0] += f" ({r['gpus_requested']} asked)"
    if len(precisions) > 1:
        parts.append(str(r["precision"]))
    options = short_options(str(r.get("options") or "—"))
    if options != "—":
        parts.append(options)
    if (r.get("grad_accum") or 1) > 1:
        parts.append(f"accum {r['grad_accum']}")
    return " ".join(parts)


def labeller(rows: list[dict]) -> Callable[[dict], str]:
    """Names for ``rows`` (those one sentence compares), each its own: a row's strategy,
    what sets it apart from the others (_label), and from any that would still read alike
    (the table's ``apart``: '3 epochs' beside a run of 2, 'syncbn' beside per-replica BN),
    or the verdict would say 'ddp is fastest, 1.05× ddp'."""
    precisions = {str(r["precision"]) for r in rows}
    return lambda r: " ".join(filter(None, [_label(r, precisions), r.get("apart")]))


def _rates(r: dict) -> list[float]:
    return [v for v in r.get("run_images_per_s") or [] if isinstance(v, float)
            and math.isfinite(v)]


def device_noise(rows: list[dict]) -> tuple[float, int] | None:
    """The widest run-to-run spread (fastest run's img/s over the slowest's) among the rows
    with repeats, and how many such rows: what one run of this device can move by. None
    without a repeated row. Rows of an accuracy block say nothing of it: their times are
    the crowding (8 ranks on 2 cores, and whatever ran beside them), which the block shows
    no figure of (the report's verdict and `bench compare` alike)."""
    crowded = accuracy_workloads(rows)
    spreads = [max(v) / min(v) for v in (_rates(r) for r in rows
                                         if r.get("workload") not in crowded)
               if len(v) >= 2 and min(v) > 0]
    return (max(spreads), len(spreads)) if spreads else None


def noise_of(rows: list[dict], device: str) -> tuple[float, int] | None:
    """How far one run of ``device`` moves on its own: the widest spread of its repeated
    rows here (accuracy blocks left out); on CPU without any, the measured ONE_RUN_NOISE
    (count 0); else None."""
    found = device_noise([r for r in rows if r["device"] == device and r["status"] == "ok"])
    if found is None and device == "cpu":
        return ONE_RUN_NOISE, 0
    return found


def _compare(fast: dict, slow: dict, noise: tuple[float, int] | None) -> tuple[bool | None, str]:
    """Whether ``fast`` beats ``slow`` beyond noise, and on what grounds."""
    a, b = _rates(fast), _rates(slow)
    if len(a) >= 2 and len(b) >= 2:
        _, p = welch(a, b)
        return p < SIGNIFICANT, f"{len(a)} and {len(b)} runs, Welch p {p:.2g}"
    margin = fast["images_per_s"] / slow["images_per_s"]
    runs = "1 run each" if len(a) < 2 and len(b) < 2 else "1 run on one side"
    if noise is None:
        return None, f"{runs}, and no repeated row on this device to say how much runs vary"
    spread, count = noise
    within = margin <= spread
    if count == 0:  # no repeated row here: the measured bound
        return (not within), f"{runs}; {ONE_RUN_NOISE_SOURCE}"
    return (not within), (f"{runs}; repeated rows on this device spread up to "
                          f"{100 * (spread - 1):.0f}% ({count} row{'s' * (count != 1)})")


def _finished_by_n(rows: list[dict]) -> dict[int, list[dict]]:
    """A workload's finished rows with a speed (ranks on their own GPUs) per N, fastest
    first."""
    by_n: dict[int, list[dict]] = {}
    for r in rows:
        if (r["status"] == "ok" and not r.get("gpu_shared")
                and isinstance(r.get("images_per_s"), float)
                and math.isfinite(r["images_per_s"])):
            by_n.setdefault(int(r["world_size"]), []).append(r)
    return {n: sorted(group, key=lambda r: -r["images_per_s"])
            for n, group in sorted(by_n.items())}


def speed_calls(rows: list[dict], noise: tuple[float, int] | None) -> list[SpeedCall]:
    """One call per N with two or more finished rows (the rows of one workload)."""
    calls = []
    for n, group in _finished_by_n(rows).items():
        if len(group) < 2:
            continue
        label = labeller(group)
        fast, second = group[0], group[1]
        beyond, basis = _compare(fast, second, noise)
        tied = tuple(label(r) for r in group[1:] if _compare(fast, r, noise)[0] is False)
        trailing = tuple(label(r) for r in group[2:]
                         if beyond and _compare(second, r, noise)[0] is False)
        calls.append(SpeedCall(n, label(fast), label(second),
                               fast["images_per_s"] / second["images_per_s"], beyond, basis,
                               tied, trailing, bool(fast.get("flags")),
                               bool(second.get("flags"))))
    return calls


def accuracy_verdict(rows: list[dict], verdict: WorkloadVerdict,
                     reference: str = "ddp:1") -> None:
    """Sort the finished rows by what their top-1 against the reference (``strategy:N``, as
    `bench report --reference` names it) can say."""
    finished = [r for r in rows if r["status"] == "ok"]
    verdict.reference_ci = _reference_ci(finished)
    name_of = _names_with_n(finished)
    for r in finished:
        label = name_of(r)
        if r.get("is_reference"):
            verdict.reference = label
        elif r.get("other_epochs"):
            verdict.other_schedule.append(label)
        elif not math.isfinite(r.get("delta_top1", math.nan)):
            continue
        elif not math.isfinite(r.get("p_value", math.nan)):
            verdict.one_run.append(label)
        elif r["p_value"] < SIGNIFICANT:
            verdict.differs.append((label, r["delta_top1"], r["p_value"]))
        elif _unsettled(r, verdict.reference_ci):
            verdict.unsettled.append((label, r["delta_top1"], r["p_value"],
                                      r.get("final_top1_ci", math.nan)))
        else:
            verdict.not_shown.append((label, r["delta_top1"], r["p_value"],
                                      r.get("final_top1_ci", math.nan)))
    if verdict.reference is None and len(finished) > 1:
        name, world = parse_reference(reference)
        own = sorted((r for r in finished if not r.get("gpu_shared")),
                     key=lambda r: (r["strategy"] != name, r["world_size"]))
        if own:
            verdict.no_reference = (f"{name} N={world}",
                                    f"{own[0]['strategy']}:{own[0]['world_size']}")


def missed_target(rows: list[dict]) -> list[tuple[str, float, int, int, float]]:
    """The finished rows that did not converge (more than one of their runs missed the
    target top-1, or their one run did, so MLPerf gives them no time to target), named as
    the accuracy sentences name rows. A speed call ranks them by img/s as any other: this
    says that their speed did not buy the model the others trained (PowerSGD at rank 1
    trained twice as fast as a failed model: 11.72 % where the others reached 99 %)."""
    finished = [r for r in rows if r["status"] == "ok"]
    name_of = _names_with_n(finished)
    out = []
    for r in finished:
        target = r.get("target_top1")
        if (not isinstance(target, (int, float)) or not math.isfinite(target)
                or not math.isinf(r.get("time_to_target_s", math.nan))):
            continue
        times = r.get("run_times_to_target") or []
        out.append((name_of(r), float(target), sum(math.isinf(t) for t in times), len(times),
                    r["final_top1"]))
    return out


def _names_with_n(rows: list[dict]) -> Callable[[dict], str]:
    """Names for the rows of one block's sentences about top-1 (labeller), with their N
    where the block holds more than one."""
    label_of = labeller(rows)
    several_n = len({r["world_size"] for r in rows}) > 1
    return lambda r: label_of(r) + (f" N={r['world_size']}" if several_n else "")


def _reference_ci(rows: list[dict]) -> float:
    """The 95 % CI half-width (points) of the block's reference row's mean (NaN: none)."""
    ref = next((r for r in rows if r.get("is_reference") and r["status"] == "ok"), None)
    return ref.get("final_top1_ci", math.nan) if ref is not None else math.nan


def _unsettled(r: dict, reference_ci: float) -> bool:
    """Not significant, but the row's mean lies outside the reference's 95 % CI."""
    return (math.isfinite(reference_ci) and r["p_value"] >= SIGNIFICANT
            and abs(r["delta_top1"]) > reference_ci)


def verdicts(table, reference: str = "ddp:1") -> dict[str, WorkloadVerdict]:
    """Each workload's verdict, from the summary table (``reference``: its rows' top-1 were
    compared with this row of their workload)."""
    rows = table.to_dict("records")
    noise_by_device = {device: noise_of(rows, device) for device in {r["device"] for r in rows}}
    out: dict[str, WorkloadVerdict] = {}
    for r in rows:
        out.setdefault(r["workload"], WorkloadVerdict())
    for name, verdict in out.items():
        block = [r for r in rows if r["workload"] == name]
        comparable = not speed_not_comparable(block)
        verdict.speed = (speed_calls(block, noise_by_device.get(block[0]["device"]))
                         if comparable else [])
        if comparable and not verdict.speed:
            alone = [r for group in _finished_by_n(block).values() for r in group]
            label = labeller(alone)
            verdict.no_race = ([(label(r), int(r["world_size"])) for r in alone]
                               if len(alone) > 1 else [])
        accuracy_verdict(block, verdict, reference)
        verdict.missed_target = missed_target(block)
        verdict.own_batches = any(r["own_batch"] for r in block)
    return out


def speed_not_comparable(block: list[dict]) -> bool:
    """A workload some of whose finished rows ran more CPU processes than cores (the N = 1…8
    accuracy block: 8 ranks on 2 cores): its times measure the crowding, not the strategies,
    so it is an accuracy block: no speed figure or call (top-1 does not depend on speed)."""
    return any(r["status"] == "ok" and r.get("oversubscribed") for r in block)


def accuracy_workloads(rows: list[dict]) -> set[str]:
    """The workloads of ``rows`` that are accuracy blocks (speed_not_comparable)."""
    return {name for name in {r.get("workload") for r in rows}
            if speed_not_comparable([r for r in rows if r.get("workload") == name])}


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def speed_sentence(call: SpeedCall) -> str:
    flag = " (its row is flagged: see the warnings)" if call.flagged else ""
    next_flag = ", flagged: see the warnings" if call.runner_up_flagged else ""
    head = (f"N={call.world_size}: {call.fastest} is fastest{flag}, "
            f"{call.margin:.2f}× {call.runner_up} (next{next_flag})")
    if call.beyond_noise is True:
        rest = (f" {_names([call.runner_up, *call.trailing])} are within noise of each other."
                if call.trailing else "")
        return f"{head}, beyond noise ({call.basis}).{rest}"
    if call.beyond_noise is False:
        return (f"{head}, within noise ({call.basis}): "
                f"{_names([call.fastest, *call.tied])} cannot be told apart.")
    return f"{head}; not judged against noise: {call.basis}."


def accuracy_sentences(verdict: WorkloadVerdict) -> list[str]:
    if verdict.own_batches:
        return ["Each row trains at the largest batch it fits, its learning rate scaled to "
                "that batch: top-1 is not comparable across batch sizes, and is not compared."]
    if verdict.no_reference is not None:
        asked, example = verdict.no_reference
        return [f"Top-1 is not compared: no finished {asked} row here to compare with "
                f"(`bench report --reference {example}` compares with that row instead)."]
    if verdict.reference is None:
        return []
    out = []
    if verdict.differs:
        out.append("Top-1 differs from " + verdict.reference + " beyond chance: " + _names(
            [f"{label} {delta:+.2f} points (p {p:.2g})" for label, delta, p in verdict.differs])
            + ".")
    if verdict.not_shown:
        cis = [ci for *_, ci in verdict.not_shown if math.isfinite(ci)]
        width = ""
        if cis:
            low, high = f"{min(cis):.2f}", f"{max(cis):.2f}"
            spans = (f"its 95 % CI is ±{cis[0]:.2f} points" if len(verdict.not_shown) == 1
                     else f"their 95 % CIs are each ±{low} points" if low == high
                     else f"their 95 % CIs are ±{low} to ±{high} points")
            width = f"; {spans}, so a difference smaller than that is not ruled out"
        out.append("No difference in top-1 from " + verdict.reference + " is shown for "
                   + _names([f"{label} ({delta:+.2f}, p {p:.2g})"
                             for label, delta, p, _ in verdict.not_shown]) + width + ".")
    if verdict.unsettled:
        one = len(verdict.unsettled) == 1
        out.append("Not settled: " + _names(
            [f"{label} ({delta:+.2f}, p {p:.2g}, 95 % CI ±{ci:.2f})"
             for label, delta, p, ci in verdict.unsettled])
            + (": its mean lies" if one else ": their means lie")
            + f" outside {verdict.reference}'s 95 % CI, but "
            + ("its runs spread" if one else "their runs spread")
            + " too widely for the test to tell; more runs would.")
    if verdict.one_run:
        out.append("Top-1 against " + verdict.reference + " cannot be judged with one run: "
                   + _names(verdict.one_run) + ".")
    if verdict.other_schedule:
        out.append("Not compared (another number of epochs): "
                   + _names(verdict.other_schedule) + ".")
    return out


def target_sentences(verdict: WorkloadVerdict) -> list[str]:
    """Which rows never reached the target top-1, one sentence per target."""
    by_target: dict[float, list[str]] = {}
    for label, target, missed, runs, final in verdict.missed_target:
        how = (f"its one run ended at {final:.2f}%" if runs == 1
               else f"{missed} of {runs} runs missed it; mean {final:.2f}%")
        by_target.setdefault(target, []).append(f"{label} ({how})")
    return [f"Did not reach the {target:g} % target (no time to target, whatever the "
            f"speed): {_names(labels)}." for target, labels in by_target.items()]


def verdict_sentences(verdict: WorkloadVerdict) -> list[str]:
    """The verdict in sentences: speed per N, the rows that missed the target, then
    accuracy."""
    return ([speed_sentence(c) for c in verdict.speed] + no_race_sentences(verdict)
            + target_sentences(verdict) + accuracy_sentences(verdict))


def no_race_sentences(verdict: WorkloadVerdict) -> list[str]:
    """Why a block of two or more finished rows has no speed call: each N holds one."""
    if not verdict.no_race:
        return []
    labels = {label for label, _ in verdict.no_race}
    if len(labels) == 1:  # one configuration at several N: scaling, no race
        ns = [n for _, n in verdict.no_race]
        scaled = ("its speed-up and scaling efficiency say what more ranks gain"
                  if 1 in ns else "no N=1 run here to scale it against")
        return [f"One configuration, {labels.pop()}, at {_names([f'N={n}' for n in ns])}: no "
                f"other to race at the same N; {scaled}."]
    return ["Speed is not ranked: no N here has two finished configurations to race ("
            + _names([f"{label} at N={n}" for label, n in verdict.no_race])
            + "); `bench sweep` runs several at one N."]


def add_verdict_fields(table, reference: str = "ddp:1"):
    """The verdict as fields of each row (``bench report --format json``): speed_rank (1:
    fastest at its workload and N), speed_vs_fastest (img/s over the fastest's), speed_call
    ('fastest'; 'within noise', 'slower' or 'not judged' against the fastest),
    accuracy_call ('reference', 'differs', 'not shown to differ', 'not settled', 'one run',
    'another schedule') and the workload's verdict sentences."""
    found = verdicts(table, reference)
    rows = table.to_dict("records")
    noise = {d: noise_of(rows, d) for d in {r["device"] for r in rows}}
    place: dict[int, tuple[int, float, str]] = {}
    for name in found:
        block = [(i, r) for i, r in enumerate(rows) if r["workload"] == name]
        for group in _finished_by_n([r for _, r in block]).values():
            fast = group[0]
            for rank, r in enumerate(group, 1):
                i = next(i for i, q in block if q is r)
                if rank == 1:
                    call = "fastest" if len(group) > 1 else None
                else:
                    beyond = _compare(fast, r, noise[r["device"]])[0]
                    call = {True: "slower", False: "within noise", None: "not judged"}[beyond]
                place[i] = (rank, r["images_per_s"] / fast["images_per_s"], call)
    table["speed_rank"] = [place[i][0] if i in place else None for i in range(len(rows))]
    table["speed_vs_fastest"] = [place[i][1] if i in place else None for i in range(len(rows))]
    table["speed_call"] = [place[i][2] if i in place else None for i in range(len(rows))]
    table["accuracy_call"] = [_accuracy_call(r, found[r["workload"]].reference_ci)
                              for r in rows]
    table["verdict"] = [verdict_sentences(found[r["workload"]]) for r in rows]
    return table


def _accuracy_call(r: dict, reference_ci: float) -> str | None:
    if r["status"] != "ok":
        return None
    if r.get("is_reference"):
        return "reference"
    if r.get("other_epochs"):
        return "another schedule"
    if not math.isfinite(r.get("delta_top1", math.nan)):
        return None
    if not math.isfinite(r.get("p_value", math.nan)):
        return "one run"
    if r["p_value"] < SIGNIFICANT:
        return "differs"
    return "not settled" if _unsettled(r, reference_ci) else "not shown to differ"
