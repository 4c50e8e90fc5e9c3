"""The Makefile's measuring rules on a CPU without bf16 arithmetic: `make demo` left ddp-amp
out there (emulated bf16: 24x slower than fp32), but `make table` and `make parity`, which the
README says reproduce its table, ran it: hours of emulation on an AVX2 CPU. Each rule now
leaves it out, saying so, unless BF16=yes. Read with `make -n` (what each rule would run),
against the CPU's own flags in /proc/cpuinfo."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from make_plans import would_run


def _cpu_has_bf16() -> bool:
    flags = next((line.split(":", 1)[1].split() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                 [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").is_file(),
    reason="reads the bf16 flags of an x86 Linux CPU from /proc/cpuinfo")


@pytest.mark.parametrize("rule", ["demo", "table", "table-repeats", "parity", "parity-d05"])
def test_a_rule_runs_ddp_amp_only_where_the_cpu_has_bf16_or_it_is_asked_for(rule):
    def runs(text: str) -> bool:  # a command that names it, not a line that says so
        return any("ddp-amp" in line for line in text.splitlines()
                   if not line.startswith("echo"))

    said = f"{rule}: ddp-amp left out: this CPU has no bf16 arithmetic"
    plain = would_run(rule)
    if _cpu_has_bf16():
        assert runs(plain) and said not in plain, plain
    else:
        assert not runs(plain) and said in plain, plain
        assert f"make {rule} BF16=yes runs it anyway" in plain
    asked = would_run(rule, "BF16=yes")
    assert runs(asked) and said not in asked, asked
    if rule == "demo":  # its older name still asks
        assert runs(would_run(rule, "DEMO_BF16=yes"))
