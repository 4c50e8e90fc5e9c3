"""The flat all-gather and reduce-scatter under the names this torch gives them. torch 2.14
renamed ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` to ``all_gather_single`` and
``reduce_scatter_single`` and warns on the old names (six FutureWarnings above `bench
probe`'s table, and `make demo`'s); the lent GPU machine's torch 2.11 has only the old."""

from __future__ import annotations

from typing import Any


def all_gather_flat(dist: Any) -> Any:
    """``dist``'s all-gather into one tensor: (output, input, group=, async_op=)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_flat(dist: Any) -> Any:
    """``dist``'s reduce-scatter of one tensor: (output, input, op=, group=, async_op=)."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
