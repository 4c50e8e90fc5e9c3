"""What ``bench run`` prints of a run: what starts and where its record goes; and the line
when it ends ok: its pace, the GPUs' clocks and energy, top-1 and the target, and, where the
loader set the pace, the ``bench loader`` line that finds a worker count that feeds faster."""

from __future__ import annotations

import platform
import shlex
import sys
from typing import TYPE_CHECKING

from bench.config.options import run_parser
from bench.records.describe import input_bound, shared_cores
from bench.records.run_record import RunRecord
from bench.tools import terminal
from bench.tools.cores import usable_cores
from bench.tools.errors import ConfigError

if TYPE_CHECKING:
    from bench.launch.plan import RunPlan


def print_start(plan: RunPlan, record: RunRecord) -> None:
    """Say what starts, and where the record goes; note CPU processes beyond the cores."""
    cfg = plan.cfg
    where = f" x {cfg.nodes} nodes" if cfg.nodes > 1 else ""
    # over torchrun's nodes, the one whose agent the rendezvous makes global rank 0 writes the
    # record (not --node-rank 0's), and the others end 'the record was written on the node
    # that hosted global rank 0'; of Slurm's tasks, task 0. (The path last and whole.)
    if plan.slurm is not None:
        whose = "" if plan.writes_record else " (Slurm task 0 writes it)"
    elif cfg.nodes > 1:
        whose = " (if this node hosts global rank 0: the rendezvous decides)"
    else:
        whose = ""
    print(
        f"bench: {cfg.strategy} on {terminal.count(plan.replicas, plan.device_type + ' replica')}, "
        f"{terminal.count(plan.processes, 'process', 'processes')} here{where}, "
        f"launcher {plan.launcher}\n"
        f"bench: record{whose} {plan.record_path}"
        # --mllog's FILE with {run_id} replaced: the name the user could not know
        + (f"\nbench: MLPerf log{whose} {cfg.mllog}" if cfg.mllog else ""),
        flush=True,
    )
    fewer = plan.strategy.fewer_replicas(plan.topology)
    if fewer and cfg.verify_steps is None:  # (bench verify's row says its replicas)
        _note(fewer)  # 'dp on 1 cpu replica' after --gpus 2 said nothing of why
    if said := target_note(cfg.target_top1):
        _note(said)
    if plan.precision_note:
        _note(plan.precision_note)
    if plan.workers_per_process and forks_can_deadlock():
        _note(f"Python {platform.python_version()} can deadlock a DataLoader worker as it "
              "forks (CPython gh-112275, fixed in 3.11.10 and 3.12): such a run fails after "
              "--timeout")
    usable = usable_cores()
    if plan.workers_per_process > usable:  # torch's DataLoader warns above this, per rank
        _note(f"{plan.workers_per_process} loader workers a process, on "
              f"{terminal.count(usable, 'core')} this process may use: they compete with "
              "its training for them")
    # the cores the ranks may use, not the machine's: 2 ranks pinned to one core (taskset, a
    # Slurm task's cpuset) or under a 1-core quota crowd it as 2 ranks on 1 machine core do
    if plan.device_type == "cpu" and plan.local_processes > usable:
        _note(f"{plan.local_processes} CPU processes on {terminal.count(usable, 'core')} "
              "compete for them: this run's times say little about scaling")
        if plan.writes_record:
            record.data["oversubscribed"] = {"processes": plan.local_processes, "cores": usable}
            record.write()


def _note(text: str) -> None:
    """A note of bench's on stderr, within the terminal's width (``terminal.columns``)."""
    print(terminal.fill(f"bench: note: {text}", subsequent_indent="  "), file=sys.stderr)


def target_note(target: float | None) -> str | None:
    """What a --target-top1 under 1 is, since it reads as a fraction: MLPerf writes its
    targets so (ResNet-50's 0.759), and here that is 0.759 % top-1, reached at once."""
    if target is None or target >= 1:
        return None
    return (f"--target-top1 {target:g} is {target:g} % top-1 (a percent: {100 * target:g} for "
            f"{target:g} of the test images)")


def forks_can_deadlock(version: tuple[int, ...] = sys.version_info[:3]) -> bool:
    """Whether this CPython's forked child can hang at its start for good: another thread
    held the runtime's thread-state lock at the fork (gh-112275), as a rank's loader worker
    once did here, on 3.11.7. Fixed in 3.12 and backported in September 2024 (3.9.20,
    3.11.10; 3.10.15 assumed from the same backports)."""
    fixed = {(3, 9): 20, (3, 10): 15, (3, 11): 10}
    return version[:2] in fixed and version[2] < fixed[version[:2]]


