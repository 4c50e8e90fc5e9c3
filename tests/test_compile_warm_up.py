"""A --compile warm-up is one long call in each rank, and the rank that compiled first waits
in the backward's collectives for the last: it must read as alive to the launcher's watchdog
for as long as the stated compile limit, and no longer; and the process group's collectives
may wait that long where ranks compile, never elsewhere."""

from __future__ import annotations

import threading
import time

from bench.config.run_config import COMPILE_LIMIT_S, RunConfig, group_timeout
from bench.launch.job import Launch, RunTimeout
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
                phases.append(scratch.beat(0).read_text())
                time.sleep(0.25)

        started = time.monotonic()
        with heartbeat.through("compile", limit=3.0):
            long_call()
        # alive while the limit lasted (beats every second, the watchdog's limit 1.5 s) ...
        assert not [t for t, _ in stale_seen if t < 3.0], stale_seen
        assert "compile (2 s of at most 3)" in phases, phases
        # ... then no more beats: past the limit plus the watchdog's own, the run is ended
        assert [t for t, _ in stale_seen if t >= 5.0], stale_seen
        assert "last reported: compile (" in stale_seen[-1][1]
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
