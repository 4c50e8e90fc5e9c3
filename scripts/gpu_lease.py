"""One call of a 15-minute GPU lease: the GPU check's items that matter most, ordered and
sized to fit, and what comes back packed as a call returns files.

A lease is 900 s of device time in all: the machine's start and the transfers (~120 s), then
commands of at most 600 s each, and no second machine starts with under 240 s left. So the
whole check is one command, planned here; what does not fit is listed as deferred, never cut
off half-run. Three stages, in this order:

- build: Horovod (NCCL) and apex 25.05 side by side, from ``--deps`` (seconds where
  ``make gpu-ready`` built their wheels beforehand; minutes otherwise);
- checks: ``pytest -m gpu`` and the correctness items that never passed on a GPU, in lanes
  side by side (each is one small, launch-bound run: none of their timings is a figure);
- timed: the table's rows one after another, the GPU otherwise idle, most wanted first.

    python3 scripts/gpu_lease.py --plan [--deps DIR] [--budget S]     the stages and the fit
    python3 scripts/gpu_lease.py [--deps DIR] [--budget S] WORKDIR BACK
    python3 scripts/gpu_lease.py --cpu [--only REGEX] WORKDIR BACK    on CPU at tiny sizes

BACK (the call's $OUT) receives at most 8 files, none over 16 MiB: summary.txt (every item's
line, stage by stage), check.tar.gz (WORKDIR's logs, records and state, without the installed
packages), traces.tar.gz (the profiler traces, when they fit) and, on a GPU, nvidia-smi.txt.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "gpu_check.sh"

LEASE_S = 900  # device time per lease, start and idle included
START_S = 120  # a fresh machine's start and the transfers (90 to 120 s seen)
CALL_LIMIT_S = 600  # one command
RESTART_FLOOR_S = 240  # no machine starts with less left
BUDGET_S = 545  # the stages' own time: with the grace, a kill and the packing, under 600 s
GRACE_S = 20  # an item still running at its stage's end is killed this much later
CACHED_BUILD_S = 15  # a build item that installs its built wheel (apex's took 10 s on the H100)
SIDE_BY_SIDE = 1.3  # items in lanes take longer than alone (first check: 24-41 s against 25-30)
BACK_FILES, BACK_FILE_BYTES = 8, 16 * 2**20

BUILD = ("build_horovod", "build_apex")
OWN_LANE = ("pytest_gpu",)  # 4 xdist workers of its own
# Never passed on a GPU, most wanted first (bench verify on CUDA, Horovod, the 2-rank paths,
# the profiler trace whose breakdown the report shows, bench probe's contention on CUDA,
# then the variants phase).
CHECKS = ("verify", "n1_horovod", "n1_ddp-zero", "n2_ddp-amp", "profile_trace",
          "probe_contention", "hook_powersgd_n2", "selftest_hook_fp16", "fsdp_bf16",
          "fsdp_fp16", "fsdp_no_reshard", "hook_fp16", "hook_powersgd", "hook_fp16_apex_torch",
          "zero_bf16", "model_resnet50", "model_user")
AFTER_CHECKS = ("variants_report",)  # reads every check's record
# The table's rows, one group at a time. The first at the default workers (comparable with
# the committed rows): Horovod's missing row, the fastest path with its clocks, and with CUDA
# graphs. The second measures the input pipeline, then bf16 with the DataLoader at the count
# it picks (input-bound at 4?). Last, what time is left for: fsdp with its clocks (its step
# times drifted), the throughput benchmark.
TIMED = (
    (("table_horovod", "table_fastest", "table_fastest_graphs"), ""),
    (("table_loader_sweep", "table_ddp-amp_bf16", "table_report"), "auto"),
    (("table_fsdp", "throughput"), ""),
)


@dataclass
class Group:
    """One gpu_check.sh command: its items (run in the script's order) and TABLE_WORKERS."""
    name: str
    items: tuple[str, ...]
    workers: str = ""

    def regex(self) -> str:
        return "^(" + "|".join(re.escape(i) for i in self.items) + ")$"


def estimates(cpu: bool) -> dict[str, int]:
    """Seconds per item as gpu_check.sh --plan states them (measured on an H100, or its
    estimates); only the items that exist in that mode."""
    plan = subprocess.run(["bash", str(CHECK), *(["--cpu"] if cpu else []), "--plan",
                           "--phase", "all"], capture_output=True, text=True, cwd=ROOT)
    if plan.returncode != 0:
        sys.exit(f"gpu_lease: gpu_check.sh --plan failed: {plan.stderr.strip()}")
    found = re.findall(r"^\S+\s+(\S+)\s+~\s*(\d+)s$", plan.stdout, re.M)
    return {name: int(secs) for name, secs in found}


def lanes(items: list[str], cost: dict[str, int], count: int) -> list[list[str]]:
    """Items in priority order, each to the lane with the least work so far."""
    loads, out = [0] * count, [[] for _ in range(count)]
    for item in items:
        k = loads.index(min(loads))
        out[k].append(item)
        loads[k] += cost[item]
    return [lane for lane in out if lane]


@dataclass
class Plan:
    build: list[Group]
    checks: list[Group]
    after: Group | None
    timed: list[Group]
    cost: dict[str, int]

    def seconds(self, group: Group, side_by_side: bool = False) -> int:
        factor = SIDE_BY_SIDE if side_by_side else 1.0
        return round(factor * sum(self.cost[i] for i in group.items))

    def reserve(self) -> int:
        """What the checks leave before the budget's end: the reports' and the first timed
        group's time."""
        return (sum(self.seconds(g) for g in self.timed[:1])
                + (self.seconds(self.after) if self.after else 0))


def make_plan(cost: dict[str, int], lane_count: int, only: str | None) -> Plan:
    def keep(names, script_order: bool = False) -> tuple[str, ...]:
        kept = [n for n in names if n in cost and (only is None or re.search(only, n))]
        order = list(cost)  # gpu_check.sh runs a command's items in its own order
        return tuple(sorted(kept, key=order.index) if script_order else kept)

    build = [Group(n, (n,)) for n in keep(BUILD)]
    checks = [Group("pytest", keep(OWN_LANE))] if keep(OWN_LANE) else []
    checks += [Group(f"lane {k + 1}", keep(lane, script_order=True))
               for k, lane in enumerate(lanes(list(keep(CHECKS)), cost, lane_count))]
    after = Group("reports", keep(AFTER_CHECKS)) if keep(AFTER_CHECKS) else None
    timed = [Group(f"timed {k + 1}", keep(items, script_order=True), workers)
             for k, (items, workers) in enumerate(TIMED) if keep(items)]
    return Plan(build, checks, after, timed, cost)


def expected_deferrals(plan: Plan, budget: int, build: int) -> tuple[set[str], int]:
    """Which items the budget would defer if every item took its estimate (items in lanes
    x SIDE_BY_SIDE), as the run decides: the checks end where the first timed group's and
    the reports' time begins. Returns them and the seconds the stages would take."""
    deferred: set[str] = set()

    def run(items, t: float, deadline: float, factor: float = 1.0) -> float:
        for item in items:
            if t + factor * plan.cost[item] > deadline:
                deferred.add(item)
            else:
                t += factor * plan.cost[item]
        return t

    deadline = max(build, budget - plan.reserve())
    factor = SIDE_BY_SIDE if len(plan.checks) > 1 else 1.0
    t = max([run(g.items, build, deadline, factor) for g in plan.checks], default=build)
    for group in ([plan.after] if plan.after else []) + plan.timed:
        t = run(group.items, t, budget)
    return deferred, round(t)


def built_wheels(deps: Path | None, item: str) -> list[str]:
    """The keys (torch, mode, architectures) of the wheels ``make gpu-wheels`` built for a
    build item, which it installs instead of compiling where its key matches."""
    if deps is None:
        return []
    tool = item.removeprefix("build_")
    return sorted(w.parent.name for w in (deps / "built" / tool).glob("*/*.whl"))


def say(line: str) -> None:
    """One line of the plan, wrapped at 120 columns (what follows indented)."""
    print(textwrap.fill(line, width=120, subsequent_indent=" " * 17, break_on_hyphens=False))


def print_plan(plan: Plan, budget: int, deps: Path | None) -> None:
    build, said = 0, []
    for group in plan.build:
        keys = built_wheels(deps, group.items[0])
        build = max(build, CACHED_BUILD_S if keys else plan.seconds(group))
        said.append(f"{group.items[0]} ({'wheel ' + ', '.join(keys) if keys else 'compiled'})")
    deferred, stages = expected_deferrals(plan, budget, build)

    def names(items) -> str:
        return " ".join(f"({i})" if i in deferred else i for i in items)

    say(f"gpu lease plan: one call; seconds from gpu_check.sh --plan (H100), items side by "
        f"side x{SIDE_BY_SIDE}; (item): deferred by the {budget}s budget at these estimates")
    if plan.build:
        say(f"build   ~{build:4d}s  side by side: {'; '.join(said)}"
            + ("  (make gpu-ready builds the wheels here first)" if "compiled" in str(said)
               else ""))
    for g in plan.checks:
        say(f"checks  ~{plan.seconds(g, len(plan.checks) > 1):4d}s  {g.name}: {names(g.items)}")
    if plan.after:
        say(f"checks  ~{plan.seconds(plan.after):4d}s  then: {names(plan.after.items)}")
    for g in plan.timed:
        workers = f" (TABLE_WORKERS={g.workers})" if g.workers else ""
        say(f"timed   ~{plan.seconds(g):4d}s  {g.name}{workers}: {names(g.items)}")
    call = stages + GRACE_S + 10  # an overrunning item's grace, then packing
    left = LEASE_S - START_S - call
    say(f"the stages ~{stages}s of the {budget}s budget; the call ~{call}s (limit "
        f"{CALL_LIMIT_S}s); the lease ~{START_S + call}s of {LEASE_S}s with the start, "
        f"~{left}s left: " + ("too little for another machine, give it back"
                              if left < RESTART_FLOOR_S else "enough to rerun on it"))


def run_check(group: Group, args, budget: int, log: Path) -> subprocess.Popen:
    cmd = ["bash", str(CHECK), *(["--cpu"] if args.cpu else []),
           *(["--deps", str(args.deps)] if args.deps else []), "--phase", "all",
           "--items", group.regex(), "--budget", str(max(budget, 1)), str(args.workdir)]
    env = {**os.environ, "TABLE_WORKERS": group.workers, "CHECK_GRACE": str(GRACE_S)}
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT)


