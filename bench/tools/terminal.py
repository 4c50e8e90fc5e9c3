"""Text for a terminal of up to 120 columns: wrapping that never splits a `quoted command`,
so that what a line tells a user to type can be copied whole; tables whose options column
narrows onto more lines rather than pass the width."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Callable

WIDTH = 120  # the widest bench writes: a file, a pipe and a wide terminal get this
NARROWEST = 60  # below it a table's key columns do not fit at all


def columns() -> int:
    """The columns bench's text fills: ``COLUMNS`` where set, else the terminal's where
    stdout or stderr is one (a rank's stderr is a pipe to bench: bench passes its width
    on as ``COLUMNS``), at most WIDTH and at least NARROWEST; WIDTH for a file or a pipe.
    An 80-column terminal showed every line of 120 folded in two, mid-word."""
    given = os.environ.get("COLUMNS", "")
    if given.isdigit() and int(given) > 0:
        return max(NARROWEST, min(WIDTH, int(given)))
    for stream in (sys.stdout, sys.stderr):
        try:
            size = os.get_terminal_size(stream.fileno()).columns if stream.isatty() else 0
        except (AttributeError, OSError, ValueError):  # closed, replaced, or no size
            continue
        if size > 0:  # (a terminal whose size was never set says 0)
            return max(NARROWEST, min(WIDTH, size))
    return WIDTH


_GLUE = "\x00"  # stands for a space inside backticks while wrapping

# What a terminal obeys rather than shows: C0 and C1 controls (ESC starts the sequences
# that clear the screen, move the cursor, set the title), DEL, and the marks that reorder
# text (bidirectional overrides and isolates).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, keep: str = "") -> str:
    """``text`` with every control character written out (``\\x1b``), but those in ``keep``
    ('\\n' for a traceback): a string read from a record or a file name prints as what
    it is, never as a command to the terminal (a crafted record's CPU name cleared the
    screen of a `bench report` and titled its window)."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep
                         else f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                         else f"\\u{ord(m.group()):04x}", text)


def wrap(text: str, width: int | None = None, initial_indent: str = "",
         subsequent_indent: str = "") -> list[str]:
    """``textwrap.wrap`` whose lines break outside backticks (only a span longer than a
    whole line is cut, as any word that long is), never at a hyphen; ``width``: the
    terminal's (``columns``) unless given."""
    width = width or columns()
    glued = re.sub(r"`[^`]*`", lambda m: m.group().replace(" ", _GLUE), text)
    lines = textwrap.wrap(glued, width, initial_indent=initial_indent,
                          subsequent_indent=subsequent_indent, break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines]


def fill(text: str, width: int | None = None, initial_indent: str = "",
         subsequent_indent: str = "") -> str:
    return "\n".join(wrap(text, width, initial_indent, subsequent_indent))


def pack(head: str, parts: list[str], width: int | None = None, separator: str = " ",
         indent: str = "  ") -> list[str]:
    """``head`` then each of ``parts`` after ``separator``, a part that would pass ``width``
    starting a line of its own after ``indent``: lines broken between parts, never inside
    one ('GPU clock 100%', 'final top1 99.61%'), unless the head or a part alone is longer
    than a line (a workload over a shaped link, a probe's name: 86 columns on 80)."""
    width = width or columns()
    lines = wrap(head, width, subsequent_indent=indent) if len(head) > width else [head]
    for part in parts:
        if len(lines[-1]) + len(separator) + len(part) <= width:
            lines[-1] += separator + part
        elif len(indent + part) > width:
            lines += wrap(part, width, initial_indent=indent, subsequent_indent=indent)
        else:
            lines.append(indent + part)
    return lines


def count(n: int, singular: str, plural: str | None = None) -> str:
    """``1 process``, ``2 processes``: a number and its noun in the right form."""
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


def message_size(size: int) -> str:
    """'712 KiB', '42.8 MiB': a message's bytes as the probe's table and figure name them."""
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def duration(seconds: float) -> str:
    """'45 s', '3 min 10 s', '2 h 05 min': a time left, as a person says it. A time under
    half a second is '1 s', not '0 s': a two-epoch run on a small set said 'about 0 s for 2
    epochs', as if it took no time."""
    seconds = max(0, round(seconds)) or (1 if seconds > 0 else 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def narrowed_options(names: list[str], rows: list[list[str]], widths: list[int],
                     width: int) -> list[int]:
    """The columns' widths with the options' narrowed (their cells to go on as many lines
    as ``wrapped_cell`` needs) where a line would pass ``width`` otherwise: 'static
    graph,no buffer broadcast,cpu syncbn' cut the line short, and with it top-1 and the
    status. Two spaces between columns."""
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over <= 0 or "options" not in names:
        return widths
    i = names.index("options")
    longest_word = max((len(word) + 1 for row in rows for word in re.split(r"[ ,]", row[i])),
                       default=0)
    return [*widths[:i], max(longest_word, len("options"), widths[i] - over), *widths[i + 1:]]


def column_widths(table: list[list[str]]) -> list[int]:
    """Each column's width: its widest cell, the header's included."""
    return [max(len(x) for x in column) for column in zip(*table)]


def spare_columns(table: list[list[str]], width: int, spare: tuple[str, ...], *,
                  narrow: bool = True,
                  widths_of: Callable[[list[list[str]]], list[int]] = column_widths
                  ) -> list[list[str]]:
    """``table`` (its header first) without the columns named in ``spare``, left out in
    that order while a row would pass ``width``: on a terminal of 80 columns a row that
    passes it folds, and its last columns land under its first. A row's width is
    ``widths_of``'s, with the options narrowed (``narrowed_options``) unless ``narrow`` is
    False: the report leaves out the columns it needs least before it narrows them."""
    for name in spare:
        widths = widths_of(table)
        if narrow:
            widths = narrowed_options(table[0], table[1:], widths, width)
        if sum(widths) + 2 * (len(widths) - 1) <= width:
            break
        if name in table[0]:
            i = table[0].index(name)
            table = [row[:i] + row[i + 1:] for row in table]
    return table


def wrapped_cell(text: str, width: int) -> list[str]:
    """A cell of comma-separated parts ('static graph,no buffer broadcast,cpu syncbn') on
    lines of at most ``width``: broken after a comma, and inside a part only where the
    part alone is wider."""
    parts = text.split(",")
    lines: list[str] = []
    for n, part in enumerate(parts):
        part += "," if n < len(parts) - 1 else ""
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines += textwrap.wrap(part, width) or [part]
    return lines or [text]


def aligned_rows(table: list[list[str]], width: int) -> list[list[str]]:
    """Each row of ``table`` (its header first) as its lines, in columns two spaces apart
    and within ``width`` where narrowing the options column can make them so (its cells on
    more lines: ``wrapped_cell``)."""
    widths = narrowed_options(table[0], table[1:], column_widths(table), width)
    out = []
    for row in table:
        row, more = options_apart(table[0], row, widths)
        out.append(["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), *more])
    return out


def options_apart(names: list[str], row: list[str], widths: list[int]
                  ) -> tuple[list[str], list[str]]:
    """The row with its options cell's first line (``wrapped_cell`` at its column's width),
    and the lines of the rest, each indented to that column; the row as it is, and none,
    without an options column."""
    if "options" not in names:
        return row, []
    at = names.index("options")
    first, *more = wrapped_cell(row[at], widths[at])
    indent = " " * (sum(widths[:at]) + 2 * at)
    return [*row[:at], first, *row[at + 1:]], [indent + part for part in more]
