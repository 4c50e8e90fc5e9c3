"""``bench compare A B``: did B (a new driver, torch, machine) get slower or less accurate
than A? Rows are matched by workload, strategy, device, N, precision, speed options,
accumulation and epochs, on the same GPU model or, for a new machine, on the one other
model each side ran; the exit code is 1 when a row regressed beyond the threshold in speed or
significantly in accuracy, so the command can gate a CI job."""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from typing import Any

from bench.records.describe import short_options
from bench.records.files import load_source
from bench.report import GROUP_KEYS, report_order, summary_table
from bench.report.flags import ABOUT_TOP1, clock_gap_matters
from bench.report.table import apart_by
from bench.report.verdict import ONE_RUN_NOISE, accuracy_workloads, device_noise
from bench.report.views import (
    SAID_BY_WORKLOAD,
    block_heading,
    only_where_apart,
    said_once,
    strict_json,
)
from bench.tools import terminal
from bench.tools.errors import EXIT_FAILED, EXIT_OK, ConfigError
from bench.tools.stats import welch

FORMATS = ("text", "markdown", "csv", "json")
# CSV and JSON: numbers stay numbers (a range or CI in its own fields); the time to target's
# text says how it was scored ("36.15 (MLPerf, 5 runs, 1 missed)", "did not converge (...)").
COLUMNS = ["workload", "strategy", "device", "world_size", "gpus_requested", "precision",
           "options", "grad_accum", "epochs", "norm", "runs", "images_per_s_a",
           "images_per_s_b", "images_per_s_range_a", "images_per_s_range_b", "speed_ratio",
           "time_to_target_s_a", "time_to_target_s_b", "time_to_target_a", "time_to_target_b",
           "time_to_target_ratio", "top1_a", "top1_b", "top1_ci_a", "top1_ci_b", "delta_top1",
           "p_value", "torch_a", "torch_b", "top1_only", "verdict"]

# The markdown view: a person's column names, each figure with its range or CI.
MARKDOWN = {"workload": "workload", "strategy": "strategy", "device": "device",
            "world_size": "N", "gpus_requested": "N asked", "precision": "precision",
            "options": "options", "grad_accum": "accum", "epochs": "epochs", "norm": "norm",
            "runs": "runs A/B", "images_per_s_a": "img/s A [range]",
            "images_per_s_b": "img/s B [range]", "speed_ratio": "B/A speed",
            "time_to_target_a": "time to target A", "time_to_target_b": "time to target B",
            "time_to_target_ratio": "B/A time to target", "top1_a": "top-1 A (%)",
            "top1_b": "top-1 B (%)", "delta_top1": "Δ top-1", "p_value": "Welch p",
            "torch_a": "torch A", "torch_b": "torch B", "verdict": "verdict"}


def load_side(path: str) -> list[dict[str, Any]]:
    """A results folder (its runs/) or one record file."""
    return load_source(path, "compare")


def _range(values: list[float]) -> list[float] | None:
    """[lowest, highest] of the runs' figures; None under two runs."""
    values = [v for v in values if not math.isnan(v)]
    return [round(min(values), 1), round(max(values), 1)] if len(values) > 1 else None


def _or_none(value: Any, digits: int) -> float | None:
    """A finite figure, rounded; None for none, NaN or infinity (a time to target that was
    missed), which JSON cannot hold."""
    return round(float(value), digits) if isinstance(value, (int, float)) and math.isfinite(
        value) else None


