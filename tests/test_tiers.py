"""tests/tiers.py, which splits the suite into `make test` and `make test-long`, names only
tests that exist, leaves `make test` a test in every file, and leaves it most of them."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT
from tiers import LONG, PATTERNS, is_long


def test_every_entry_names_a_test_and_each_file_keeps_one_in_make_test():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    everything = [line for line in proc.stdout.splitlines() if "::" in line]
    unmatched = [p for p, c in zip(LONG, PATTERNS) if not any(c.search(t) for t in everything)]
    assert not unmatched, f"tests/tiers.py names no test: {unmatched}"
    gate = [t for t in everything if not is_long(t)]
    files = {t.split("::")[0] for t in everything}
    assert files == {t.split("::")[0] for t in gate}, "a file left no test in make test"
    assert len(everything) - len(gate) < len(everything) / 4, "test-long holds a quarter"
