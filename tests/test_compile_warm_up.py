"""A --compile warm-up is one long call in each rank, and the rank that compiled first waits
in the backward's collectives for the last: it must read as alive to the launcher's watchdog
for as long as the stated compile limit, and no longer; and the process group's collectives
may wait that long where ranks compile, never elsewhere. And what a compiled DDP run prints:
none of torch's spurious warnings about a 1x1 kernel's gradient strides."""

from __future__ import annotations

import re
import threading
import time

from conftest import USER_MODELS, assert_ok, run_bench

from bench.config.run_config import COMPILE_LIMIT_S, RunConfig, group_timeout
from bench.launch.job import Launch, RunTimeout
from bench.train.rank import SPURIOUS_STRIDES
from bench.train.scratch import Heartbeat, Scratch


def _watch(scratch: Scratch, timeout: float) -> Launch:
    return Launch(spec_path=scratch.spec, nprocs=1, port=0, threads=1, scratch=scratch,
                  timeout=timeout)


def test_a_rank_beats_through_a_long_call_until_the_limit_and_then_stops():
    scratch = Scratch.create("compile-test")
    try:
        heartbeat = Heartbeat(scratch)
        heartbeat.bind(0)
        watchdog = _watch(scratch, timeout=1.5)
        stale_seen: list[str] = []
        phases: list[str] = []

        def long_call() -> None:  # 6 s without returning, as a compile is
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                try:
                    watchdog.check_progress()
                except RunTimeout as exc:
                    stale_seen.append((round(time.monotonic() - started, 1), str(exc)))
                phases.append(scratch.last_phase(0))
                time.sleep(0.25)

        started = time.monotonic()
        with heartbeat.through("compile", limit=3.0):
            long_call()
        # alive while the limit lasted (beats every second, the watchdog's limit 1.5 s) ...
        assert not [t for t, _ in stale_seen if t < 3.0], stale_seen
        assert "compile (2 s of at most 3)" in phases, phases
        # ... then no more beats: past the limit plus the watchdog's own, the run is ended
        assert [t for t, _ in stale_seen if t >= 5.0], stale_seen
        assert "[in compile (" in stale_seen[-1][1]
        assert not [t for t in threading.enumerate() if t.name == "bench-beat"]
    finally:
        scratch.remove()


def test_the_group_waits_the_compile_limit_only_where_ranks_compile():
    assert group_timeout(300, compile_=True, processes=2) == COMPILE_LIMIT_S
    assert group_timeout(300, compile_=False, processes=2) == 300
    assert group_timeout(300, compile_=True, processes=1) == 300
    assert group_timeout(3600, compile_=True, processes=2) == 3600
    from bench.launch.plan import RunPlan

    plan = RunPlan(RunConfig("ddp", gpus=2, cpu=True, compile=True, data="synthetic",
                             train_limit=64, batch_size=16), probe_output=False)
    assert plan.topology.timeout == COMPILE_LIMIT_S


_STRIDES = ("Grad strides do not match bucket view strides. This may indicate grad was not "
            "created according to the gradient layout contract, or that the param's strides "
            "changed since DDP was constructed.  This is not an error, but may impair "
            "performance.\ngrad.sizes() = {}, strides() = {}\nbucket_view.sizes() = {}, "
            "strides() = {} (Triggered internally at reducer.cpp:335.)")


def test_a_compiled_ddp_run_prints_no_spurious_stride_warning_and_keeps_real_ones(tmp_path):
    """A compiled backward gives a 1x1 shortcut convolution's gradient other strides over its
    two size-1 dims than DDP's bucket view (the same memory): every rank printed torch's
    four-line warning. It is gone; a mismatch of real dims (transposed, or a 5x5 kernel's, as
    users have reported them) would still show."""
    proc = run_bench("run", "--strategy", "ddp", "--gpus", "2", "--cpu", "--compile",
                     "--model", "user_models:shortcut_cnn", "--data", "synthetic",
                     "--train-limit", "128", "--test-limit", "32", "--batch-size", "32",
                     "--epochs", "2", "--comm-probe-steps", "0", "--output",
                     str(tmp_path), env=USER_MODELS, timeout=600)
    assert_ok(proc)
    # the compile is said before it starts (it took 40 s here with no word) and when done
    said = " ".join(proc.stderr.split())
    compiling = said.find("[ddp] compiling the model on one batch (--compile default)")
    compiled = re.search(r"\[ddp\] compiled in \d+ s", said)
    assert 0 <= compiling < compiled.start() < said.find("[ddp] about "), said
    assert "Grad strides" not in proc.stdout + proc.stderr, proc.stderr
    # nor torch's two notes of no consequence: Dynamo dropping DDP's profiler label, and
    # Inductor's C++ build on CPU naming the CUDA toolkit it does not use. No rank logs a
    # warning at all.
    assert "Profiler record function" not in proc.stderr, proc.stderr
    assert "No CUDA runtime is found" not in proc.stderr, proc.stderr
    assert not re.search(r"^\[rank\d+\]:W\d{4}", proc.stderr, re.M), proc.stderr
    spurious = re.compile(SPURIOUS_STRIDES, re.I)
    assert spurious.match(_STRIDES.format("[64, 32, 1, 1]", "[32, 1, 32, 32]",
                                          "[64, 32, 1, 1]", "[32, 1, 1, 1]"))
    for real in (("[64, 32, 1, 1]", "[1, 64, 1, 1]", "[64, 32, 1, 1]", "[32, 1, 1, 1]"),
                 ("[768, 1, 5, 5]", "[25, 1, 5, 1]", "[768, 1, 5, 5]", "[25, 25, 5, 1]"),
                 ("[1, 64]", "[1, 1]", "[1, 64]", "[64, 1]")):
        assert not spurious.match(_STRIDES.format(*real)), real