def _pairs(table_a, table_b) -> list[tuple[tuple, dict | None, dict | None]]:
    """(key, A's row, B's row) for every configuration: rows of the same workload on the
    same machine (GPU model, or CPU model and cores) first; then the configurations that
    one machine of A and one of B ran and the other side did not ('resnet18 on H100 →
    H200', '... on AMD EPYC (2 cores) → Intel Xeon (2 cores)'). Where a side holds several
    machines of a workload, a machine pairs with the one it shares most configurations with
    (`make demo`'s three rows against the committed AMD EPYC's ten: its ddp N=1 was left
    out, as the Intel Xeon had run it too); a tie is not clear, and pairs nothing."""
    def key(r: dict, on: bool = True) -> tuple:
        return tuple(r["workload_alone" if k == "workload" and not on else k]
                     for k in GROUP_KEYS)

    rows_a = {key(r): r for r in table_a.to_dict("records")}
    rows_b = {key(r): r for r in table_b.to_dict("records")}
    pairs = {k: (rows_a.get(k), rows_b.get(k)) for k in set(rows_a) | set(rows_b)}
    alone_a = {(key(r, on=False), r["machine"]): k for k, r in rows_a.items() if k not in rows_b}
    alone_b = {(key(r, on=False), r["machine"]): k for k, r in rows_b.items() if k not in rows_a}
    for (work, machine_a), (_, machine_b) in _machine_pairs(alone_a, alone_b):
        for (config, machine), ka in alone_a.items():
            kb = alone_b.get((config, machine_b))
            if config[0] != work or machine != machine_a or kb is None:
                continue
            ra, rb = pairs.pop(ka)[0], pairs.pop(kb)[1]
            moved = f"{ra['workload_alone']} on {ra['machine']} → {rb['machine']}"
            pairs[(moved, *ka[1:])] = (ra, rb)
    return [(k, *pairs[k]) for k in sorted(
        pairs, key=lambda k: (report_order(dict(zip(GROUP_KEYS, k))), str(k)))]


def _machine_pairs(alone_a: dict, alone_b: dict) -> list[tuple[tuple[str, str], ...]]:
    """((workload, A's machine), (workload, B's machine)) for each machine of B whose
    configurations only A has on another machine: the machine of A that shares most of
    them, each machine paired once, a tie paired with neither."""
    shared = Counter((config[0], machine_a, machine_b)
                     for config, machine_a in alone_a for other, machine_b in alone_b
                     if config == other)
    taken: set[tuple[str, str]] = set()
    chosen = []
    for (work, ma, mb), count in sorted(shared.items(), key=lambda kv: -kv[1]):
        a, b = (work, ma), (work, mb)
        if a in taken or b in taken:
            continue
        tied = any(n == count and o[0] == work and (o[1] == ma) != (o[2] == mb)
                   and (work, o[1]) not in taken and (work, o[2]) not in taken
                   for o, n in shared.items())
        taken |= {a, b}  # a tie takes both: which pairs with which is not clear
        if not tied:
            chosen.append((a, b))
    return chosen