def run_stage(title: str, groups: list[Group], args, deadline: float, side_by_side: bool,
              logs: list[tuple[str, Path]]) -> None:
    """The groups of one stage: side by side, or one after another, each told how many
    seconds remain before ``deadline``."""
    if not groups:
        return
    print(f"== {title} ({'side by side' if side_by_side else 'one at a time'}, "
          f"{max(0, deadline - time.monotonic()):.0f}s left)", flush=True)
    pending = []
    for group in groups:
        log = args.workdir / "lease" / f"{len(logs) + 1:02d}-{group.name.replace(' ', '-')}.txt"
        logs.append((f"{title}: {group.name}", log))
        proc = run_check(group, args, round(deadline - time.monotonic()), log)
        if side_by_side:
            pending.append((log, proc))
        else:
            proc.wait()
            print_lines(log)
    for log, proc in pending:
        proc.wait()
        print_lines(log)


def item_lines(log: Path) -> list[str]:
    """What gpu_check.sh said of each item (pass / FAIL / skip / defer / done), and the
    lines it quoted from a failed item's log."""
    if not log.exists():
        return []
    keep = re.compile(r"^(pass|FAIL|skip|defer|done) |^      \| |^(loader alone|table workers)")
    return [line for line in log.read_text(errors="replace").splitlines() if keep.match(line)]


