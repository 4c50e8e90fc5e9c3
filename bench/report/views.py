"""How the summary table is shown: the terminal view (key columns, a block per workload,
120 columns), the wide view, Markdown, CSV, strict JSON, and the plausibility warnings."""

from __future__ import annotations

import json
import math
from typing import Any

from bench.records.describe import short_options
from bench.records.environment import emulated_bf16_note
from bench.report.flags import ABOUT_TOP1, clock_gap_matters, flagged_exposed
from bench.report.table import COLUMN_INDEX, COLUMNS
from bench.report.verdict import accuracy_workloads, speed_not_comparable
from bench.tools import terminal
from bench.tools.errors import without_source_location

# The terminal view: what answers "which is fastest, and does it cost accuracy", one block
# per workload, in at most 120 columns; `--format wide`, the CSV and the markdown have all.
TERMINAL_COLUMNS = [
    ("strategy", "strategy"), ("device", "dev"), ("world_size", "N"), ("global_batch", "batch"),
    ("precision", "prec."), ("options", "options"), ("epochs", "epochs"), ("norm", "BN"),
    ("runs", "runs"),
    ("epoch_time_s", "epoch s"), ("images_per_s", "img/s"), ("speedup", "speed-up"),
    ("efficiency", "eff."), ("final_top1", "top-1 %"), ("delta_top1", "Δ top-1 (p)"),
    ("same_start", "start"), ("mem_rank", "mem/rank"), ("clock_share", "clock"),
    ("gpu_util", "util"),
    ("images_per_joule", "img/J"),
    ("status", "status"),
]


# Columns said once in a block's heading when every row has the same value: name -> label.
_SAID_ONCE = {"dev": "", "N": "N =", "runs": "runs", "speed-up": "speed-up", "eff.": "eff.",
              "start": "same start", "options": "options", "clock": "GPU clock",
              "util": "GPU util", "img/J": "img/J"}


# A block's workload names its machine ('... on H200', '... on AMD EPYC (2 cores)'): the
# device goes without saying.
SAID_BY_WORKLOAD = frozenset({"cuda", "cpu"})


def _parity_cell(r: dict) -> str:
    if r.get("is_reference"):
        return "ref"
    if r.get("other_epochs"):
        # another schedule: not compared
        return f"— ({terminal.count(int(r['other_epochs']), 'epoch')})"
    delta, p = r.get("delta_top1", math.nan), r.get("p_value", math.nan)
    if delta is None or math.isnan(delta):
        return "—"
    if math.isnan(p):
        return f"{delta:+.2f} (p —)"
    return f"{delta:+.2f} (p {p:.2g}){' ≠' if p < 0.05 else ''}"