def compare_tables(a: list[dict[str, Any]], b: list[dict[str, Any]],
                   threshold: float) -> list[dict[str, Any]]:
    """One row per configuration in both A and B (and one per configuration in only one)."""
    out = []
    table_a, table_b = summary_table(a), summary_table(b)
    rows_a, rows_b = table_a.to_dict("records"), table_b.to_dict("records")
    both = rows_a + rows_b
    # where both sides' ranks oversubscribed the cores (`make parity`), both timed the
    # crowding: top-1 alone is compared, as the report shows top-1 alone (an accuracy
    # block); where only B's did, its slow-down is gated, flagged with why
    crowded_a, crowded_b = accuracy_workloads(rows_a), accuracy_workloads(rows_b)
    for key, ra, rb in _pairs(table_a, table_b):
        row = dict(zip(GROUP_KEYS, key))
        if ra is None or rb is None or "ok" not in (ra["status"], rb["status"]):
            row["verdict"] = "only in A" if rb is None else "only in B" if ra is None else (
                "not ok in both")
            out.append(row)
            continue
        if ra["status"] != "ok" or rb["status"] != "ok":
            row["verdict"] = f"REGRESSED: B {rb['status']}" if rb["status"] != "ok" else "fixed"
            out.append(row)
            continue
        timed = not (ra["workload"] in crowded_a and rb["workload"] in crowded_b)
        speed = rb["images_per_s"] / ra["images_per_s"] if timed else math.nan
        tta, ttb = ((ra.get("time_to_target_s", math.nan), rb.get("time_to_target_s", math.nan))
                    if timed else (math.nan, math.nan))
        tt_ratio = ttb / tta if tta and not math.isnan(tta) and not math.isnan(ttb) else math.nan
        delta, p = welch(rb["finals"], ra["finals"])
        reasons, unsure, flagged = [], [], []
        noise = one_run_noise([r for r in both if r["device"] == rb["device"]
                               and r["status"] == "ok"])
        if speed < 1 - threshold / 100:
            _gate(f"img/s -{100 * (1 - speed):.1f} %", ra["run_images_per_s"],
                  rb["run_images_per_s"], higher_is_better=True, out=(reasons, unsure),
                  ratio=1 / speed, noise=noise)
        if tt_ratio > 1 + threshold / 100:  # infinite: B did not converge where A did
            _gate(f"time to target +{100 * (tt_ratio - 1):.1f} %" if math.isfinite(tt_ratio)
                  else f"time to target: B {rb['time_to_target']}", ra["run_times_to_target"],
                  rb["run_times_to_target"], higher_is_better=False, out=(reasons, unsure),
                  ratio=tt_ratio, noise=noise)
        if delta < 0 and p < 0.05:
            reasons.append(f"top-1 {delta:+.2f} (p {p:.2g})")
        said = []  # the flags a note below explains already
        for flag, note in (("GPU clock", clock_note(ra.get("clock_share", math.nan),
                                                    rb.get("clock_share", math.nan))),
                           ("input-bound", input_note(ra, rb))):
            if note and (reasons or unsure):
                (reasons or unsure).append(note)
                said.append(flag)
        note = tuning_note(ra, rb) if timed else None
        if note and (reasons or unsure):
            (reasons or unsure).append(note)
        flags = [f for f in str(rb.get("flags") or "").split(", ")
                 if f and not any(f.startswith(s) for s in said)
                 and (timed or f in ABOUT_TOP1)]  # the others are about times
        if flags:  # B's plausibility flags, beside its verdict
            (reasons or unsure or flagged).append(f"B's row is flagged: {', '.join(flags)}")
        row.update(
            runs=f"{ra['runs']}/{rb['runs']}",
            images_per_s_a=_or_none(ra["images_per_s"] if timed else None, 1),
            images_per_s_b=_or_none(rb["images_per_s"] if timed else None, 1),
            images_per_s_range_a=_range(ra["run_images_per_s"]) if timed else None,
            images_per_s_range_b=_range(rb["run_images_per_s"]) if timed else None,
            speed_ratio=_or_none(speed, 4),
            time_to_target_s_a=_seconds(tta, ra), time_to_target_s_b=_seconds(ttb, rb),
            time_to_target_a=_scored(ra) if timed else None,
            time_to_target_b=_scored(rb) if timed else None,
            time_to_target_ratio=_or_none(tt_ratio, 4),
            top1_a=_or_none(ra["final_top1"], 4), top1_b=_or_none(rb["final_top1"], 4),
            top1_ci_a=_or_none(ra.get("final_top1_ci"), 4),
            top1_ci_b=_or_none(rb.get("final_top1_ci"), 4),
            delta_top1=_or_none(delta, 4), p_value=_or_none(p, 6),
            # (a side's torch not said: pandas' NaN, not a version)
            torch_a=_said(ra.get("torch")), torch_b=_said(rb.get("torch")),
            top1_only=not timed,
            verdict=("REGRESSED: " + ", ".join(reasons)) if reasons else (
                ("not gated: " + ", ".join(unsure)) if unsure else (
                    "ok: " + ", ".join(flagged) if flagged else "ok")),
        )
        out.append(row)
    return out


def _said(value: Any) -> str | None:
    """A text a row holds, or None where it holds none (pandas' NaN for a null)."""
    return value if isinstance(value, str) else None


def clock_note(share_a: float, share_b: float) -> str | None:
    """When B's GPUs ran at a lower clock than A's (median SM clock as a share of the
    maximum, by a gap the report flags too), say so beside its slow-down: a hotter or
    power-capped GPU, not necessarily slower software."""
    if not clock_gap_matters(share_a - share_b):  # NaN (a side without clocks): False
        return None
    return (f"B's GPUs ran at {100 * share_b:.0f} % of their maximum clock, A's at "
            f"{100 * share_a:.0f} %")


def input_note(ra, rb) -> str | None:
    """When B's row is flagged input-bound (it trained at its input pipeline's pace), say so
    beside its slow-down, with what each side's pipeline fed alone: a slower disk, CPU or
    fewer workers, not necessarily a slower strategy."""
    if "input-bound" not in rb.get("flags", ""):
        return None
    feed_a = ra.get("loader_alone", math.nan)
    return (f"B was input-bound: its loader alone fed {rb['loader_alone']:.0f} img/s"
            + (f", A's {feed_a:.0f}" if feed_a == feed_a else ""))


