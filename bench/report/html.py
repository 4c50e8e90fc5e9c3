"""`bench report --html FILE`: the report as one self-contained page a colleague can open in
any browser, offline: the verdict, a table and the figures per workload (inline SVG), the
flags, the projection where a probe exists, the machines and each run's command line. No
script, no font, no stylesheet or image from anywhere else; every text from a record is
escaped (a record is data, never markup)."""

from __future__ import annotations

import io
import re
import shlex
from html import escape
from typing import Any

from bench.records.describe import tuning
from bench.report.readme import hardware_lines
from bench.report.readme_view import workload_blocks
from bench.report.views import plausibility_warnings

_CSS = """
:root { color-scheme: light; --ink: #1d2329; --muted: #5b6570; --line: #d8dde3;
        --accent: #1f5fa8; --warn: #a4411a; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1200px; padding: 16px; font: 15px/1.45 system-ui, -apple-system,
       "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink); }
h1 { font-size: 1.5em; margin: 0.2em 0; }
h2 { font-size: 1.15em; margin: 1.6em 0 0.3em; border-bottom: 1px solid var(--line); }
h3 { font-size: 1em; margin: 1em 0 0.3em; }
.muted { color: var(--muted); }
.answer { background: #f3f7fc; border-left: 4px solid var(--accent); padding: 8px 14px; }
.answer li, .verdict li { margin: 0.25em 0; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.4em 0; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f4f6f8; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.flags li { color: var(--warn); }
.figures { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; flex: 1 1 420px; max-width: min(100%, 620px); }
figure svg { width: 100%; height: auto; display: block; }
figcaption { font-size: 0.85em; color: var(--muted); }
code { font-size: 0.85em; word-break: break-all; }
details { margin: 0.5em 0; }
"""

_NUMERIC = re.compile(r"^[-+]?[\d.,]+( ?[%×])?( ?±.*)?$")


