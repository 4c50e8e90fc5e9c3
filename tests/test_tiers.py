"""tests/tiers.py, which splits the suite into `make test` and `make test-long`, names only
tests that exist, and `make test` keeps a test in every file that has one."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT
from tiers import LONG, PATTERNS


def _collected(*marker: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:randomly", *marker], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_every_entry_names_a_test_and_each_file_keeps_one_in_make_test():
    everything = _collected()
    unmatched = [p for p, c in zip(LONG, PATTERNS) if not any(c.search(t) for t in everything)]
    assert not unmatched, f"tests/tiers.py names no test: {unmatched}"
    gate = _collected("-m", "not long")
    long = _collected("-m", "long")
    assert len(gate) + len(long) == len(everything) and long and gate
    files = {t.split("::")[0] for t in everything}
    assert not {f for f in files if not any(t.startswith(f + "::") for t in gate)}, \
        "every test file keeps a test in make test"