def print_lines(log: Path) -> None:
    for line in item_lines(log):
        print(f"  {line}", flush=True)


def machine_note(cpu: bool) -> str:
    if cpu:
        return ""
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi: {e}\n"
    return smi + "\n" + topo


def pack(workdir: Path, back: Path, summary: str, machine: str) -> list[str]:
    """Write what comes back into ``back``: at most BACK_FILES files, each under
    BACK_FILE_BYTES. Returns the notes on what was left out."""
    back.mkdir(parents=True, exist_ok=True)
    notes = []
    traces = sorted(p for p in workdir.rglob("*.trace.json") if p.is_file())
    installed = workdir / "site"

    def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        path = workdir.parent / info.name
        return None if path == installed or path in traces else info

    check = back / "check.tar.gz"
    with tarfile.open(check, "w:gz") as tar:
        tar.add(workdir, arcname=workdir.name, filter=skip)
    if check.stat().st_size > BACK_FILE_BYTES:
        notes.append(f"check.tar.gz is {check.stat().st_size / 2**20:.1f} MiB: over what a "
                     f"call returns, so it holds the summaries and records only")
        with tarfile.open(check, "w:gz") as tar:
            for path in sorted(workdir.rglob("*")):
                if path.is_file() and (path.suffix in (".txt", ".json") and path not in traces
                                       and installed not in path.parents):
                    tar.add(path, arcname=str(path.relative_to(workdir.parent)))
    if traces:
        packed = back / "traces.tar.gz"
        with tarfile.open(packed, "w:gz") as tar:
            for trace in traces:
                tar.add(trace, arcname=str(trace.relative_to(workdir.parent)))
        if packed.stat().st_size > BACK_FILE_BYTES:
            notes.append(f"traces.tar.gz left out: {packed.stat().st_size / 2**20:.1f} MiB "
                         f"of traces ({len(traces)}); their breakdowns are in the records")
            packed.unlink()
    if machine:
        (back / "nvidia-smi.txt").write_text(machine)
    (back / "summary.txt").write_text(summary + "".join(f"note: {n}\n" for n in notes))
    return notes