def _fmt(value: Any, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if column in ("epoch_time_s", "epoch_time_spread_s"):
        return f"{value:.2f}"
    if column in ("images_per_s", "loader_alone", "peak_mem_mib", "gpu_util"):
        return f"{value:.0f}"
    if column == "mem_rank":
        return f"{value:.0f} MiB"
    if column == "images_per_joule":
        return f"{value:.1f}"
    if column in ("speedup",):
        return f"{value:.2f}×"
    if column in ("efficiency", "clock_share"):
        return f"{100 * value:.0f} %"
    if column in ("exposed_comm", "mfu", "input_wait"):
        return f"{100 * value:.1f}"
    if column in ("final_top1", "best_top1"):
        return f"{value:.2f}"
    return str(value) or "—"


def row_cells(table) -> list[list[str]]:
    rows = []
    for r in table.to_dict("records"):
        cells = [_fmt(r.get(c), c) for c, _ in COLUMNS]
        ci = r.get("final_top1_ci", math.nan)
        if ci is not None and not math.isnan(ci):
            cells[COLUMN_INDEX["final_top1"]] += f" ± {ci:.2f}"
        cells[COLUMN_INDEX["delta_top1"]] = _parity_cell(r)
        if r.get("gpus_requested") not in (None, r.get("world_size")):
            cells[COLUMN_INDEX["world_size"]] += f" (of {r['gpus_requested']} asked)"
        if r.get("status") == "ok" and math.isnan(r.get("epoch_time_s", math.nan)):
            cells[COLUMN_INDEX["epoch_time_s"]] = "— (1 epoch: warm-up only)"
        if r.get("gpu_shared"):
            cells[COLUMN_INDEX["epoch_time_s"]] += " (ranks shared GPUs: not comparable)"
        if r.get("status") == "ok" and r.get("failed_runs"):
            cells[COLUMN_INDEX["runs"]] += f" (+{r['failed_runs']} not ok)"
        if r.get("status") != "ok" and isinstance(r.get("error"), str) and r["error"]:
            # the fix is in the record and CSV; gloo's C++ file and line, in a record written
            # before ranks left them out, push the message itself past the cut
            reason = without_source_location(r["error"]).split("; build")[0]
            reason = reason if len(reason) <= 110 else reason[:107] + "..."
            cells[-1] = f"{r['status']}: {reason}"
        rows.append(cells)
    return rows


def verdict_lines(table) -> dict[str, list[str]]:
    """Each workload's verdict sentences (bench.report.verdict), in the table's order."""
    if "verdict" not in table:
        return {}
    out: dict[str, list[str]] = {}
    for r in table.to_dict("records"):
        out.setdefault(r["workload"], list(r["verdict"] or []))
    return out


def to_markdown(table) -> str:
    """Every column, one table; each workload's verdict below it."""
    header = [h for _, h in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
              for row in row_cells(table)]
    verdict = [f"- **{name}**: " + " ".join(sentences)
               for name, sentences in verdict_lines(table).items() if sentences]
    if verdict:
        lines += ["", "**Verdict**", "", *verdict]
    return "\n".join(lines) + "\n"


def plausibility_warnings(table) -> list[str]:
    """Figures that cannot be right as measured (the rows' flags), each with its likely
    cause. Of an accuracy block's rows (its ranks oversubscribe the cores) only a run that
    trained on other batches, started from other weights or ran under two torches
    (ABOUT_TOP1): every other flag is about a time, and such a block's times measure the
    crowding, are judged nowhere and shown only in the CSV and summary.md (its heading says
    so); ten lines about them under the committed results read as doubts about top-1s they
    do not concern."""
    lines = []
    accuracy_blocks = accuracy_workloads(table.to_dict("records"))
    elsewhere: dict[tuple[str, str, str], dict[str, None]] = {}  # its figures, in order
    for r in table.itertuples():
        row = f"{r.strategy} N={r.world_size} ({r.workload})"
        for run_id, epoch, seed in r.other_batches:  # ABOUT_TOP1: said in any block
            lines.append(f"{row}: run {run_id} trained on other batches than this workload's "
                         f"other runs of seed {seed} (its order of epoch {epoch} differs: "
                         "data_order_sha1): not the same work as the rows it is compared with; "
                         "its command or its bench differ (the page's command lines show "
                         "which): rerun it as the others ran")
        for run_id, seed in r.other_start:
            lines.append(f"{row}: run {run_id} started from other weights than this workload's "
                         f"other runs of seed {seed} (initial_param_fingerprint differs): not "
                         "the same start as the rows it is compared with (another bench or "
                         "torch drawing the seed's weights otherwise?): rerun it as the others ran")
        if r.torches:
            lines.append(f"{row}: its runs ran under torch " + " and ".join(
                f"{version} ({terminal.count(n, 'run')})" for version, n in r.torches)
                + ": the row averages them as repeats of one configuration; compare two "
                "torches with `bench compare A B`, each version's records in a folder of "
                "its own")
        if r.workload in accuracy_blocks:
            continue
        for figure, kind, which in r.probes_elsewhere or ():  # said once a workload, below
            elsewhere.setdefault((r.workload, kind, which), {})[figure] = None
        if "efficiency > 100 %" in r.flags and r.device == "cpu" and r.base_threads > r.threads:
            why = (" under OMP_WAIT_POLICY=passive (threads that sleep between operations: "
                   "unset it)" if str(dict(r.base_tuning or ()).get("OMP_WAIT_POLICY")).lower()
                   == "passive" else
                   " (a small model's threads can cost more than they share)")
            lines.append(f"{row}: scaling efficiency {100 * r.efficiency:.0f} % is above 100 %: "
                         f"its N=1 run trained in one process on {r.base_threads:.0f} threads, "
                         f"each of its {r.world_size} ranks on {r.threads:.0f} of the same "
                         f"cores, so the N=1 run's threads trained slower than "
                         f"{r.threads:.0f} would{why}, or it was slowed (a loaded machine?); "
                         "rerun both")
        elif "efficiency > 100 %" in r.flags:
            lines.append(f"{row}: scaling efficiency {100 * r.efficiency:.0f} % is above 100 %, "
                         "which no data-parallel run reaches: the N=1 run was slowed (a loaded "
                         "machine?); rerun both")
        if "exposed comm < 0" in r.flags and "input-bound" in r.flags:
            lines.append(f"{row}: exposed communication {flagged_exposed(r.exposed_comm)}: its "
                         "compute-only steps waited for the input pipeline like its real ones "
                         "(the row is input-bound), so their difference says nothing about "
                         "communication")
        elif "exposed comm < 0" in r.flags:
            lines.append(f"{row}: exposed communication {flagged_exposed(r.exposed_comm)}: its "
                         "compute-only steps ran slower than its real ones, which communicate "
                         "more; they were slowed (a loaded machine?): rerun it")
        if "input-bound" in r.flags:
            waited = (f" (its loop waited for batches {100 * r.input_wait:.0f} % of each epoch)"
                      if r.input_wait == r.input_wait else "")
            lines.append(f"{row}: trained at {r.images_per_s:.0f} img/s, "
                         f"{100 * r.images_per_s / r.loader_alone:.0f} % of the "
                         f"{r.loader_alone:.0f} img/s its input pipeline feeds with no model"
                         f"{waited}: the loader set its pace, not the strategy; feed it faster "
                         "(more --workers: `bench loader --workers 2,4,8` measures which count "
                         "does; or --loader gpu) before comparing strategies on it")
        if clock_gap_matters(r.clock_gap):
            lines.append(f"{row}: its GPUs ran at {100 * r.clock_share:.0f} % of their maximum "
                         f"SM clock, {100 * r.clock_gap:.0f} points below the best row of its "
                         "workload: its times were measured on a slower GPU (power cap, heat, "
                         "another job?); rerun it when the GPU is cool and idle")
        if r.power_limit:
            lines.append(f"{row}: a GPU ran under a power limit of {r.power_limit[0]:.0f} W, below "
                         f"its default {r.power_limit[1]:.0f} W (nvidia-smi -pl): it clocks "
                         "lower under load than the same GPU at its default")
        if r.abnormal_slowdowns:
            lines.append(f"{row}: the GPU lowered its clocks for {', '.join(r.abnormal_slowdowns)}"
                         " during timed epochs: its times depend on cooling, not on the strategy")
        if isinstance(r.bf16_emulated, str):
            lines.append(f"{row}: {emulated_bf16_note(r.bf16_emulated, here=False)}; time "
                         "bf16 on a CPU with AVX512-BF16 or AMX")
        if r.gpu_shared:
            lines.append(f"{row}: ranks shared GPUs (--backend gloo): its times are not "
                         "comparable with any other row")
        if r.shared_cores:
            lines.append(f"{row}: {r.shared_cores.said()} (its busiest run, means over the "
                         "timed epochs: cpu_load in its record): its times are slower than "
                         "this machine alone gives; rerun it on a quiet machine")
        for run_id, restarts, lost, cause in r.restarted:
            cost = (f"the {lost:.0f} s from its launch to that attempt's start" if lost == lost
                    else "what the attempts before took")
            why = f" ({terminal.printable(cause)})" if isinstance(cause, str) else ""
            lines.append(f"{row}: run {run_id} failed{why} and torchrun started its ranks "
                         f"again ({terminal.count(restarts, 'restart')}, --max-restarts): its "
                         f"figures are its last attempt's, and its time to target leaves out "
                         f"{cost}; a strategy that needs restarts is slower than its row says")
        for run_id, seconds, median in r.slow_runs:
            lines.append(f"{row}: run {run_id} took {seconds / median:.1f}× the row's median "
                         f"epoch time ({seconds:.2f} s vs {median:.2f} s; a loaded machine, a "
                         "throttled GPU?); the row's medians hold, its mean top-1 and spread "
                         "include it: rerun it, or move its record aside")
    for (name, kind, which), figures in elsewhere.items():
        lines.append(f"{name}: the `bench probe` of {kind} ({which}) gave its rows' "
                     f"{' and '.join(figures)}, no probe of its own being here: gloo over one "
                     "machine's loopback measures that machine's memory, and one link says "
                     "nothing of another; `bench probe` on its machine (with its runs' --tag, "
                     "if any) measures its own")
    return lines


def to_wide_text(table) -> str:
    """Every column, one line per row (wide: for a wide terminal or a pager)."""
    header = [h for _, h in COLUMNS]
    rows = row_cells(table)
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines) + "\n"


