"""What every report figure shares: a row's label, the series a line belongs to, the mark
and legend of a flagged row, and an accuracy axis that never magnifies a test image."""

from __future__ import annotations

import math

from bench.records.describe import short_options
from bench.tools.terminal import count


def row_label(r) -> str:
    """A row's name in plots: strategy, N, precision and what else sets it apart."""
    return " ".join([r.strategy, n_label(r), r.precision, *sets_apart(r)])


def n_label(r) -> str:
    """'N=2'; 'N=1 (2 asked)' for a row that ran fewer replicas than asked (dp on CPU: one),
    as the table and the verdict name it: beside a row of N=1 asked, both read 'dp N=1'."""
    asked = r.gpus_requested
    return f"N={r.world_size}" + (f" ({asked} asked)" if asked != r.world_size else "")


def sets_apart(r) -> list[str]:
    """What else tells a row from its workload's others: speed options, accumulation, what
    keeps rows apart that read alike otherwise (the table's ``apart``: '3 epochs'), a
    flag."""
    options = short_options(r.options)
    extra = [] if options == "—" else [options]
    if r.grad_accum > 1:
        extra.append(f"accum {r.grad_accum}")
    if getattr(r, "apart", ""):
        extra.append(r.apart)
    if getattr(r, "flags", ""):
        extra.append(FLAG)
    return extra


FLAG = "⚠"
FLAGGED = "⚠ flagged: suspect (see `bench report`)"


def legend(ax, **kwargs) -> None:
    """A legend with each label once (every line's flagged points share one entry)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), **kwargs)


def ring_flagged(ax, rows, xs, ys) -> None:
    """A red ring around each point whose row is flagged."""
    points = [(x, y) for r, x, y in zip(rows, xs, ys) if r.flags]
    if points:
        ax.scatter(*zip(*points), s=160, facecolors="none", edgecolors="tab:red",
                   linewidths=1.5, zorder=5, label=FLAGGED)


ACCURACY_SPAN = 5.0  # points: an accuracy axis never spans less (one test image is no chasm)


def at_least_points(ax, values: list[float], span: float = ACCURACY_SPAN) -> None:
    """Widen a top-1 axis to at least ``span`` points around its data, within 0-100, so
    that differences of a few test images look as small as they are."""
    values = [v for v in values if v == v and math.isfinite(v)]
    if not values or max(values) - min(values) >= span:
        return
    middle = (max(values) + min(values)) / 2
    low = min(max(0.0, middle - span / 2), 100.0 - span)
    ax.set_ylim(low - 0.5, low + span + 0.5)


def short_row_label(r) -> str:
    return row_label(r) + (" shared GPU" if r.gpu_shared else "")


# A line over N: the rows that differ only in N (one way of working, its options included:
# the fastest path at N=1 is not a point of plain bf16's line; a row that ran fewer
# replicas than asked is not a point of its strategy's line either, which would rise
# straight up at N=1 from the row asked for 1; nor is a run of 3 epochs a point of the line
# of 2-epoch runs: its N=1 point sat beside theirs, joined to it by a zigzag).
SERIES = ["strategy", "precision", "options", "grad_accum", "gpu_shared", "fewer_than_asked",
          "epochs"]


def series_label(strategy: str, precision: str, options: str, grad_accum: int,
                  gpu_shared: bool, fewer_than_asked: bool = False,
                  epochs: int | None = None) -> str:
    """A line's name; ``epochs`` where lines of the figure ran different numbers (None: the
    figure's lines all ran the same, which the name then leaves out)."""
    extra = [] if options == "—" else [short_options(options)]
    extra += [f"accum {grad_accum}"] * (grad_accum > 1) + ["shared GPU"] * gpu_shared
    extra += ["fewer replicas than asked"] * fewer_than_asked
    extra += [] if epochs is None else [count(int(epochs), "epoch")]
    return f"{strategy} {precision}" + (f" ({', '.join(extra)})" if extra else "")


def line_label(key: tuple, rows) -> str:
    """The name of the line whose SERIES values are ``key`` among ``rows`` (a figure's):
    its epochs said only where another line of the figure would read as it does (the
    fastest path's 6 epochs beside plain rows of 4 is named by its options already)."""
    alike = rows[[(tuple(r) == tuple(key[:-1]))
                  for r in rows[SERIES[:-1]].itertuples(index=False)]]
    return series_label(*key[:-1], epochs=key[-1] if alike["epochs"].nunique() > 1 else None)
