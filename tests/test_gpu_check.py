"""scripts/gpu_check.sh's choices that a GPU lease depends on, checked with its CPU mode:
a mistake there costs minutes of a 15-minute lease."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, records

CHECK = ROOT / "scripts" / "gpu_check.sh"


def _check(out, *args, workers: str):
    env = {**os.environ, "TABLE_WORKERS": workers, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(CHECK), "--cpu", *args, str(out)], capture_output=True,
                          text=True, timeout=400, env=env, cwd=ROOT)


def test_table_workers_auto_takes_the_fewest_that_feed_near_the_best(tmp_path):
    """TABLE_WORKERS=auto: the table's rows run at the worker count the loader sweep found
    fastest (the fewest within 10 % of the best), read from the sweep's JSON, so that one
    lease can measure the pipeline and then the table at a count that feeds it."""
    proc = _check(tmp_path, "--phase", "table", "--items", "^table_(loader_sweep|ddp)$",
                  workers="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    points = json.loads((tmp_path / "table_loader_sweep.json").read_text())["points"]
    assert [p["workers_per_replica"] for p in points] == [0, 2]
    said = re.search(r"table workers: (\d+) per replica \(TABLE_WORKERS=auto", proc.stdout)
    assert said, proc.stdout
    chosen = int(said.group(1))
    rate = {p["workers_per_replica"]: p["images_per_s"] for p in points}
    best = max(rate.values())
    assert rate[chosen] >= 0.9 * best
    assert all(rate[w] < 0.9 * best for w in rate if w < chosen)
    (rec,) = records(tmp_path / "table")
    assert rec["strategy"] == "ddp" and rec["workers_per_replica"] == chosen


def test_table_workers_must_be_a_count_or_auto(tmp_path):
    proc = _check(tmp_path, "--phase", "table", workers="eight")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("gpu_check.sh: TABLE_WORKERS is a worker count or auto "
                                   "(got eight)")
    assert not (tmp_path / "state").exists()


def test_an_item_the_cpu_refuses_by_design_is_skipped_with_its_reason(tmp_path):
    """`--cpu` over every phase failed at table_ddp-amp_fp16: fp16 needs CUDA, so the CPU
    refuses it (exit 2) by design. It is skipped there, with the reason, not failed."""
    proc = _check(tmp_path, "--phase", "table", "--items", "^table_ddp-amp_fp16$", workers="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^skip  table_ddp-amp_fp16: --precision fp16 needs CUDA", proc.stdout,
                     re.M), proc.stdout
    assert "0 passed, 0 failed, 1 skipped" in proc.stdout, proc.stdout


# Items whose command is not a bench command (the builds, the GPU tests, a benchmark script)
NOT_BENCH = {"build_horovod", "build_apex", "pytest_gpu", "throughput"}


def _refusal(argv: list[str]) -> str | None:
    """What bench refuses of ``bench ARGV`` before it starts anything (what the command line
    itself refuses before torch loads, then the run configuration of the options a command
    without its own check passes on); None where it accepts it. Devices are not asked
    about: a GPU item is checked here too."""
    import importlib

    from bench.cli import checked_arguments
    from bench.config.options import config_from_args, given, run_options_for
    from bench.tools.errors import ConfigError

    command = importlib.import_module(f"bench.commands.{argv[0]}")
    try:
        _, passed_on = checked_arguments(command, argv)
        if passed_on and not hasattr(command, "check"):
            run_args = [*([] if given(passed_on, "--strategy") else ["--strategy", "ddp"]),
                        *passed_on]
            config_from_args(run_options_for(argv[0], run_args)).validate()
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("mode", [[], ["--cpu"]], ids=["gpu", "cpu"])
def test_every_items_bench_command_is_one_bench_accepts(mode, monkeypatch):
    """A lease's items (table and calibration included, which CI never runs) cannot pass an
    option bench no longer has or refuses: each item's bench command, as the script would run
    it on a GPU or on CPU, is parsed and checked as bench does before it starts a run."""
    proc = subprocess.run(["bash", str(CHECK), *mode, "--commands"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable},
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    items = dict(line.split("\t") for line in proc.stdout.splitlines())
    assert len(items) >= (30 if mode else 50), proc.stdout  # every phase's, not a few
    refused = {}
    for item, command in items.items():
        argv = shlex.split(command)
        starts = [i for i in range(len(argv) - 1) if argv[i:i + 2] == ["-m", "bench"]]
        if not starts:
            assert item.split()[1] in NOT_BENCH, f"{item}: not a bench command: {command}"
            continue
        for word in argv[:starts[0]]:  # `env PYTHONPATH=tests/data:...` (a user's model)
            if word.startswith("PYTHONPATH="):
                for folder in reversed(word.split("=", 1)[1].split(":")):
                    monkeypatch.syspath_prepend(str(ROOT / folder))
        why = _refusal(argv[starts[0] + 2:])
        if why is not None:
            refused[item] = why
    assert not refused, refused
    assert _refusal(["run", "--strategy", "ddp", "--epoch", "2"])  # the check can refuse


@pytest.mark.parametrize("phase, item", [
    ("options", "fastest_path"),  # bf16, the GPU loader, channels_last, fused SGD, compile
    ("variants", "zero_bf16"),  # ZeRO-1 in bf16
    ("variants", "selftest_hook_fp16"),  # the fp16 hook's self-test (10 steps on CPU)
])
def test_the_items_no_other_test_runs_pass_on_cpu(phase, item, tmp_path):
    """The lease's items whose path no other test takes end to end run as the script runs
    them on CPU (at its tiny sizes), each in its phase: the other items repeat runs the
    suite makes (`bash scripts/gpu_check.sh --cpu --phase P DIR` runs them all)."""
    proc = _check(tmp_path, "--phase", phase, "--items", f"^{item}$", workers="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(rf"^pass  {item}\b", proc.stdout, re.M), proc.stdout
    assert f"({phase}): 1 passed, 0 failed, 0 skipped" in proc.stdout, proc.stdout