def lease_summary(logs: list[tuple[str, Path]], begun: float, budget: int) -> str:
    took = time.monotonic() - begun
    parts = [f"gpu lease {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: "
             f"{took:.0f}s of a {budget}s budget\n"]
    for title, log in logs:
        text = log.read_text(errors="replace") if log.exists() else "(no output)\n"
        parts.append(f"\n## {title}\n{text}")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="print the stages and the fit")
    parser.add_argument("--cpu", action="store_true", help="the same items on CPU (tests)")
    parser.add_argument("--deps", type=Path, help="what make gpu-ready filled (.cache/gpu-deps)")
    parser.add_argument("--budget", type=int, default=BUDGET_S,
                        help=f"seconds for the stages (default {BUDGET_S})")
    parser.add_argument("--lanes", type=int, default=4, help="check lanes side by side")
    parser.add_argument("--only", help="only the items whose names match (tests)")
    parser.add_argument("workdir", type=Path, nargs="?")
    parser.add_argument("back", type=Path, nargs="?", help="where the files to return go")
    args = parser.parse_args(argv)
    if args.deps is not None:
        args.deps = args.deps.resolve()
        if not args.deps.is_dir():
            parser.error(f"--deps {args.deps} is not a folder: make gpu-ready fills one")
    if args.budget < 1 or args.lanes < 1:
        parser.error("--budget and --lanes take positive whole numbers")
    plan = make_plan(estimates(args.cpu), args.lanes, args.only)
    if args.plan:
        print_plan(plan, args.budget, args.deps)
        return 0
    if args.workdir is None or args.back is None:
        parser.error("give WORKDIR and BACK (e.g. /tmp/check $OUT), or --plan")
    args.workdir = args.workdir.resolve()
    (args.workdir / "lease").mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    end = begun + args.budget
    machine = machine_note(args.cpu)
    logs: list[tuple[str, Path]] = []
    stages = [("build", plan.build, lambda: end, True),
              ("checks", plan.checks, lambda: max(time.monotonic(), end - plan.reserve()), True),
              ("checks", [plan.after] if plan.after else [], lambda: end, False),
              ("timed", plan.timed, lambda: end, False)]
    try:
        for title, groups, deadline, side_by_side in stages:
            if logs:  # what the stages before did, packed: a call killed at its limit returns it
                pack(args.workdir, args.back, lease_summary(logs, begun, args.budget), machine)
            run_stage(title, groups, args, deadline(), side_by_side, logs)
    finally:
        took = time.monotonic() - begun
        notes = pack(args.workdir, args.back, lease_summary(logs, begun, args.budget), machine)
        for note in notes:
            print(f"note: {note}")
    lines = [line for _, log in logs for line in item_lines(log)]
    counts = {k: sum(line.startswith(k) for line in lines)
              for k in ("pass", "FAIL", "skip", "defer", "done")}
    print(f"gpu lease: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} "
          f"skipped, {counts['defer']} deferred, {counts['done']} passed earlier; {took:.0f}s; "
          f"files in {args.back}: {', '.join(sorted(p.name for p in args.back.iterdir()))}")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
