"""`bench list`: the registered strategies and whether each runs here."""

from __future__ import annotations

import argparse

from bench.records.environment import cpu_bf16_instructions, emulated_bf16_note
from bench.tools import terminal

USES_TORCH = True


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench list``'s options (``help``: its line in ``bench --help``)."""
    sub.add_parser("list", help=help)


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    import torch

    import strategies

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    header = ("strategy", "launcher", "available here", "what it is")
    rows, reasons = [], []
    for name in strategies.names():
        strategy = strategies.get(name)
        reason = strategy.requires(device_type)
        rows.append((name, strategy.launcher, "yes" if reason is None else "no (below)",
                     strategy.summary))
        if reason:
            reasons.append(f"  {name}: {reason}")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lead = sum(widths) + 6  # where the last column starts
    room = terminal.columns() - lead
    beside = room >= 40  # else it goes below its row (80 columns)
    for row in [header, *rows]:
        cells = "  ".join(c.ljust(w) for c, w in zip(row[:3], widths))
        if beside:
            first, *more = terminal.wrap(row[3], room)
            print(f"{cells}  {first}", *(" " * lead + line for line in more), sep="\n")
        else:
            print(cells.rstrip(), *terminal.wrap(row[3], initial_indent="    ",
                                                 subsequent_indent="    "), sep="\n")
    print(f"(device here: {device_type})")
    if device_type == "cpu" and cpu_bf16_instructions() is False:  # ddp-amp's CPU precision
        print(terminal.fill(f"note: ddp-amp trains in bf16 on CPU, and {emulated_bf16_note()}",
                            subsequent_indent="  "))
    if reasons:
        print("not available here:")
        for reason in reasons:
            print(terminal.fill(reason, subsequent_indent="    "))
    return 0
