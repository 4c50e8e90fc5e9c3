"""`make table`'s last step: the rows just measured replace the same rows in RESULTS.

    python scripts/replace_rows.py NEW RESULTS

Every run record in NEW/runs (and probe in NEW/probes) moves to RESULTS. First, each record
in RESULTS/runs of a workload on a device that NEW measured goes: the table was measured
again, and its old runs would otherwise be averaged with the new ones as repeats. Records of
other workloads or devices (the GPU rows, `make parity`'s rows) stay. A probe needs no
removal: the report uses the newest of a kind. NEW is removed at the end.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bench.records.describe import workload
from bench.records.files import load_records, read_record, runs_dir
from bench.records.schema import record_problem


def replace_rows(new: Path, results: Path) -> tuple[int, int]:
    """(records moved in, records removed)."""
    fresh, problems = load_records(new)
    if problems or not fresh:
        raise SystemExit(f"replace_rows: {new} holds no run records to move "
                         f"({'; '.join(problems) or 'none'}); RESULTS left as it was")
    measured = {(workload(r), r.get("device")) for r in fresh}
    removed = 0
    for path in sorted(runs_dir(results).glob("*.json")):
        try:
            rec = read_record(path)
        except (OSError, ValueError):
            continue  # not a record: not ours to remove
        if record_problem(rec):
            continue
        if (workload(rec), rec.get("device")) in measured:
            path.unlink()
            removed += 1
    for kind in ("runs", "probes"):
        if (new / kind).is_dir():
            (results / kind).mkdir(parents=True, exist_ok=True)
            for path in sorted((new / kind).glob("*.json")):
                shutil.move(str(path), results / kind / path.name)
    shutil.rmtree(new)
    return len(fresh), removed


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python scripts/replace_rows.py NEW RESULTS")
    moved, dropped = replace_rows(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"replace_rows: {moved} record(s) in, {dropped} of the same rows' earlier runs out")