def print_ok(final: RunRecord, loader: str, workers_per_replica: int) -> None:
    print(ok_line(final.summary, final.data))
    trace = final.data.get("profile_trace")
    if trace:  # asked for with --profile-steps, and where it went was the record's alone
        print(f"bench: trace of {final.data.get('profile_steps')} steps after the epochs (rank "
              f"0's; Perfetto, TensorBoard) {trace}")
    restarts = final.data.get("restarts") or 0
    if restarts:
        _note(f"torchrun restarted the ranks {restarts}x after a rank failed (said above): "
              "the figures are the last attempt's")
    shared = shared_cores(final.data)
    if shared is not None:
        _note(f"{shared.said()} (means over its timed epochs): its times are slower than "
              "this machine alone gives")
    feed = final.data.get("loader_alone_images_per_s")
    if input_bound(final.summary.get("median_images_per_s"), feed) and loader == "torch":
        print("bench: the loader set the pace; which worker count feeds faster:\n  "
              + loader_sweep_command(final.data["command"], workers_per_replica))


def ok_line(summary: dict, data: dict) -> str:
    """The line a run that ended ok prints, broken into lines of at most 120 columns
    between its parts, never inside one (a GPU run that reached its target, with its
    clocks, energy and an input-bound note, held 210 on one line)."""
    median, speed = summary.get("median_epoch_time_s"), summary.get("median_images_per_s")
    timing = (f"median epoch {median:.2f}s  {speed:.0f} img/s" if median is not None
              else "no timed epoch (the only epoch is the warm-up)")
    share = summary.get("gpu_clock_share")
    clock = f"  GPU clock {100 * share:.0f} % of max" if share is not None else ""
    if summary.get("gpu_slowdowns"):
        clock += f" ({', '.join(summary['gpu_slowdowns'])})"
    if summary.get("images_per_joule"):
        clock += f"  {summary['images_per_joule']:.1f} img/J"
    feed = data.get("loader_alone_images_per_s")
    if input_bound(speed, feed):
        clock += f"  input-bound (the loader alone: {feed:.0f} img/s)"
    head, *parts = (f"bench: ok  {timing}{clock}  final top1 "
                    f"{100 * summary.get('final_top1', float('nan')):.2f}%"
                    f"{_target_outcome(data)}").split("  ")
    return "\n".join(terminal.pack(head, parts, separator="  ", indent="    "))


# The bench run options that shape the input pipeline (a loader sweep takes them all; the
# rest would only lengthen the line)
_PIPELINE_OPTIONS = {"--strategy", "--gpus", "--cpu", "--data", "--data-dir", "--no-download",
                     "--synthetic-difficulty", "--synthetic-classes", "--image-size",
                     "--train-limit", "--loader", "--batch-size", "--grad-accum", "--seed",
                     "--model", "--channels-last", "--backend", "--no-slurm"}


def loader_sweep_command(command: list[str], workers: int) -> str:
    """The ``bench loader`` line that measures this run's input pipeline at its worker count
    and at 2x and 4x it (``command``: the record's ``bench run ...``)."""
    parser = run_parser()  # its errors raise ConfigError instead of exiting
    args: list[str] = []
    try:
        given, _ = parser.parse_known_args(command[2:])
    except ConfigError:  # not a command line bench run wrote: no options to repeat
        given = None
    for action in parser._actions if given is not None else []:
        flag = action.option_strings[0]
        value = getattr(given, action.dest)
        if flag in _PIPELINE_OPTIONS and value != action.default:
            args += [flag] if action.nargs == 0 else [flag, str(value)]
    counts = sorted({workers, max(1, 2 * workers), max(2, 4 * workers)})
    return shlex.join(["bench", "loader", *args, "--workers", ",".join(map(str, counts))])


def _target_outcome(record: dict) -> str:
    """'  90 % reached in 41.2 s (3 epochs)', or that it was not; empty without a target."""
    target = record.get("target_top1")
    if target is None:
        return ""
    if not record.get("reached_target"):
        return f"  {target:g} % not reached"
    epochs = record["epochs_to_target"]
    return (f"  {target:g} % reached in {record['time_to_target_s']:.1f} s "
            f"({epochs} epoch{'s' if epochs > 1 else ''})")
