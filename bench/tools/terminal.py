"""Text for a terminal of 120 columns: wrapping that never splits a `quoted command`, so
that what a line tells a user to type can be copied whole."""

from __future__ import annotations

import re
import textwrap

WIDTH = 120
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


def wrap(text: str, width: int = WIDTH, initial_indent: str = "",
         subsequent_indent: str = "") -> list[str]:
    """``textwrap.wrap`` whose lines break outside backticks (only a span longer than a
    whole line is cut, as any word that long is), never at a hyphen."""
    glued = re.sub(r"`[^`]*`", lambda m: m.group().replace(" ", _GLUE), text)
    lines = textwrap.wrap(glued, width, initial_indent=initial_indent,
                          subsequent_indent=subsequent_indent, break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines]


def fill(text: str, width: int = WIDTH, initial_indent: str = "",
         subsequent_indent: str = "") -> str:
    return "\n".join(wrap(text, width, initial_indent, subsequent_indent))


def pack(head: str, parts: list[str], width: int = WIDTH, separator: str = " ",
         indent: str = "  ") -> list[str]:
    """``head`` then each of ``parts`` after ``separator``, a part that would pass ``width``
    starting a line of its own after ``indent``: lines broken between parts, never inside
    one ('GPU clock 100%', 'final top1 99.61%')."""
    lines = [head]
    for part in parts:
        if len(lines[-1]) + len(separator) + len(part) > width:
            lines.append(indent + part)
        else:
            lines[-1] += separator + part
    return lines


def count(n: int, singular: str, plural: str | None = None) -> str:
    """``1 process``, ``2 processes``: a number and its noun in the right form."""
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


def duration(seconds: float) -> str:
    """'45 s', '3 min 10 s', '2 h 05 min': a time left, as a person says it."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
