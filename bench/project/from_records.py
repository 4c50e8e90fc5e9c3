"""`bench project`: each measured strategy at 8 to 4,096 GPUs on paper (bench.project.scaling),
and `--validate`: the same model's prediction of runs that were measured, with its error."""

from __future__ import annotations

import math
import re
from typing import Any

from bench.project.scaling import FSDP_UNITS, RESNET18_BN_LAYERS, Workload
from bench.records.describe import machine, median_step_s, network_crossed
from bench.records.gradient_timeline import GradientTimeline

SLOW_COMM = re.compile(r"SLOW COMMUNICATION INJECTED \(BENCH_SLOW_COMM_MS\): ([0-9.]+) ms")

MAX_GPUS, MAX_GPUS_PER_NODE = 2**20, 1024  # where a projection stops meaning anything
_HALF_BYTES = ("apex-O2", "apex-O3")  # fp16 gradients; torch.amp keeps fp32 gradients


def comm_hook(rec: dict[str, Any]) -> str:
    """The run's ``--ddp-comm-hook`` ("none" without one, or for records before it)."""
    return (rec.get("ddp_options") or {}).get("comm_hook") or "none"  # null: not recorded


def allreduced_bytes(rec: dict[str, Any]) -> int:
    """Bytes one step all-reduces: the gradient in the precision it travels in (fp16 for
    apex O2/O3, Horovod's fp16 compression and DDP's cast hooks), or the elements a
    low-rank compression sends (PowerSGD, as its run recorded them)."""
    compressed = rec.get("compressed_gradient_elements")
    if isinstance(compressed, int) and compressed > 0:
        return 4 * compressed
    half = rec.get("precision") in _HALF_BYTES or (
        rec.get("strategy") == "horovod" and (rec.get("config") or {}).get(
            "hvd_compression") == "fp16") or (
        comm_hook(rec) in ("fp16", "bf16"))
    return ((rec.get("model") or {}).get("parameters") or 0) * (2 if half else 4)


def workload_of(rec: dict[str, Any]) -> Workload | None:
    """What the model needs from a record; None when it lacks the compute step."""
    compute = rec.get("compute_step_s")
    if not isinstance(compute, (int, float)):
        compute = median_step_s(rec) if rec.get("world_size") == 1 else math.nan
    parameters = (rec.get("model") or {}).get("parameters")
    if math.isnan(compute) or not parameters:
        return None
    delay = next((float(m.group(1)) / 1000 for note in rec.get("notes") or []
                  if isinstance(note, str) for m in [SLOW_COMM.search(note)] if m), 0.0)
    layers = (rec.get("model") or {}).get("batchnorm_layers")  # absent in older records
    hook = comm_hook(rec)
    compressing = hook in ("fp16", "bf16", "powersgd")  # each fp32 bucket compressed
    return Workload(
        strategy=rec["strategy"], compute_step_s=float(compute),
        gradient_bytes=allreduced_bytes(rec),
        bucket_bytes=int(((rec.get("ddp_options") or {}).get("bucket_cap_mb") or 25.0) * 2**20),
        grad_accum=rec.get("grad_accum") or 1, syncbn=rec.get("norm") == "syncbn",
        batchnorm_layers=RESNET18_BN_LAYERS if layers is None else layers,
        hook_delay_s=delay, timeline=GradientTimeline.from_record(rec.get("gradient_timeline")),
        parameter_bytes=4 * parameters,
        bucketed_bytes=4 * parameters if compressing else None,
        collectives_per_bucket=3 if hook == "powersgd" else 1,
        hook_work_s=rec.get("hook_work_s") or 0.0,
        blocking_comm=hook == "powersgd" and rec.get("backend") == "gloo",
        reshard_after_forward=(rec.get("ddp_options") or {}).get(
            "reshard_after_forward") is not False,
        # FSDP's units as it recorded them (its "buckets"); records before 2026-11-30: 5
        fsdp_units=len(rec["gradient_buckets"]) if rec["strategy"] == "fsdp" and isinstance(
            rec.get("gradient_buckets"), list) and rec["gradient_buckets"] else FSDP_UNITS)


def run_options(rec: dict[str, Any], work: Workload) -> str:
    """What sets a measured run apart within its strategy and precision, in few characters:
    speed options (a bucket cap other than DDP's 25 MB among them), gradient accumulation,
    an injected delay (a test hook, carried into the projection)."""
    from bench.records.describe import short_options, speed_options

    parts = [] if speed_options(rec) == "—" else [short_options(speed_options(rec))]
    if work.grad_accum > 1:
        parts.append(f"accum {work.grad_accum}")
    if work.hook_delay_s:
        parts.append(f"slow comm {1000 * work.hook_delay_s:g} ms")
    return ",".join(parts) or "—"