def _prose(text: str) -> str:
    """A sentence of the terminal's, escaped, its `quoted commands` set as code (the
    terminal keeps them whole on a line; here they would show their backticks)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _cell(text: str) -> str:
    kind = ' class="num"' if _NUMERIC.match(text) else ""
    return f"<td{kind}>{escape(text)}</td>"


def _table(names: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}'
            "</tbody></table></div>")


def _svg(fig) -> str:
    """A matplotlib figure as inline SVG: text as text (the page's font), no XML prologue."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "parallel-bench"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


_FIGURE_TITLES = {
    "epoch_time": "Epoch time", "scaling": "Scaling", "scaling_efficiency": "Scaling efficiency",
    "top1": "Accuracy per epoch", "time_to_target": "Time to target",
    "time_vs_accuracy": "Time vs accuracy", "where_time_goes": "Where the step time goes",
    "busbw": "All-reduce ceiling", "memory": "Memory per rank, by parts",
}


def _projection(table) -> str:
    """The rows a probe lets the report project (ideal all-reduce against the step, and
    bench project's efficiency at 64 and 512 GPUs), or '' without a probe."""
    rows = [r for r in table.to_dict("records")
            if isinstance(r.get("projected_efficiency"), str) or isinstance(
                r.get("comm_ceiling"), str)]
    if not rows:
        return ""
    cells = [[str(r["workload"]), str(r["strategy"]), str(r["world_size"]), str(r["precision"]),
              *(r[k] if isinstance(r.get(k), str) else "—"  # (not said: pandas' NaN)
                for k in ("comm_ceiling", "projected_efficiency"))]
             for r in rows]
    return ("<h2>Projection</h2><p>From the newest <code>bench probe</code> of each row's "
            "machine and network (else of its device, and the cell says so): "
            "the ideal all-reduce of a step's gradient against the measured step, and the "
            "efficiency <code>bench project</code> gives at 64 and 512 GPUs (8 per node) on "
            "that network. A projection, not a measurement.</p>"
            + _table(["workload", "strategy", "N", "precision", "ideal all-reduce / step (ms)",
                      "projected eff. at 64 / 512 GPUs"], cells))


def _runs(records: list[dict[str, Any]]) -> str:
    rows = []
    for rec in sorted(records, key=lambda r: str(r.get("started_at") or "")):
        command = rec.get("command")
        # under the speed-changing variables its shell set (env.tuning): the line as it ran
        # (NAME='value': a quoted 'NAME=value' is no assignment to a shell)
        line = " ".join([*(f"{name}={shlex.quote(value)}" for name, value in tuning(rec) or ()),
                         shlex.join(map(str, command))]) if isinstance(command, list) else "—"
        rows.append(f"<tr><td>{escape(str(rec.get('run_id')))}</td>"
                    f"<td>{escape(str(rec.get('status')))}</td><td><code>{escape(line)}</code>"
                    "</td></tr>")
    return ("<h2>Runs</h2><details><summary>Each record and the command that made it "
            f"({len(records)}), under the environment variables that change speed its shell "
            "set</summary><div class=\"scroll\"><table><thead><tr><th>run</th>"
            "<th>status</th><th>command</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table></div></details>")


def html_page(records: list[dict[str, Any]], probes: list[dict[str, Any]], table,
              source: str) -> str:
    """The whole page, from the records, their probes and their summary table."""
    import matplotlib.pyplot as plt

    from bench.report.plots import records_by_workload, workload_figures

    blocks = workload_blocks(table)
    answer = "".join(
        f"<li><b>{escape(name)}</b>: {_prose(' '.join(verdict))}</li>"
        for name, _, _, _, verdict in blocks if verdict)
    unanswered = [(name, [row[names.index("status")] for row in rows])
                  for name, _, names, rows, verdict in blocks if not verdict]
    if not answer and unanswered:  # the page asks the question: never leave it unanswered
        answer = ("<li>Not answered yet: a workload needs two finished configurations to "
                  "compare (another strategy, world size or precision on the same data, "
                  "model and batch; <code>bench sweep</code> runs them all).</li>")
    if unanswered:  # a block left out of the answer says why, not nothing
        answer += "".join(
            f'<li class="muted"><b>{escape(name)}</b>: '
            + ("no run here finished (its table says how each ended)."
               if not any(status.startswith("ok") for status in statuses)
               else "one configuration, nothing here to compare it with." if len(statuses) == 1
               else "no two finished configurations to compare.") + "</li>"
            for name, statuses in unanswered)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>parallel-bench report</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>parallel-bench report</h1>",
        f'<p class="muted">{len(records)} run records from <code>{escape(source)}</code>. '
        "Which data-parallel strategy is fastest here, and does it cost accuracy?</p>",
    ]
    if answer:
        parts.append(f'<div class="answer"><h3>The answer</h3><ul class="verdict">{answer}'
                     "</ul></div>")
    # drawn a workload at a time and closed once on the page (the committed results' 40
    # figures all open at once made matplotlib warn)
    groups = records_by_workload(records)
    for name, same, names, rows, verdict in blocks:
        parts.append(f"<h2>{escape(name)}</h2>")
        if same:
            parts.append(f'<p class="muted">{escape(", ".join(same))}</p>')
        parts.append(_table(names, rows))
        if verdict:
            parts.append('<ul class="verdict">' + "".join(f"<li>{_prose(s)}</li>"
                                                          for s in verdict) + "</ul>")
        drawn = workload_figures(name, groups[name], probes)
        if drawn:
            parts.append('<div class="figures">')
            for key, fig in drawn.items():
                parts.append(f"<figure>{_svg(fig)}<figcaption>"
                             f"{escape(_FIGURE_TITLES.get(key, key))}</figcaption></figure>")
                plt.close(fig)
            parts.append("</div>")
    warnings = plausibility_warnings(table)
    if warnings:
        parts.append('<h2>Flags</h2><ul class="flags">'
                     + "".join(f"<li>{_prose(w)}</li>" for w in warnings) + "</ul>")
    parts.append(_projection(table))
    parts.append("<h2>Measured on</h2><ul>"
                 + "".join(f"<li>{escape(line)}</li>" for line in hardware_lines(records))
                 + "</ul><p class=\"muted\">Epoch time: the median of the epochs after the "
                 "first (its warm-up).</p>")
    parts.append(_runs(records))
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p) + "\n"
