"""Python's cyclic garbage collector paused while a bench process starts.

Importing torch allocates some hundreds of thousands of objects, and torch._dynamo (which
DDP's constructor imports in every rank) as many again; the collector walks the young ones
each time 700 more are allocated, and all of them now and then. Paused from the process's
entry until its work begins, a 2-rank run of one tiny epoch took 6.4 CPU-s instead of 7.1
here (docs/development.md). When the work begins, start-up's garbage is collected once,
what is left is frozen (``gc.freeze``: out of every later collection) and the collector
runs as usual: the timed epochs collect what training makes, as in a plain script, without
walking torch's modules again."""

from __future__ import annotations

import gc

_paused_here = False


def pause_collector() -> None:
    """Stop cyclic collection until ``resume_collector`` (a no-op where it is already off,
    so that a caller who turned it off keeps it off)."""
    global _paused_here
    if gc.isenabled():
        gc.disable()
        _paused_here = True


def resume_collector() -> None:
    """Collect start-up's garbage once (a model built and dropped in a cycle would otherwise
    keep its tensors), freeze what is left, and collect again as usual, if
    ``pause_collector`` stopped it."""
    global _paused_here
    if _paused_here:
        _paused_here = False
        gc.collect()
        gc.freeze()
        gc.enable()
