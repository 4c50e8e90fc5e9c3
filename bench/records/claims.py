"""A sweep's claim on one combination: a file in the results folder that says which process
runs it, so that sweeps sharing a folder (on one host or several) share the work instead of
running it twice, and a claim whose owner died is taken over."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.records.provenance import owner_alive, this_process
from bench.tools.errors import CannotWrite

# A claim's heartbeat: its holder refreshes the file's time every CLAIM_HEARTBEAT_S while
# its run lives. Where the owner's process cannot be looked at (another host sharing the
# results folder), a claim whose heartbeat is older than CLAIM_STALE_S is a lost host's and
# is taken (BENCH_CLAIM_STALE_S shortens it, for tests).
CLAIM_STALE_S = 300.0


def claim_stale_s() -> float:
    return float(os.environ.get("BENCH_CLAIM_STALE_S", CLAIM_STALE_S))


@dataclass(frozen=True)
class Claim:
    """A sweep's claim on one combination: a file made atomically (O_EXCL) that names its
    owner. Concurrent sweeps skip what another one holds; a claim whose owner is gone (kill
    -9 on this host; no heartbeat for claim_stale_s() from another) is cleared and taken."""

    path: Path

    @classmethod
    def take(cls, folder: Path, name: str) -> tuple[Claim | None, dict | None]:
        """(the claim, None), or (None, the holder) when a live owner holds it."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name.replace('/', '_')}.claim"
        # The claim appears with its owner already in it (written aside, then hard-linked
        # into place, which fails if it exists): an empty or unreadable claim is never a
        # claim being written, only debris of a crash, and is cleared like a dead owner's.
        # The staged file names host and pid: two hosts can share a pid, never both.
        me = this_process()
        host = re.sub(r"[^\w.-]", "_", str(me["host"]))
        staged = folder / f".{path.name}.{host}.{me['pid']}.tmp"
        try:
            staged.write_text(json.dumps(me))
            for _ in range(2):
                try:
                    os.link(staged, path)
                    return cls(path), None
                except FileExistsError:
                    try:
                        holder = json.loads(path.read_text())
                        silent = time.time() - path.stat().st_mtime
                    except (OSError, ValueError):
                        holder, silent = None, 0.0
                    if not isinstance(holder, dict) or owner_alive(holder) is False:
                        path.unlink(missing_ok=True)
                        continue
                    if owner_alive(holder) is None and silent > claim_stale_s():
                        print(f"bench sweep: taking the claim on {name} from "
                              f"{holder.get('host')} (pid {holder.get('pid')}): no heartbeat "
                              f"for {silent:.0f} s, past the {claim_stale_s():.0f} s limit "
                              "(a lost host?)", file=sys.stderr, flush=True)
                        path.unlink(missing_ok=True)
                        continue
                    return None, holder
            return None, None
        except OSError as exc:  # a full or read-only disk: one line, nothing left behind
            raise CannotWrite.of(exc, path) from None
        finally:
            staged.unlink(missing_ok=True)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def beating(self, every: float | None = None):
        """Refresh the claim's time every ``every`` seconds (a fifth of the stale limit)
        while the block runs: the heartbeat a sweep on another host reads."""
        every = claim_stale_s() / 5 if every is None else every
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        thread = threading.Thread(target=beat, name="claim-heartbeat", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