def said_once(names: list[str], rows: list[list[str]], labels: dict[str, str],
              counted: list[bool] | None = None, unsaid: frozenset = frozenset()
              ) -> tuple[list[str], list[list[str]], list[str]]:
    """A column of ``labels`` with one value in every row of a block leaves the table for
    the block's heading ('label value'; a column of '—' just leaves, and so does a value in
    ``unsaid``): the names and rows left, and the heading's parts. ``counted``: the rows
    whose values count (the others must be '—' or that value: a run that did not finish
    has no figures to differ)."""
    counted = counted if counted is not None and any(counted) else [True] * len(rows)
    same = []
    for name, label in labels.items():
        if name not in names:
            continue
        i = names.index(name)
        values = {row[i] for row, c in zip(rows, counted) if c}
        if len(values) == 1 and all(row[i] in values or row[i] == "—" for row in rows):
            value = values.pop()
            if value not in ("—", "") and f"{label} {value}".strip() not in unsaid:
                same.append(f"{label} {value}".strip())
            names = names[:i] + names[i + 1:]
            rows = [row[:i] + row[i + 1:] for row in rows]
    return names, rows, same


def block_heading(block: str, same: list[str], width: int) -> list[str]:
    """A block's heading, its workload and what all its rows share, broken between the
    shared items (never inside 'GPU clock 100%') where it passes ``width``; a workload too
    long for its dash ('… on AMD EPYC family 25 model 1 (2 cores) → AMD EPYC family 25 model
    17 (2 cores)', in `bench compare`) has the shared items on the lines below, and one
    longer than a line goes on as many as it needs."""
    parts = [part + ("," if i < len(same) - 1 else "") for i, part in enumerate(same)]
    *first, last = terminal.wrap(block, width, subsequent_indent="  ")  # longer than a line
    if same and len(last) + 2 > width:
        return [*first, last, *terminal.pack("  —", parts, width)]
    return [*first, *terminal.pack(last + (" —" if same else ""), parts, width)]


