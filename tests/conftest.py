"""Shared fixtures: a small dataset in the exact cifar-100-python format, and a helper that
runs the real ``bench`` command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.data import synthetic_split, write_cifar100_format

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_TRAIN = 256
FIXTURE_TEST = 10
# A narrow ResNet-18 keeps most tests fast; test_full_width.py trains the real one.
FAST = ["--width", "0.125", "--batch-size", "32", "--no-progress"]


@pytest.fixture(scope="session")
def cifar_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    write_cifar100_format(
        root,
        synthetic_split("train", FIXTURE_TRAIN, seed=7),
        synthetic_split("test", FIXTURE_TEST, seed=7),
    )
    return root


def run_bench(*args: str, timeout: float = 300, env: dict | None = None):
    """Run ``python -m bench ARGS`` for real; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env,
    )


def records(output: Path) -> list[dict]:
    runs = Path(output) / "runs"
    if not runs.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*.json"))]


def only_record(output: Path) -> dict:
    found = records(output)
    assert len(found) == 1, f"expected one record in {output}, found {len(found)}"
    return found[0]


def assert_ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    if _cuda_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
