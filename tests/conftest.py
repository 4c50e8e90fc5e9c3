"""Shared fixtures: a small dataset in the exact cifar-100-python format, and a helper that
runs the real ``bench`` command in a subprocess."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# OpenMP's threads spin while they wait for work (GOMP's default): with two xdist workers on
# two cores, a process of two threads beside any busy one loses most of its time to the
# spinning (one epoch measured 30x slower, 0.44 s alone, 13 s beside one busy process;
# 1.1 s with passive waiting). The tests check what bench does, not how fast it trains, so
# every process they start waits passively; set before torch (and its libgomp) loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# bench's text fills the terminal it is shown on, else COLUMNS, else 120 columns
# (bench.tools.terminal.columns): the tests read it at 120, as a file or a pipe gets it,
# wherever they run. pytest's readline sets COLUMNS (80 here) in the C environment that
# processes started without env= inherit, unseen in os.environ.
os.environ.pop("COLUMNS", None)
os.unsetenv("COLUMNS")


def _pin_xdist_worker() -> None:
    """Give each xdist worker cores of its own, before torch loads: every process a test
    starts inherits them, and bench splits a process's affinity among its ranks' threads.
    Two unpinned workers on 2 cores each ran 2-thread ranks on cores the other was using:
    a 1-rank run of micro-batches took 9.7 s beside another (8.5 CPU-s), 5.0 s (4.2 CPU-s)
    with each on a core of its own. The serial phase runs without xdist, on every core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cores, index, workers = sorted(os.sched_getaffinity(0)), int(worker[2:]), int(count)
    if len(cores) >= workers > 1:  # fewer cores than workers: leave the scheduler to it
        os.sched_setaffinity(0, cores[index % workers::workers])


_pin_xdist_worker()

import numpy as np  # noqa: E402  (after the pinning: torch sizes its thread pool on import)
import pytest  # noqa: E402
import torch  # noqa: E402

from bench.data.image_sets import (  # noqa: E402
    CIFAR100_MEAN,
    CIFAR100_STD,
    synthetic_split,
    write_cifar100_format,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_TRAIN = 256
FIXTURE_TEST = 10
# A narrow ResNet-18 keeps most tests fast; test_full_width.py trains the real one.
# The compute-only probe steps after the epochs are off where a test does not look at them
# (PROBE turns them back on: the tests of exposed communication).
NO_PROBE = ["--comm-probe-steps", "0"]
PROBE = ["--comm-probe-steps", "20"]
FAST = ["--width", "0.125", "--batch-size", "32", "--no-progress", *NO_PROBE]
# The environment a run needs to import tests/data/user_models.py (`--model user_models:X`)
USER_MODELS = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'data'}"}
# tests/data/user_models.py's `held`: a tiny model whose steps wait while a file exists
HELD_MODEL = ["--model", "user_models:held"]


def held_env(env: dict[str, str], hold: Path) -> dict[str, str]:
    """``env`` with tests/data's models importable and `user_models:held` runs held while
    the file ``hold`` exists (a test cancels, kills or claims a run while it trains, then
    removes the file so that every run after it finishes at once)."""
    return {**env, **USER_MODELS, "HOLD_FILE": str(hold)}


# A suite started in the background by a non-interactive shell (`cmd &` in a script: POSIX
# has it ignore SIGINT) hands that on to every bench it starts, and Python then installs no
# Ctrl-C handler at all. The tests that press Ctrl-C need it at its default, as at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _close_figures():
    """Tests that draw figures in their own process close them (matplotlib warns past 20)."""
    yield
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        plt.close("all")


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


def assert_comm_probe(rec: dict, steps: int = 20) -> None:
    """A multi-rank record carries the compute-only probe: its steps (PROBE's 20), a positive
    compute step and a finite exposed-communication share below 1. How far under 0 noise
    takes it depends on the load beside the run (-0.62 with another worker's ranks on the
    same 2 cores), so no lower bound here: the serial test in test_where_time_goes.py checks
    what it means."""
    assert rec["comm_probe_steps"] == steps, rec["comm_probe_note"]
    assert rec["compute_step_s"] > 0
    assert math.isfinite(rec["exposed_comm_fraction"]) and rec["exposed_comm_fraction"] < 1