# What a block too wide for the terminal leaves out first (`--format wide` has them all):
# never the status, which a cut line would lose, nor *same start*, which a ✗ makes the news.
_SPARED_LAST = ("img/J", "util", "clock", "runs", "mem/rank")
# Then, where the options narrowed onto more lines still pass a narrow terminal (80
# columns), what another column says too: the speed-up (eff. is it over N), img/s (the
# epoch time ranks a block's rows alike: same images), Δ top-1 (top-1 beside the
# reference's; the verdict below says what differs), then eff. A row still too wide passes
# the width: cut, it lost its status.
_SPARED_ON_A_NARROW_TERMINAL = ("speed-up", "img/s", "Δ top-1", "Δ top-1 (p)", "eff.")


def _fit(names: list[str], rows: list[list[str]], width: int
         ) -> tuple[list[str], list[list[str]], list[int]]:
    """The block's columns and their widths, the least needed left out while a row would
    pass ``width``: first those it can spare whole (``_SPARED_LAST``), then, with the options
    narrowed, those another column says too."""
    table = terminal.spare_columns([names, *rows], width, _SPARED_LAST, narrow=False,
                                   widths_of=_block_widths)
    table = terminal.spare_columns(table, width, _SPARED_ON_A_NARROW_TERMINAL,
                                   widths_of=_block_widths)
    names, rows = table[0], table[1:]
    return names, rows, terminal.narrowed_options(names, rows, _block_widths(table), width)


def _block_widths(table: list[list[str]]) -> list[int]:
    """A block's columns' widths, its last (the status) counting only its word: a status's
    reason goes on a line of its own."""
    columns = list(zip(*table))
    return ([max(len(x) for x in column) for column in columns[:-1]]
            + [max(len(x.partition(": ")[0].partition(" ⚠ ")[0]) + 2 for x in columns[-1])])


MEMORY_DIFFERS = 1.10  # mem/rank shows where a block's rows differ by more than this


def _memory_if_it_differs(names: list[str], rows: list[list[str]]
                          ) -> tuple[list[str], list[list[str]]]:
    """The mem/rank column stays in a block only where its rows differ by more than 10 %
    (ZeRO and FSDP beside DDP); elsewhere it says nothing the choice depends on."""
    i = names.index("mem/rank")
    values = [float(row[i].split()[0]) for row in rows if row[i] != "—"]
    if len(values) >= 2 and min(values) > 0 and max(values) / min(values) > MEMORY_DIFFERS:
        return names, rows
    return _without_column(names, rows, i)


