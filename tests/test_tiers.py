"""tests/tiers.py, which splits the suite into `make test` and `make test-long`, names only
tests that exist, leaves `make test` a test in every file, and leaves it most of them."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT
from tiers import FIRST, FIRST_PATTERNS, LONG, PATTERNS, first_rank, is_long


def test_every_entry_names_a_test_and_each_file_keeps_one_in_make_test():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    everything = [line for line in proc.stdout.splitlines() if "::" in line]
    unmatched = [p for p, c in zip(LONG, PATTERNS) if not any(c.search(t) for t in everything)]
    assert not unmatched, f"tests/tiers.py names no test: {unmatched}"
    unmatched = [p for p, c in zip(FIRST, FIRST_PATTERNS) if not any(c.search(t) for t in
                                                                      everything)]
    assert not unmatched, f"tests/tiers.py's FIRST names no test: {unmatched}"
    # the collection starts with them, in FIRST's order (conftest sorts it)
    firsts = [first_rank(t) for t in everything[:len(FIRST)]]
    assert firsts == list(range(len(FIRST))), everything[:len(FIRST)]
    gate = [t for t in everything if not is_long(t)]
    files = {t.split("::")[0] for t in everything}
    assert files == {t.split("::")[0] for t in gate}, "a file left no test in make test"
    assert len(everything) - len(gate) < len(everything) / 4, "test-long holds a quarter"


def test_an_xdist_group_runs_on_one_worker(tmp_path):
    """The suite's shared runs (`xdist_group` in test_runs, test_sampler, test_slurm) are made
    once only if `--dist loadgroup` sends a group to one worker. pytest 9.2 stores node ids in
    a form pytest-xdist 3.8 no longer rewrites, and grouping then stops without an error
    (pytest-dev/pytest-xdist#1386): this fails on such a pair, the pin in pyproject avoids it."""
    (tmp_path / "test_grouped.py").write_text(
        "import pytest\n"
        + "".join(f"@pytest.mark.xdist_group('g')\ndef test_g{i}(): pass\n" for i in range(4))
        + "".join(f"def test_free{i}(): pass\n" for i in range(4)))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup",
                           "-v", "-p", "no:cacheprovider", "test_grouped.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = {line.split()[0] for line in proc.stdout.splitlines() if "::test_g" in line
               and "PASSED" in line}
    assert len(workers) == 1, f"one group ran on {sorted(workers)}:\n{proc.stdout[-1500:]}"
