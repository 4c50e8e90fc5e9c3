"""Every test module imports with the runtime dependencies alone: a GPU machine has torch,
numpy, pandas, matplotlib and pytest, but none of the dev extras (nbformat, nbclient,
ipykernel, ruff, pytest-xdist). One module that needs them at import stops `pytest -m gpu` there."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

DEV_ONLY = ("nbformat", "nbclient", "ipykernel", "ruff", "xdist")

# A child interpreter where the dev extras cannot be imported, collecting the whole suite.
COLLECT_WITHOUT_DEV_EXTRAS = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {DEV_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (dev extra, refused)")
        return None
sys.meta_path.insert(0, Refuse())
import pytest
# pytest-xdist, installed here, is a plugin pytest would load: kept out as it is there
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                      "-p", "no:xdist.looponfail", "tests"]))
"""


def test_every_module_collects_without_the_dev_extras():
    proc = subprocess.run([sys.executable, "-c", COLLECT_WITHOUT_DEV_EXTRAS], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error" not in proc.stdout.splitlines()[-1].lower(), proc.stdout[-3000:]
    # The refusal really happened: the notebook module was skipped for it, not collected.
    assert "tests/test_notebook.py::" not in proc.stdout, proc.stdout[-3000:]
    assert "nbformat" in proc.stdout and "(dev extra, refused)" in proc.stdout
