"""The cores this process may run on."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as torch's DataLoader counts them),
    or the machine's where the system cannot say (not on Linux)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