def series_key(rec: dict[str, Any], work: Workload) -> tuple:
    """Runs that one projection stands for: workload, device, strategy, precision, options."""
    from bench.records.describe import workload

    return (workload(rec), rec.get("device"), rec["strategy"], rec.get("precision"),
            run_options(rec, work))


def _of_its_machine(rec: dict[str, Any], probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probes of the run's own machine (its row's ``machine``, else its env's): gloo over
    one CPU machine's loopback is that machine's memory, and a folder of two machines' runs
    gave each row the newest probe of either."""
    here = rec.get("machine") or machine(rec)
    return [p for p in probes if machine(p) == here]


def _of_its_network(rec: dict[str, Any], probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The probes of the network the run crossed: a probe's ``--tag`` names the network it
    measured (``testbed-1000mbit``), and a run with the same tag crossed it; any other run,
    the untagged probes."""
    return ([p for p in probes if rec.get("tag") and p.get("tag") == rec["tag"]]
            or [p for p in probes if not p.get("tag")])


def measured_its_network(rec: dict[str, Any], probe: dict[str, Any]) -> bool:
    """Whether ``probe`` measured the network ``rec``'s runs crossed: the one its tag names,
    or, untagged, that of a run over no named network. ``probe_for`` falls back to another
    network of the run's machine where none did; this says when it had to."""
    if probe.get("tag"):
        return probe["tag"] == rec.get("tag")
    return network_crossed(rec) is None


def probe_elsewhere(rec: dict[str, Any], probe: dict[str, Any]) -> tuple[str, str] | None:
    """What ``probe`` measured that is not ``rec``'s own, as (what kind, which): ('another
    machine', 'Intel Xeon (2 cores)'), ('another network', 'its loopback'); None where it
    measured the run's machine and the network its runs crossed. ``probe_for`` and
    ``matching_probe`` fall back to such a probe where none of the run's own is here; a
    figure taken from it must say so: gloo over one machine's loopback measures that
    machine's memory, and one link says nothing of another."""
    if machine(probe) != (rec.get("machine") or machine(rec)):
        return "another machine", machine(probe).replace("?", "one unnamed")
    if not measured_its_network(rec, probe):
        return "another network", probe.get("tag") or "its loopback"
    return None


def probe_for(rec: dict[str, Any], probes: list[dict[str, Any]],
              other_machines: bool = True) -> dict[str, Any] | None:
    """The probe a run's projection to scale takes: the newest of its device and machine
    that measured the network its runs crossed, else of its machine; then, where
    ``other_machines``, the same among its device's. Any rank count: the probe's network,
    not its ranks, is projected."""
    device = [p for p in probes if p.get("device") == rec.get("device")]
    for pool in [_of_its_machine(rec, device)] + [device] * other_machines:
        found = _of_its_network(rec, pool) or pool
        if found:
            return found[-1]
    return None


def ranks_per_node(record: dict[str, Any]) -> int:
    """A run's or a probe's ranks on each of its nodes."""
    return record["world_size"] // (record.get("nodes") or 1)


def smaller_probe(rec: dict[str, Any], probes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest probe at the fewest ranks, fewer than the run's, of its device, backend,
    network and machine, one rank a node where the run had one a node: what `bench project`
    extrapolates from when it takes a probe to more ranks, checked on a run it can reach."""
    fewer = [p for p in probes if p.get("device") == rec.get("device")
             and p.get("backend") == rec.get("backend")
             and p["world_size"] < rec["world_size"]
             and ranks_per_node(p) == ranks_per_node(rec)]
    mine = _of_its_network(rec, _of_its_machine(rec, fewer))
    mine = [p for p in mine if measured_its_network(rec, p)]
    if not mine:
        return None
    least = min(p["world_size"] for p in mine)
    return [p for p in mine if p["world_size"] == least][-1]


def matching_probe(rec: dict[str, Any], probes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest probe of the run's device, backend, ranks and nodes, of its network and,
    where the folder holds one, of its machine."""
    from bench.records.probes import probe_kind

    same = [p for p in probes if probe_kind(p) == probe_kind(rec)]
    return (_of_its_network(rec, _of_its_machine(rec, same) or same) or [None])[-1]


