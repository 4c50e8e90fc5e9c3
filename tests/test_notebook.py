"""The notebook runs top to bottom against the committed results and stores no outputs."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

# Dev extras: a machine with the runtime dependencies alone (a GPU machine) skips this module.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOK = ROOT / "notebooks" / "compare_strategies.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None


def test_notebook_executes_against_committed_results(monkeypatch):
    """As the docs say to run it from the repository (`BENCH_RESULTS=results jupyter execute
    notebooks/...`): the kernel starts in notebooks/, and a relative BENCH_RESULTS once read
    notebooks/results ('0 records'); it is the caller's folder ($PWD) that it names."""
    monkeypatch.setenv("BENCH_RESULTS", "results")
    monkeypatch.setenv("PWD", str(ROOT))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()  # raises CellExecutionError on any failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # the report's plots, a workload at a time
    text = "".join(o.get("text", "") for o in outputs)
    # the answer, as the report gives it: the committed CPU block's verdict (it once drew
    # only numbers, and its own epoch time against N took the median over rows of other
    # options, the accuracy block's crowded times among them)
    flat = " ".join(text.split())
    assert "→ N=2: ddp-amp bf16 is fastest, 1.65× ddp-launch fp32 (next), beyond noise" in flat
    assert "Did not reach the 90 % target" in flat, text
    found = re.search(r"(\d+) records from", text)
    assert found and int(found.group(1)) > 0, text
    # nothing on stderr: the report's figures, all drawn at once, made matplotlib warn
    # "More than 20 figures have been opened" (one workload at a time, they do not)
    said = [o.get("text", "") for o in outputs if o.get("name") == "stderr"]
    assert not said, said


def test_notebook_on_an_empty_folder_says_what_to_do(tmp_path, monkeypatch):
    """It once died with a pandas KeyError on a folder without records."""
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "0 records from" in text and "nothing to show: run `bench run" in text, text