def _without_column(names: list[str], rows: list[list[str]], i: int
                    ) -> tuple[list[str], list[list[str]]]:
    return names[:i] + names[i + 1:], [row[:i] + row[i + 1:] for row in rows]


def only_if_it_differs(names: list[str], rows: list[list[str]], name: str
                       ) -> tuple[list[str], list[list[str]]]:
    """Column ``name`` stays in a block only where its rows differ (the batch: the workload
    names it, except where each row trains at the largest batch it fits)."""
    if name not in names:
        return names, rows
    i = names.index(name)
    if len({row[i] for row in rows}) > 1:
        return names, rows
    return _without_column(names, rows, i)


def only_where_apart(names: list[str], rows: list[list[str]], columns: dict[str, str],
                     apart_by: list[tuple[str, ...]]) -> tuple[list[str], list[list[str]]]:
    """Each of ``columns`` (its name: the GROUP_KEYS key it shows) stays in a block only
    where some row's ``apart_by`` (bench.report.table.apart_by) names its key: rows alike
    in strategy, N, precision and options that differ in it (a ddp run of 3 epochs beside
    one of 2 with no reference row to say '— (3 epochs)', a GPU run with per-replica BN
    beside one with SyncBN). Elsewhere the options (cpu syncbn, ghost BN) or the Δ top-1
    cell say it already, or every row shares it."""
    for name, key in columns.items():
        if name in names and not any(key in keys for keys in apart_by):
            names, rows = _without_column(names, rows, names.index(name))
    return names, rows


# What an accuracy block (ranks oversubscribing the cores) leaves out, and says instead.
_TIME_COLUMNS = frozenset({"epoch s", "img/s", "speed-up", "eff.", "epoch time (s)",
                           "speed-up vs N=1", "scaling eff.", "time to target (s)",
                           "exposed comm (%)", "MFU (%)", "loader alone (img/s)",
                           "input wait (%)", "clock", "util", "GPU clock", "GPU util (%)",
                           "img/J"})
ACCURACY_ONLY = "ranks oversubscribe the cores: speed not comparable, top-1 only"


def accuracy_only(names: list[str], rows: list[list[str]], records: list[dict]
                   ) -> tuple[list[str], list[list[str]], list[str]]:
    """A block with oversubscribed rows loses its time columns and says why in its heading
    (nothing, elsewhere). Its rows lose their warnings too: every flag is about a time
    figure (a slow run, efficiency, the crowding the heading already names), and a warning
    beside a top-1 that it does not concern reads as one about the top-1. (The CSV and the
    wide view keep them.)"""
    if not speed_not_comparable(records):
        return names, rows, []
    keep = [i for i, name in enumerate(names) if name not in _TIME_COLUMNS]
    rows = [[row[i] for i in keep] for row in rows]
    for row, record in zip(rows, records, strict=True):
        if record.get("flags"):  # all but those about top-1 too
            kept = ", ".join(f for f in record["flags"].split(", ") if f in ABOUT_TOP1)
            row[-1] = row[-1].replace(f" ⚠ {record['flags']}", f" ⚠ {kept}" if kept else "")
    return [names[i] for i in keep], rows, [ACCURACY_ONLY]


