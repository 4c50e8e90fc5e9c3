"""torchrun's restarts (``--max-restarts``), as a rank sees them: torchrun tells each rank it
starts how many restarts came before (``TORCHELASTIC_RESTART_COUNT``) and how many it may
make (``TORCHELASTIC_MAX_RESTARTS``); a rank another launcher started sees neither."""

from __future__ import annotations

import os


def restart_count() -> int:
    """How often torchrun had started the ranks again before this attempt (0: the first)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)


def restarts_allowed() -> int:
    """How often torchrun may start the ranks again in this run (0: never)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0)