def tuning_note(ra, rb) -> str | None:
    """When the two sides ran under different speed-changing environment variables
    (env.tuning: OMP_WAIT_POLICY=PASSIVE, CUDA_LAUNCH_BLOCKING=1 left in one shell), name
    them beside the change in speed: the same bench and torch, another environment. Not
    where a side's records do not say (written before they kept it)."""
    if not isinstance(ra.get("tuning"), tuple) or not isinstance(rb.get("tuning"), tuple):
        return None
    a, b = set(ra["tuning"]), set(rb["tuning"])
    if a == b:
        return None
    said = [f"{side} ran under {', '.join(f'{k}={v}' for k, v in sorted(only))} and {other} "
            "did not"
            for side, other, only in (("B", "A", b - a), ("A", "B", a - b)) if only]
    return terminal.printable("; ".join(said))


def one_run_noise(rows: list[dict[str, Any]]) -> tuple[float, str]:
    """How far one run may move on its own, and where that figure comes from: ONE_RUN_NOISE
    (the committed parity rows), or the widest spread of a row with repeats (of the same
    device, in A or B) where that is wider."""
    measured = device_noise(rows)
    if measured and measured[0] > 1.01 * ONE_RUN_NOISE:
        return measured[0], "the widest spread of a repeated row here"
    return ONE_RUN_NOISE, "the committed parity rows' widest spread"


def _gate(drop: str, runs_a: list[float], runs_b: list[float], *, higher_is_better: bool,
          out: tuple[list[str], list[str]], ratio: float, noise: tuple[float, str]) -> None:
    """A worse median is a regression only beyond both sides' run-to-run range; with one
    run a side, only beyond ``noise`` (how far one run moves on its own: ``ratio`` is how
    many times worse B is). A run that missed the target counts, as an infinite time."""
    reasons, unsure = out
    a = [v for v in runs_a if isinstance(v, (int, float)) and not math.isnan(v)]
    b = [v for v in runs_b if isinstance(v, (int, float)) and not math.isnan(v)]
    if min(len(a), len(b)) < 2:
        # in the change's own terms: runs 1.35x apart in img/s are 26 % apart as a drop
        # ('img/s -27.4 %' read as within 'the 35 %' it was judged beyond)
        moved = (1 - 1 / noise[0]) if higher_is_better else noise[0] - 1
        bound, source = f"{100 * moved:.0f} % ({noise[0]:.2f}×)", noise[1]
        if not math.isfinite(ratio):  # B missed the target once: runs that missed it exist
            unsure.append(f"{drop}, one run a side: one missed target is not judged "
                          "(--repeats 3 on both sides to gate on it)")
        elif ratio > noise[0]:
            reasons.append(f"{drop}, judged on one run a side: beyond the {bound} one run "
                           f"moves by on its own ({source})")
        else:
            unsure.append(f"{drop}, one run a side: within the {bound} one run moves by on "
                          f"its own ({source}; --repeats 3 on both sides to gate on it)")
    elif (max(b) < min(a)) if higher_is_better else (min(b) > max(a)):
        reasons.append(f"{drop}, outside both sides' run-to-run range")
    else:
        unsure.append(f"{drop}, within the runs' range: noise")


def _scored(row: dict[str, Any]) -> str | None:
    """How the time to target was scored ('36.15 (MLPerf, 5 runs, 1 missed)'); None where
    no target was asked for (the table's NaN, which JSON cannot hold)."""
    return _said(row.get("time_to_target"))


def _seconds(score: float, row: dict[str, Any]) -> float | None:
    """The time to target's MLPerf score, unless it was missed or mixes targets."""
    return None if row.get("time_to_target") == "mixed targets" else _or_none(score, 2)


def _number(cell: Any, fmt: str, suffix: str = "") -> str:
    return "—" if cell is None else f"{cell:{fmt}}{suffix}"


def _target(seconds: float | None, text: str | None) -> str:
    """A time to target's seconds; 'missed' where it was asked for and not reached, 'mixed'
    where the runs had different targets."""
    if seconds is not None or text is None:
        return _number(seconds, ".2f")
    return "missed" if str(text).startswith("did not converge") else "mixed"


def _a_to_b(a: str, b: str) -> str:
    """'990→826': A's figure, then B's (ranges, CIs and how a time to target was scored are
    in --format markdown)."""
    return "—" if a == b == "—" else f"{a}→{b}"