def to_text(table, width: int | None = None) -> str:
    """The key columns, one block per workload, each line at most ``width`` characters (the
    terminal's: ``terminal.columns``)."""
    width = width or terminal.columns()
    header = [h for _, h in TERMINAL_COLUMNS]
    picked = [COLUMN_INDEX[c] for c, _ in TERMINAL_COLUMNS]
    blocks: dict[str, list[list[str]]] = {}
    block_records: dict[str, list[dict]] = {}
    answers = verdict_lines(table)
    at = {name: header.index(name) for name in (
        "options", "N", "epoch s", "top-1 %", "Δ top-1 (p)", "eff.")}
    for record, cells in zip(table.to_dict("records"), row_cells(table)):
        row = [cells[i] for i in picked]
        options = [] if row[at["options"]] == "—" else [row[at["options"]]]
        if record.get("grad_accum", 1) > 1:
            options.append(f"accum {record['grad_accum']}")
        row[at["options"]] = short_options(", ".join(options) or "—")
        row[at["N"]] = row[at["N"]].replace(" (of ", " (")
        # the flag line below says 'shared GPUs'; the cell keeps the table in 120 columns
        row[at["epoch s"]] = row[at["epoch s"]].replace(" (ranks shared GPUs: not comparable)",
                                                        " (shared)")
        row[at["top-1 %"]] = row[at["top-1 %"]].replace(" ± ", "±")
        # one run each: no test, only the difference
        row[at["Δ top-1 (p)"]] = row[at["Δ top-1 (p)"]].replace(" (p —)", "")
        row[at["eff."]] = row[at["eff."]].replace(" %", "%")
        clock, util = header.index("clock"), header.index("util")
        row[clock] = row[clock].replace(" %", "%")  # the GPU clock
        row[util] += "%" if row[util] != "—" else ""  # the GPU utilization
        if record.get("flags"):
            row[-1] += f" ⚠ {record['flags']}"
        blocks.setdefault(record["workload"], []).append(row)
        block_records.setdefault(record["workload"], []).append(record)
    out = []
    unscaled = False  # a finished row without a speed-up: say why once, below
    for block, rows in blocks.items():
        names, rows = _memory_if_it_differs(list(header), rows)
        names, rows = only_if_it_differs(names, rows, "batch")
        names, rows = only_where_apart(names, rows, {"epochs": "epochs", "BN": "norm"},
                                       [r["apart_by"] for r in block_records[block]])
        names, rows, crowded = accuracy_only(names, rows, block_records[block])
        names, rows, same = said_once(names, rows, _SAID_ONCE, unsaid=SAID_BY_WORKLOAD)
        same += crowded
        if "speed-up" in names:
            at = names.index("speed-up")
            unscaled |= any(row[at] == "—" and row[-1].startswith("ok") for row in rows)
        delta = names.index("Δ top-1 (p)")
        if not any("(p" in row[delta] for row in rows):
            names[delta] = "Δ top-1"  # no repeats, no p-values
        # the status column's reason goes on lines of its own; other cells keep their ': '
        # ('— (1 epoch: warm-up only)')
        names, rows, widths = _fit(names, rows, width)
        out += ([""] if out else []) + block_heading(block, same, width)
        for cells in [names, *rows]:
            cells, more = terminal.options_apart(names, cells, widths)
            status, _, reason = cells[-1].partition(": ")
            text = "  ".join(c.ljust(w) for c, w in zip([*cells[:-1], status], widths))
            status, mark, flags = status.partition(" ⚠ ")
            if len(text.rstrip()) > width and mark:  # the flags, on a line of their own
                text = "  ".join(c.ljust(w) for c, w in zip([*cells[:-1], status + " ⚠"],
                                                            widths))
                reason = (f"⚠ {flags}" + (f"; {reason}" if reason else ""))
                status = ""
            out.append(text.rstrip())
            out += more
            if reason:  # why a row is not ok (or what it is flagged for), on lines of its own
                out += terminal.wrap(f"{f'{status}: ' if status else ''}{reason}", width,
                                     initial_indent="    ", subsequent_indent="      ")
        for i, sentence in enumerate(answers.get(block, [])):
            out += terminal.wrap(sentence, width, initial_indent="→ " if i == 0 else "  ",
                                 subsequent_indent="    ")
    if unscaled:
        out += terminal.wrap("(speed-up and eff.: against the same strategy, precision and "
                             "options at N=1; — where no such run is in the results)", width)
    out.append(f"(key columns; `--format wide`, summary.csv and summary.md have all "
               f"{len(COLUMNS)})")
    return "\n".join(out) + "\n"


def to_csv(table) -> str:
    columns = [c for c, _ in COLUMNS] + ["final_top1_ci", "p_value", "differs", "error",
                                          "dataset", "width", "failed_runs"]
    out = table.reindex(columns=columns)
    out["same_start"] = out["same_start"].map({"✓": "true", "✗": "false"})
    return out.to_csv(index=False)


def to_json(table) -> str:
    """The table as strict JSON (strict_json)."""
    return strict_json(table.to_dict("records"))


def strict_json(rows: list[dict[str, Any]]) -> str:
    """Rows as strict JSON: NaN and infinities (pandas' not recorded among them) become
    null, which every JSON reader takes (`jq` stops at NaN)."""
    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    rows = [{k: clean(v) for k, v in r.items()} for r in rows]
    return json.dumps(rows, indent=2, default=str, allow_nan=False) + "\n"
