"""What a Makefile rule would run (`make -n`), and the bench commands in it: the tests that
hold a committed measurement to the rule that reproduces it read both from here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def would_run(rule: str, *assignments: str) -> str:
    """`make -n RULE` with this interpreter's virtual environment: the commands, not run."""
    venv = Path(sys.executable).parent.parent
    proc = subprocess.run(["make", "-n", rule, f"VENV={venv}", *assignments], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sweeps(rule: str, *assignments: str) -> list[str]:
    """The arguments of each `bench sweep` the rule runs, one string each (a command that
    the Makefile continues over lines is joined; one ends at `&&`, `||` or `;`)."""
    text = would_run(rule, *assignments).replace("\\\n", " ")
    return [" ".join(args.split()) for args in re.findall(r"bench sweep ([^&|;\n]*)", text)]


def without(args: list[str], *names: str) -> list[str]:
    """``args`` less each option in ``names`` and the value after it."""
    kept, skip = [], False
    for arg in args:
        if skip or arg in names:
            skip = not skip
            continue
        kept.append(arg)
    return kept


def as_swept(command: list[str]) -> str:
    """A record's `bench run` command as the sweep that ran it was given it: without the tag,
    seed and folder the sweep adds, --strategy as --strategies."""
    return " ".join("--strategies" if arg == "--strategy" else arg
                    for arg in without(command[2:], "--tag", "--seed", "--output"))
