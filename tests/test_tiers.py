"""tests/tiers.py, which splits the suite into `make test` and `make test-long`, names only
tests that exist, leaves `make test` a test in every file, and leaves it most of them."""

from __future__ import annotations

import re
import subprocess
import sys

import tiers
from conftest import ROOT
from tiers import FIRST, FIRST_PATTERNS, HEAVY, LONG, PATTERNS, first_rank, is_long


def collected(*args: str) -> list[str]:
    """The node ids pytest collects from the suite with ``args``."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_every_entry_names_a_test_and_each_file_keeps_one_in_make_test():
    everything = collected()
    unmatched = [p for p, c in zip(LONG, PATTERNS) if not any(c.search(t) for t in everything)]
    assert not unmatched, f"tests/tiers.py names no test: {unmatched}"
    unmatched = [p for p, c in zip(HEAVY, tiers.HEAVY_PATTERNS)
                 if not any(c.search(t) and is_long(t) for t in everything)]
    assert not unmatched, f"tests/tiers.py's HEAVY names no long test: {unmatched}"
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


def test_the_long_tiers_shares_split_it_and_leave_the_gate_whole():
    """CI runs the gate and one share of the long tier (`--long-share K/N`): the shares must
    hold every long test once between them, each share the whole gate, and the largest
    tests must not meet in one share. (The files of the four largest: each collection of
    the suite imports torch, and the whole suite's took 7 s.)"""
    files = ["tests/test_fit.py", "tests/test_parity.py", "tests/test_project.py",
             "tests/test_testbed.py"]
    shares = [set(collected("--long-share", f"{k}/2", *files)) for k in (1, 2)]
    everything = shares[0] | shares[1]
    gate = {t for t in everything if not is_long(t)}
    for share in shares:
        assert gate <= share, sorted(gate - share)[:5]
    first, second = (share - gate for share in shares)
    assert first and second and not first & second, sorted(first & second)[:5]
    largest = sorted(HEAVY, key=HEAVY.get, reverse=True)[:4]
    heavy = [next(t for t in everything if re.search(p, t)) for p in largest]
    # as collected: the two largest in the two shares of 2, one each
    assert (heavy[0] in first) != (heavy[1] in first), (heavy[:2], sorted(first))
    assert len({tiers.long_share(t) for t in heavy}) == 4, heavy
