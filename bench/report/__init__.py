"""`bench report`: records -> tables (table; scores over repeats in accuracy), their views
(views), figures per workload (plots) and the README block (readme); the command itself is
bench.commands.report."""

from bench.records.describe import speed_options, workload
from bench.report.accuracy import mlperf_score, mlperf_seconds, parse_reference
from bench.report.plots import (
    each_workload_figures,
    figures_per_workload,
    make_figures,
    row_label,
    workload_slug,
    write_plots,
)
from bench.report.readme import (
    README_END,
    README_START,
    hardware_lines,
    readme_block,
    update_readme,
)
from bench.report.table import (
    COLUMNS,
    GROUP_KEYS,
    report_order,
    run_rows,
    same_start,
    summary_table,
)
from bench.report.views import (
    plausibility_warnings,
    to_csv,
    to_json,
    to_markdown,
    to_text,
    to_wide_text,
)

__all__ = [
    "COLUMNS",
    "GROUP_KEYS",
    "README_END",
    "README_START",
    "each_workload_figures",
    "figures_per_workload",
    "hardware_lines",
    "make_figures",
    "mlperf_score",
    "mlperf_seconds",
    "parse_reference",
    "plausibility_warnings",
    "readme_block",
    "report_order",
    "row_label",
    "run_rows",
    "same_start",
    "speed_options",
    "summary_table",
    "to_csv",
    "to_json",
    "to_markdown",
    "to_text",
    "to_wide_text",
    "update_readme",
    "workload",
    "workload_slug",
    "write_plots",
]