def _with_range(value: float | None, span: list[float] | None) -> str:
    return _number(value, ".0f") + ("" if span is None else f" [{span[0]:.0f}–{span[1]:.0f}]")


def _with_ci(value: float | None, ci: float | None) -> str:
    return _number(value, ".2f") + ("" if ci is None else f" ± {ci:.2f}")


def _markdown_cells(row: dict[str, Any]) -> dict[str, Any]:
    """The markdown view's figures: img/s with its runs' range, top-1 with its CI."""
    return {**row, **{f"{name}_{side}": fmt(row.get(f"{name}_{side}"),
                                             row.get(f"{name}_{extra}_{side}"))
                      for name, extra, fmt in (("images_per_s", "range", _with_range),
                                               ("top1", "ci", _with_ci))
                      for side in "ab" if f"{name}_{side}" in row}}


def _text_row(row: dict[str, Any]) -> dict[str, str]:
    """The terminal cells of one compared row (the verdict's reasons go below it)."""
    delta, p = row.get("delta_top1"), row.get("p_value")
    # gradient accumulation is an option in its cell, as in `bench report`'s blocks
    options = [] if str(row["options"]) in ("—", "") else [str(row["options"])]
    if row.get("grad_accum", 1) != 1:
        options.append(f"accum {row['grad_accum']}")
    asked = row.get("gpus_requested")
    return {
        # 'dp (2 asked)', as the report's verdict names it: in the N cell it took the block
        # of the committed results against a demo past 120 columns
        "strategy": row["strategy"] + (f" ({asked} asked)" if asked not in (
            None, row["world_size"]) else ""),
        "N": str(row["world_size"]), "dev": str(row["device"]),
        "prec.": str(row["precision"]), "options": short_options(", ".join(options) or "—"),
        # kept where they tell apart rows that read alike otherwise (views.only_where_apart)
        "epochs": str(row.get("epochs", "—")),
        "BN": _said(row.get("norm")) or "—",  # NaN: not recorded
        "runs A/B": row.get("runs") or "—",
        "img/s A→B": _a_to_b(_number(row.get("images_per_s_a"), ".0f"),
                             _number(row.get("images_per_s_b"), ".0f")),
        "B/A": _number(row.get("speed_ratio"), ".2f", "×"),
        "target s A→B": _a_to_b(
            _target(row.get("time_to_target_s_a"), row.get("time_to_target_a")),
            _target(row.get("time_to_target_s_b"), row.get("time_to_target_b"))),
        "B/A ": _number(row.get("time_to_target_ratio"), ".2f", "×"),
        "top-1 % A→B": _a_to_b(_number(row.get("top1_a"), ".2f"),
                               _number(row.get("top1_b"), ".2f")),
        "Δ top-1 (p)": "—" if delta is None else (
            f"{delta:+.2f}" + ("" if p is None else f" (p {p:.2g})")),
        # what each side ran on (said once in the heading where every row shares it)
        # a side that did not say its torch is '?', as the report's machines say it
        "torch": "—" if not (row.get("torch_a") or row.get("torch_b")) else (
            row["torch_a"] if row.get("torch_a") == row.get("torch_b")
            else f"{row.get('torch_a') or '?'}→{row.get('torch_b') or '?'}"),
        "verdict": str(row["verdict"]),
    }


# Said once in a block's heading when every row has the same value.
_SAID_ONCE = {"dev": "", "prec.": "", "options": "options", "runs A/B": "runs A/B",
              "torch": "torch"}


