"""`bench report`: read the records, print the table, write summaries, plots, the README."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.commands import results_argument, results_source
from bench.records.files import load_records, remove_dead_temporaries, runs_dir, write_text_atomic
from bench.records.provenance import current_status
from bench.report.accuracy import parse_reference
from bench.report.plots import write_plots
from bench.report.readme import check_readme, update_readme
from bench.report.table import summary_table
from bench.report.views import (
    plausibility_warnings,
    to_csv,
    to_json,
    to_markdown,
    to_text,
    to_wide_text,
)
from bench.tools import terminal
from bench.tools.errors import EXIT_FAILED, ConfigError
from bench.tools.folders import file_to_write, looked_up


def cmd_report(results: str, fmt: str = "text", write: bool = True,
               readme: str | None = None, reference: str | None = None,
               html: str | None = None) -> int:
    """With ``reference`` None, each workload's ``ddp:1`` row is its reference where it has
    one; a reference the user names must be the row of some workload. ``html``: also write
    the self-contained page there."""
    if reference is not None:
        parse_reference(reference)
    if html is not None:
        if Path(html).suffix.lower() not in (".html", ".htm"):
            raise ConfigError(f"--html {html}: the page's file must end in .html")
        file_to_write("--html", html, "report.html")
    if readme is not None:
        check_readme(Path(readme))
    looked_up(Path(results), "", results)
    if not Path(results).is_dir():
        raise ConfigError(f"{results} is not a folder; name a results folder (the one "
                          "`bench run --output` wrote)")
    records, warnings = load_records(results)
    for rec in records:
        status, error = current_status(rec)
        if status != rec.get("status"):
            warnings.append(f"{rec['run_id']} says {rec.get('status')}, counted as {status} "
                            f"({error})")
    from bench.records.probes import load_probes

    probes = load_probes(results, warnings)
    for line in warnings:
        print(f"bench report: {line}", file=sys.stderr)
    if not records:
        print(f"bench report: no run records in {results} (nor in {runs_dir(results)}); "
              "nothing written: name the folder `bench run --output` or `bench sweep "
              "--output` wrote", file=sys.stderr)
        return EXIT_FAILED
    table = summary_table(records, reference or "ddp:1", probes)
    if reference is not None and not table["is_reference"].any():
        finished = table[table["status"] == "ok"]
        rows = sorted(set(zip(finished["strategy"], finished["world_size"])))
        raise ConfigError(f"--reference {reference} is no finished run's row in {results} "
                          f"(those here: {', '.join(f'{s}:{n}' for s, n in rows) or 'none'}); "
                          "name one of them")
    if fmt == "json":
        print(to_json(table), end="")
    elif fmt == "wide":
        print(to_wide_text(table), end="")
    elif fmt == "csv":
        print(to_csv(table), end="")
    elif fmt == "markdown":
        print(to_markdown(table), end="")
    else:
        print(to_text(table), end="")
    from bench.report.trace_breakdown import format_rows, trace_rows

    traced = trace_rows(records, Path(results))
    if traced and fmt == "text":
        print("\n" + format_rows(traced), end="")
    sys.stdout.flush()  # the warnings follow the table they are about, on a terminal too
    for line in plausibility_warnings(table):
        print(terminal.fill(f"bench report: {line}", subsequent_indent="    "),
              file=sys.stderr)
    if write:
        root = Path(results)
        remove_dead_temporaries(root)  # of a report killed mid-write (its plots' go below)
        write_text_atomic(root / "summary.csv", to_csv(table))
        write_text_atomic(root / "summary.md", to_markdown(table))
        if traced:
            import pandas as pd

            write_text_atomic(root / "trace_breakdown.csv", pd.DataFrame(traced).to_csv(
                index=False, float_format="%.2f"))
        plots = write_plots(records, root / "plots", probes)
        print(f"wrote {root / 'summary.csv'}, {root / 'summary.md'} and {len(plots)} plot files "
              f"under {root / 'plots'}", file=sys.stderr)
    if html is not None:
        from bench.report.html import html_page

        write_text_atomic(Path(html), html_page(records, probes, table, str(results)))
        print(f"wrote {html}", file=sys.stderr)
    if readme:
        changed = update_readme(Path(readme), records, probes)
        print(f"{readme}: table {'updated' if changed else 'already up to date'}",
              file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench report``'s options (``help``: its line in ``bench --help``)."""
    report = sub.add_parser("report", help=help)
    results_argument(report, "the results folder: a run's or a sweep's --output (default "
                             "results)")
    report.add_argument("--reference", default=None,
                        help="STRATEGY[:N]: the row each workload's top-1 is compared with "
                             "(default ddp:1)")
    report.add_argument("--format", choices=("text", "wide", "markdown", "csv", "json"),
                        default="text",
                        help="how the table is printed: text (the key columns, per workload; "
                             "default), wide (every column), markdown, csv, json")
    report.add_argument("--no-write", action="store_true",
                        help="print only; do not write summary files")
    report.add_argument("--html", default=None, metavar="FILE",
                        help="also write the report as one self-contained HTML page (verdict, "
                             "tables, inline plots, flags, machines, commands)")
    report.add_argument("--update-readme", nargs="?", const="README.md", default=None,
                        metavar="README", help="rewrite the README's comparison table")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    return cmd_report(results_source(args), args.format, write=not args.no_write,
                      readme=args.update_readme, reference=args.reference, html=args.html)