def messages(stderr: str) -> list[str]:
    """What bench said, one entry a message: a message wrapped to the width begins at the
    margin and goes on in indented lines, joined here with single spaces (where it breaks
    depends on the length of the paths it names: a tmp path one digit longer moved a
    warning's reason onto its next line)."""
    return [" ".join(part.split()) for part in re.split(r"\n(?=\S)", stderr) if part.strip()]


def assert_ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_addoption(parser):
    parser.addoption("--long-share", metavar="K/N", default=None,
                     help="of the long tier, only the K-th of N shares (tests/tiers.py); "
                          "the other tests as the -m expression selects them")


def _long_share(config) -> tuple[int, int] | None:
    """``--long-share K/N`` as (K, N); a malformed one is a usage error, not every test."""
    given = config.getoption("--long-share")
    if given is None:
        return None
    k, _, n = given.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"--long-share {given}: give K/N with 1 <= K <= N, as 2/4")
    return int(k), int(n)


def pytest_collection_modifyitems(config, items):
    from tiers import first_rank, is_long, long_share

    long = pytest.mark.long
    for item in items:  # what `make test` leaves to `make test-long` (tests/tiers.py)
        if is_long(item.nodeid):
            item.add_marker(long)
    share = _long_share(config)
    if share is not None:  # the long tests of the other shares are deselected
        k, n = share
        kept, others = [], []
        for item in items:
            elsewhere = (item.get_closest_marker("long") is not None
                         and long_share(item.nodeid, n) != k)
            (others if elsewhere else kept).append(item)
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = kept
    items.sort(key=lambda item: first_rank(item.nodeid))  # the longest first (tiers.FIRST)
    if _cuda_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a test id "gpu"
            item.add_marker(skip)


def normalise(chw: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR100_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR100_STD).view(3, 1, 1)
    return (chw.float() / 255 - mean) / std


def distinguishable_image() -> np.ndarray:
    """32x32x3 uint8 whose every pad-4 crop and mirror differs from every other: red is the
    row + 1, green the column + 1 (the zero padding is distinct from both)."""
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    img[:, :, 0] = np.arange(1, 33)[:, None]
    img[:, :, 1] = np.arange(1, 33)[None, :]
    img[:, :, 2] = 200
    return img


def crop_candidates(img: np.ndarray) -> tuple[list[tuple[int, int, bool]], torch.Tensor]:
    """Every (top, left, flipped) pad-4 crop of ``img``, normalised, stacked."""
    padded = torch.nn.functional.pad(torch.from_numpy(img).permute(2, 0, 1), (4, 4, 4, 4))
    keys, crops = [], []
    for top in range(9):
        for left in range(9):
            crop = padded[:, top : top + 32, left : left + 32]
            for flipped in (False, True):
                keys.append((top, left, flipped))
                crops.append(normalise(crop.flip(-1) if flipped else crop))
    return keys, torch.stack(crops)


def which_crop(out: torch.Tensor, keys, stack: torch.Tensor) -> tuple[int, int, bool]:
    hits = ((stack - out).abs().amax(dim=(1, 2, 3)) < 1e-4).nonzero().flatten().tolist()
    assert len(hits) == 1, f"expected exactly one matching crop, found {len(hits)}"
    return keys[hits[0]]


def alive(pattern: str) -> list[str]:
    """Processes whose command line contains ``pattern`` (pgrep itself left out)."""
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now, from /proc (the run's own tree, nobody else's)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def still_running(pids: set[int], within: float = 10) -> list[int]:
    """Those of ``pids`` still running (not zombies) after up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    left = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            if "zombie" not in Path(f"/proc/{pid}/status").read_text().lower():
                left.append(pid)
    return left


def bf16_in_cpu_flags() -> bool | None:
    """Whether the kernel lists bf16 arithmetic among this x86 CPU's flags (AVX512-BF16 or
    AMX's bf16); None where /proc/cpuinfo names no x86 flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), None)
    if not flags or "sse2" not in flags:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags
