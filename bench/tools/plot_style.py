"""How the i-th line or point of a figure looks, for every figure (the report's, the
projection's): matplotlib's ten colours come round at the eleventh, which must not then
look like the first."""

from __future__ import annotations

# A record's text is text: matplotlib read a '$' in a model's, a folder's or a CPU's name as
# the start of a formula, and `bench report` and `bench project --plot` ended in its
# parser's traceback ('Expected {phantom | llap ...}'). No figure of bench's writes a
# formula (the report's log axes: figures.plain_powers). Figures are made under
# matplotlib.rc_context(PLAIN_TEXT).
PLAIN_TEXT = {"text.parse_math": False}


def line_look(i: int) -> dict[str, str]:
    """The ``i``-th line's colour, marker and dash: matplotlib's ten colours, plain circles
    and solid lines up to ten lines; each further ten another marker and dash, or the
    eleventh line is the first's twin (the committed accuracy block's 15 curves drew ddp N=1
    and ddp-amp N=2 both as blue circles on a solid line)."""
    turn = i // 10
    return {"color": f"C{i % 10}", "marker": "os^D"[turn % 4],
            "linestyle": ("-", "--", ":", "-.")[turn % 4]}


def point_marker(i: int) -> str:
    """The ``i``-th point's marker beside its colour ``C{i % 10}``: ten markers, shifted by
    one each ten points so that no colour and marker come round together."""
    markers = "osD^v<>phX"
    return markers[(i + i // 10) % len(markers)]
