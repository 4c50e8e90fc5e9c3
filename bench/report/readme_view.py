"""The README's view of the summary table, for Markdown and HTML alike: a table per
workload with the columns that answer the question, what every row of it shares said once
in its heading, and its verdict beneath."""

from __future__ import annotations

from bench.report.table import COLUMN_INDEX
from bench.report.views import (
    SAID_BY_WORKLOAD,
    accuracy_only,
    only_if_it_differs,
    only_where_apart,
    row_cells,
    said_once,
    verdict_lines,
)

# The README's view: a Markdown table per workload with what answers the question; a column
# with one value in every row of a block is said once in its heading, one of '—' leaves.
README_COLUMNS = [
    ("strategy", "strategy"), ("device", "device"), ("world_size", "N"),
    ("global_batch", "batch"), ("processes", "procs"), ("precision", "precision"),
    ("options", "options"),
    ("grad_accum", "accum"), ("epochs", "epochs"), ("norm", "norm"),
    ("same_start", "same start"), ("runs", "runs"),
    ("epoch_time_s", "epoch time (s)"), ("images_per_s", "img/s"),
    ("speedup", "speed-up vs N=1"), ("efficiency", "scaling eff."),
    ("time_to_target", "time to target (s)"), ("final_top1", "final top-1 (%)"),
    ("delta_top1", "Δ top-1 vs ref (p)"), ("exposed_comm", "exposed comm (%)"),
    ("mfu", "MFU (%)"), ("loader_alone", "loader alone (img/s)"),
    ("input_wait", "input wait (%)"),
    ("clock_share", "GPU clock"), ("gpu_util", "GPU util (%)"),
    ("images_per_joule", "img/J"), ("status", "status"),
]
_README_SAID_ONCE = {"device": "", "N": "N =", "procs": "procs", "precision": "",
                     "options": "options", "accum": "accum", "norm": "", "same start": "same start",
                     "runs": "runs", "speed-up vs N=1": "speed-up", "scaling eff.": "scaling eff.",
                     "GPU clock": "GPU clock", "GPU util (%)": "GPU util %", "img/J": "img/J"}
# Said once, these go without saying: the default accumulation, and where every row is at
# N=1 (its own baseline) the speed-up and efficiency that follow from it.
_README_UNSAID = frozenset({"accum 1", *SAID_BY_WORKLOAD})
_README_UNSAID_AT_1 = frozenset({"speed-up 1.00×", "scaling eff. 100 %"})


def workload_blocks(table) -> list[tuple[str, list[str], list[str], list[list[str]], list[str]]]:
    """The README's view of the table, for Markdown and HTML alike: per workload its name,
    what all its rows share, the columns that differ, the rows' cells and its verdict."""
    header = [h for _, h in README_COLUMNS]
    picked = [COLUMN_INDEX[c] for c, _ in README_COLUMNS]
    answers = verdict_lines(table)
    blocks: dict[str, list[list[str]]] = {}
    block_records: dict[str, list[dict]] = {}
    for record, cells in zip(table.to_dict("records"), row_cells(table)):
        row = [cells[i] for i in picked]
        if record.get("flags"):
            row[-1] += f" ⚠ {record['flags']}"
        if record.get("status") != "ok":  # no ok run: no figures, nor a count of them
            row[header.index("runs")] = "—"
        blocks.setdefault(record["workload"], []).append(row)
        block_records.setdefault(record["workload"], []).append(record)
    out = []
    for block, rows in blocks.items():
        names, rows = only_if_it_differs(list(header), rows, "batch")
        # where two rows would read alike otherwise (the norm has a column of its own)
        names, rows = only_where_apart(names, rows, {"epochs": "epochs"},
                                       [r["apart_by"] for r in block_records[block]])
        names, rows, crowded = accuracy_only(names, rows, block_records[block])
        ok = [row[-1].startswith("ok") for row in rows]
        at_1 = all(row[names.index("N")] == "1" for row in rows)
        names, rows, same = said_once(names, rows, _README_SAID_ONCE, ok,
                                      _README_UNSAID | (_README_UNSAID_AT_1 if at_1 else set()))
        keep = [i for i, name in enumerate(names) if name in ("strategy", "status")
                or any(row[i] != "—" for row in rows)]
        names, rows = [names[i] for i in keep], [[row[i] for i in keep] for row in rows]
        delta = names.index("Δ top-1 vs ref (p)") if "Δ top-1 vs ref (p)" in names else None
        # (no reference row in the block: the column is '—' throughout and left out above)
        if delta is not None and not any("(p" in row[delta] and "(p —)" not in row[delta]
                                         for row in rows):
            names[delta] = "Δ top-1 vs ref"  # one run a row: no test, only the difference
            for row in rows:
                row[delta] = row[delta].replace(" (p —)", "")
        out.append((block, same + crowded, names, rows, answers.get(block, [])))
    return out


def to_markdown_blocks(table) -> str:
    """The README's tables: one per workload under its name and what all its rows share,
    each with the columns that differ, and its verdict; `results/summary.md` keeps every
    column."""
    out = []
    for block, same, names, rows, verdict in workload_blocks(table):
        out += [f"**{block}**" + (f" — {', '.join(same)}" if same else ""), "",
                "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
        out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
        out.append("")
        if verdict:
            out += ["**Verdict:** " + " ".join(verdict), ""]
    return "\n".join(out)