def to_text(rows: list[dict[str, Any]], width: int | None = None) -> str:
    """A block per workload, at most ``width`` columns (the terminal's: ``terminal.columns``):
    a column empty in every row of a block is left out, one with a single value said in the
    heading; a verdict's reasons on the lines below its row."""
    width = width or terminal.columns()
    blocks: dict[str, list[dict[str, str]]] = {}
    differ: dict[str, list[tuple[str, ...]]] = {}  # each block's rows' apart_by (A's and B's)
    top1_only = {str(row["workload"]) for row in rows if row.get("top1_only")}
    for row, keys in zip(rows, apart_by(rows)):
        blocks.setdefault(str(row["workload"]), []).append(_text_row(row))
        differ.setdefault(str(row["workload"]), []).append(keys)
    out: list[str] = []
    alone = []  # workloads one side has and the other has not at all: a line each
    for name, cells in blocks.items():
        sides = {c["verdict"] for c in cells}
        if sides in ({"only in A"}, {"only in B"}):
            alone.append(f"{name}: {sides.pop()} ({terminal.count(len(cells), 'row')})")
            continue
        filled = [k for k in cells[0] if any(c[k] != "—" for c in cells)]
        names, rows = only_where_apart(filled, [[c[k] for k in filled] for c in cells],
                                       {"epochs": "epochs", "BN": "norm"}, differ[name])
        # a row one side lacks has none of these: it does not keep them in the table
        compared = [c["verdict"] not in ("only in A", "only in B", "not ok in both")
                    for c in cells]
        names, rows, same = said_once(names, rows, _SAID_ONCE, compared,
                                      unsaid=SAID_BY_WORKLOAD)
        if name in top1_only:  # as the report's accuracy block says it
            same.append("ranks oversubscribe the cores: speed not compared, top-1 only")
        # as the report's: what all rows share after the workload, broken between its parts
        # (a new machine's 'A → B' is long)
        out += ([""] if out else []) + block_heading(name, same, width)
        # the verdict's word in the row (its last column), its reasons below
        table = [[n.strip() for n in names]] + [[*r[:-1], r[-1].partition(": ")[0]]
                                                for r in rows]
        for i, lines in enumerate(terminal.aligned_rows(table, width)):
            out += lines
            reason = rows[i - 1][-1].partition(": ")[2] if i else ""
            if reason:
                out += terminal.wrap(reason, width, initial_indent="    ",
                                     subsequent_indent="    ")
    if alone:
        out += [""] if out else []
        out += ["Not compared (a workload only one side ran):"]
        out += [line for a in alone for line in terminal.wrap(a, width, initial_indent="  ",
                                                              subsequent_indent="    ")]
    return "\n".join(out) + "\n"


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "text":
        return to_text(rows)
    if fmt == "json":
        return strict_json(rows)
    import pandas as pd

    if fmt == "csv":
        return pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(index=False)
    frame = pd.DataFrame([_markdown_cells(r) for r in rows]).reindex(columns=list(MARKDOWN))
    cells = frame.astype(object).where(frame.notna(), "—").astype(str)
    lines = ["| " + " | ".join(MARKDOWN.values()) + " |", "|" + "---|" * len(MARKDOWN)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
              for row in cells.values.tolist()]
    return "\n".join(lines) + "\n"


def cmd_compare(a: str, b: str, threshold: float, fmt: str) -> int:
    if not 0 < threshold < math.inf:
        raise ConfigError(f"--threshold is a finite percentage above 0 (got {threshold})")
    rows = compare_tables(load_side(a), load_side(b), threshold)
    print(render(rows, fmt), end="")
    regressed = [r for r in rows if str(r.get("verdict", "")).startswith("REGRESSED")]
    matched = [r for r in rows if r.get("verdict") not in ("only in A", "only in B")]
    if not matched:  # a CI gate that compared nothing must not pass as if it had
        raise ConfigError(f"{a} and {b} have no configuration in common (their rows above): "
                          "compare runs of the same workload, strategy, N, precision, "
                          "options and epochs")
    print(f"bench compare: {terminal.count(len(matched), 'matched row')}, "
          f"{len(regressed)} regressed "
          f"(threshold {threshold:g} % in speed, p < 0.05 in top-1)", file=sys.stderr)
    return EXIT_FAILED if regressed else EXIT_OK


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench compare``'s options (``help``: its line in ``bench --help``)."""
    compare = sub.add_parser("compare", help=help)
    compare.add_argument("a", help="the baseline: results folder or record file")
    compare.add_argument("b", help="the candidate: results folder or record file")
    compare.add_argument("--threshold", type=float, default=5.0,
                         help="percent slower in img/s or time to target that counts as a "
                              "regression (default 5); top-1 regresses at p < 0.05")
    compare.add_argument("--format", choices=("text", "markdown", "csv", "json"),
                         default="text",
                         help="text (a block per workload, 120 columns; default), markdown "
                              "(every column), csv or json")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    return cmd_compare(args.a, args.b, args.threshold, args.format)
