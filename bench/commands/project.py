"""`bench project`: each measured strategy at 8 to 4,096 GPUs on paper, or (--validate) the
model's error on the measured multi-rank runs."""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from bench.commands import results_argument, results_source
from bench.config.options import parse_list
from bench.project.from_records import (
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    comm_hook,
    measured_its_network,
    probe_for,
    run_options,
    series_key,
    workload_of,
)
from bench.project.memory import fits_from, memory_at
from bench.project.scaling import (
    DATASHEET_CAVEAT,
    LEFT_OUT,
    NETWORKS,
    Network,
    Projection,
    Workload,
    network_from_probe,
    project,
)
from bench.project.validation import calibration_lines, validate_records
from bench.records.describe import (
    machine,
    median_step_s,
    oversubscribed,
    shared_cores,
    workload,
)
from bench.records.files import load_source
from bench.tools import terminal
from bench.tools.errors import ConfigError
from bench.tools.folders import file_to_write


def resolve_network(name: str | None, intra: float | None, inter: float | None,
                    probes: list[dict[str, Any]], root: Path = Path("RESULTS")) -> Network:
    """The network the projection prices communication on; ``root``: the results folder
    whose probes/ a probe is looked for in."""
    if intra is not None or inter is not None:
        if intra is None or inter is None or intra <= 0 or inter <= 0:
            raise ConfigError("--intra-busbw and --inter-busbw go together, in GB/s > 0")
        # named by its figures: each block's heading says what it was projected over
        return Network(f"busbw {intra:g} GB/s in a node and {inter:g} GB/s across nodes", intra,
                       inter, "nvlink", "given on the command line")
    if name == "probe":
        if not probes:
            raise ConfigError(f"--network probe needs a `bench probe` record in {root}/probes; "
                              f"run `bench probe --output {shlex.quote(str(root))}` on the "
                              "runs' machine first (with --cpu --gpus N for CPU runs)")
        return network_from_probe(probes[-1])
    if name not in NETWORKS:
        raise ConfigError(f"--network must be one of {', '.join([*NETWORKS, 'probe'])}")
    return NETWORKS[name]


def _records(source: str) -> tuple[list[dict[str, Any]], Path]:
    """The records and the results folder they came from."""
    path = Path(source)
    return load_source(source, "project"), path.parent.parent if path.is_file() else path


def _newest_per_strategy(records: list[dict[str, Any]]) -> list[tuple[dict, Workload]]:
    """One measured run per series_key: the newest ok one with most ranks (its compute step
    was measured with gradient sync off)."""
    chosen: dict[tuple, tuple[dict, Workload]] = {}
    for rec in sorted(records, key=lambda r: (r.get("world_size") or 0,
                                              r.get("started_at") or "")):
        work = workload_of(rec) if rec.get("status") == "ok" else None
        if work is not None:
            chosen[series_key(rec, work)] = (rec, work)
    from bench.report.table import report_order

    def order(key: tuple) -> tuple:  # as the report orders its rows
        name, device, strategy, precision, options = key
        return report_order({"workload": name, "device": device, "strategy": strategy,
                             "world_size": 0, "precision": precision, "options": options})

    return [chosen[k] for k in sorted(chosen, key=lambda k: (order(k), tuple(map(str, k))))]


def cmd_project(source: str, gpus: list[int], gpus_per_node: int, network: str | None,
                intra: float | None, inter: float | None, fmt: str, validate: bool,
                plot: str | None = None, gpu_memory: float | None = None) -> int:
    from bench.records.probes import load_probes

    if gpus_per_node < 1 or any(n < 1 for n in gpus):
        raise ConfigError("--gpus and --gpus-per-node must be positive")
    if max(gpus) > MAX_GPUS:
        raise ConfigError(f"--gpus goes up to {MAX_GPUS:,}, past the largest clusters built "
                          f"(got {max(gpus):,})")
    if gpus_per_node > MAX_GPUS_PER_NODE:
        raise ConfigError(f"--gpus-per-node goes up to {MAX_GPUS_PER_NODE:,}, past the largest "
                          f"NVLink domains built (got {gpus_per_node:,})")
    if gpu_memory is not None and not gpu_memory > 0:
        raise ConfigError(f"--gpu-memory takes GiB above 0 (got {gpu_memory})")
    if plot is not None:
        if Path(plot).suffix not in (".png", ".svg"):
            raise ConfigError(f"--plot {plot}: the file must end in .png or .svg")
        file_to_write("--plot", plot, "scaling.png")
    # a network named or given needs no probe: resolved (or refused) before the folder is read
    given = (resolve_network(network, intra, inter, [])
             if network != "probe" or intra is not None or inter is not None else None)
    records, root = _records(source)
    skipped: list[str] = []
    probes = load_probes(root, skipped)
    for line in skipped:
        print(f"bench project: {line}", file=sys.stderr)
    if validate:
        return validate_records(records, probes, root)
    net = given or resolve_network(network, intra, inter, probes, root)
    by_probe = network == "probe" and intra is None
    # A GPU network preset projects GPU runs; probes the runs of the machines they measured
    # (gloo between CPU processes says nothing of NCCL between GPUs, nor one machine's
    # loopback of another's); figures given on the command line, any.
    device = None if intra is not None or by_probe else "cuda"
    crowded = sorted({workload(r) for r in records
                      if r.get("status") == "ok" and oversubscribed(r)})
    for name in crowded:
        print(terminal.fill(f"bench project: {name} is not projected: some of its runs' ranks "
                            "oversubscribed the cores, so its times measure the crowding (the "
                            "report shows its top-1 alone)", subsequent_indent="    "),
              file=sys.stderr)
    newest = _newest_per_strategy([r for r in records if workload(r) not in crowded])
    probe_of = {id(rec): probe_for(rec, probes, other_machines=False) if by_probe else None
                for rec, _ in newest}
    measured = [(rec, work) for rec, work in newest
                if (probe_of[id(rec)] is not None if by_probe
                    else device is None or rec.get("device") == device)]
    other = [rec for rec, _ in newest if by_probe and probe_of[id(rec)] is None]
    machines = ", ".join(sorted({machine(rec) for rec in other}))  # no probe measured them
    if other and not measured:
        raise ConfigError(f"--network probe: no probe in {source} measured the machine of its "
                          f"runs ({machines}); run `bench probe` there, or name a --network")
    if other:
        print(terminal.fill(
            f"bench project: {terminal.count(len(other), 'series', 'series')} not projected: "
            f"no `bench probe` here measured their machine ({machines}), and another's "
            "network is not theirs: `bench probe` on it, or --network NAME (GPUs)",
            subsequent_indent="    "), file=sys.stderr)
    nets = {id(rec): network_from_probe(probe_of[id(rec)]) if by_probe else net
            for rec, _ in measured}
    crossed_elsewhere = sorted({workload(rec) for rec, _ in measured
                                if by_probe and not measured_its_network(rec, probe_of[id(rec)])})
    for name in crossed_elsewhere:  # the probe of its machine, not of the network it crossed
        print(terminal.fill(f"bench project: {name}: no probe here measured the network its "
                            "runs crossed, so it is projected over another its machine was "
                            "probed on (named above its rows); a `bench probe` over it (with "
                            "its runs' --tag, if any) measures its own",
                            subsequent_indent="    "), file=sys.stderr)
    for line in suspect_sources(measured):
        print(terminal.fill(f"bench project: {line}", subsequent_indent="    "), file=sys.stderr)
    rows = [(rec, work, project(work, n, gpus_per_node, nets[id(rec)])) for rec, work in measured
            for n in gpus]
    if not rows:
        raise ConfigError(f"no ok {device + ' ' if device else ''}run in {source} has what a "
                          "projection needs (a multi-rank run's compute_step_s, or a 1-rank "
                          "run's step time)"
                          + ("; CPU runs project with --network probe" if device else ""))
    table = [_row(rec, work, p, nets[id(rec)].name) for rec, work, p in rows]
    left_out = LEFT_OUT + (  # a 1-rank run's step, its compute here, ran the hook too
        "; PowerSGD's own compression work where its run did not measure it (`hook_work_s`: "
        "the comm probe measures it, not under --compile): such rows are optimistic by it"
        if any(comm_hook(rec) == "powersgd" and rec.get("world_size", 1) > 1
               and rec.get("hook_work_s") is None for rec, _ in measured) else "")
    if plot is not None:
        from bench.project.plot import write_projection_plot

        write_projection_plot(Path(plot), measured, records, gpus, gpus_per_node,
                              lambda rec: nets[id(rec)])
        print(f"bench project: plot -> {plot}", file=sys.stderr)
    used = list({n.name: n for n in nets.values()}.values())  # each network once, in order
    if fmt == "json":
        print(json.dumps({"network": used[0].name if len(used) == 1 else "probe",
                          "source": "; ".join(n.source for n in used), "left_out": left_out,
                          "rows": table}, indent=1, allow_nan=False, default=str))
        return 0
    if fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(table[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
        return 0
    print(_text(table))
    fits = []
    if gpu_memory is not None:
        for rec, work in measured:
            said = fits_from(rec, gpus, gpu_memory * 2**30)
            fits.append(f"{gpu_memory:g} GiB a GPU: {rec.get('strategy')} "
                        f"{rec.get('precision')} ({run_options(rec, work)}) "
                        + (said or "— its record has no memory_parts (a run before them)"))
    datasheet = [f"network {net.name} is {DATASHEET_CAVEAT}"] if net.name in NETWORKS else []
    for line in (*fits, *(f"network: {n.name} — {n.source}" for n in used),
                 f"projection leaves out: {left_out}", *calibration_lines(root), *datasheet):
        print(terminal.fill(line, subsequent_indent="  "))
    return 0


def suspect_sources(measured: list[tuple[dict[str, Any], Workload]]) -> list[str]:
    """The runs a projection starts from whose compute-only step ran slower than their real
    step (exposed communication below zero, beyond the report's noise: the probe was slowed,
    and the report flags the row), or whose cores other work shared (the report's `shared
    cores`): what each projects from is not a figure to trust."""
    from bench.report.flags import EXPOSED_COMM_NOISE, flagged_exposed

    lines = []
    for rec, work in measured:
        # from the compute step the projection starts from, not the record's own fraction:
        # a record whose compute_step_s was 1e6 s and its fraction left as it was projected
        # steps of 11 days, unflagged
        step = median_step_s(rec)
        exposed = 1 - work.compute_step_s / step if step > 0 else math.nan
        if exposed < -EXPOSED_COMM_NOISE:
            lines.append(f"{rec.get('strategy')} N={rec.get('world_size')} ({workload(rec)}): "
                         f"its compute-only step ({work.compute_step_s:.2f} s) ran slower than "
                         f"its measured step ({step:.2f} s; exposed "
                         f"communication {flagged_exposed(exposed)}), so its projection starts "
                         "from a slowed probe: rerun it on an idle machine before trusting it")
        shared = shared_cores(rec)
        if shared is not None:
            lines.append(f"{rec.get('strategy')} N={rec.get('world_size')} ({workload(rec)}): "
                         f"{shared.said()}, so its projection starts from slowed steps: "
                         "rerun it on an idle machine before trusting it")
    return lines


def _bottleneck(rec: dict[str, Any], p: Projection) -> str:
    """The projection's bottleneck, except that a measured run that trained at its input
    pipeline's pace (the report's input-bound) lent it an input-bound step: its "compute"
    is the loader's."""
    from bench.records.describe import input_bound, summarise_epochs

    speed = summarise_epochs(rec.get("per_epoch") or []).get("median_images_per_s")
    if p.bottleneck == "compute" and input_bound(speed, rec.get("loader_alone_images_per_s")):
        return "input pipeline (as measured)"
    return p.bottleneck


def _row(rec: dict[str, Any], work: Workload, p: Projection, network: str) -> dict[str, Any]:
    finite = math.isfinite(p.step_s)
    speed = (rec.get("per_rank_batch") or 0) * p.gpus / p.step_s if finite else None
    return {"workload": workload(rec),
            "strategy": p.strategy, "precision": rec.get("precision") or "?",
            "options": run_options(rec, work), "gpus": p.gpus,
            "nodes": p.nodes, "network": network, "measured_run": rec.get("run_id"),
            "step_ms": round(1000 * p.step_s, 2) if finite else None,
            "images_per_s": round(speed) if speed else None,
            "efficiency": round(p.efficiency, 3) if finite else None,
            "exposed_comm": round(p.exposed_fraction, 3) if finite else None,
            "bottleneck": _bottleneck(rec, p),
            "memory_per_rank_gib": (None if memory_at(rec, p.gpus) is None
                                    else round(memory_at(rec, p.gpus) / 2**30, 3))}


_SPARED_ON_A_NARROW_TERMINAL = ("exposed", "nodes", "img/s")


def _text(table: list[dict[str, Any]]) -> str:
    """A block per workload within 120 columns: the mem/rank column only in a block whose
    runs have memory parts (a block of older runs' dashes widened every row past 120), a
    row's options on lines of their own where they would pass it."""
    header = ["strategy", "prec.", "options", "GPUs", "nodes", "step ms", "img/s", "eff.",
              "exposed", "mem/rank", "bottleneck"]
    blocks: dict[str, list[list[str]]] = {}
    networks: dict[str, dict[str, None]] = {}  # a block's networks, in order (with a probe
    # each series takes its own machine's; a folder may hold two machines' runs)
    # rows the model does not project (nn.DataParallel: one process, one node) are told
    # once per strategy below its block: a row of dashes each would say nothing
    untold: dict[str, dict[str, dict[str, list[str]]]] = {}
    for r in table:
        lines = blocks.setdefault(r["workload"], [header])
        networks.setdefault(r["workload"], {})[r["network"]] = None
        if r["step_ms"] is None and r["images_per_s"] is None:
            what = " ".join([r["strategy"], str(r["precision"])]
                            + ([] if r["options"] == "—" else [r["options"]]))
            reasons = untold.setdefault(r["workload"], {}).setdefault(what, {})
            reasons.setdefault(r["bottleneck"], []).append(str(r["gpus"]))
            continue
        lines.append([r["strategy"], str(r["precision"]), r["options"], str(r["gpus"]),
                      str(r["nodes"]),
                      "—" if r["step_ms"] is None else f"{r['step_ms']:.1f}",
                      _count(r["images_per_s"]),
                      "—" if r["efficiency"] is None else f"{100 * r['efficiency']:.0f}%",
                      "—" if r["exposed_comm"] is None else f"{100 * r['exposed_comm']:.0f}%",
                      "—" if r["memory_per_rank_gib"] is None
                      else f"{r['memory_per_rank_gib']:.2f} GiB",
                      r["bottleneck"]])
    out = []
    memory = header.index("mem/rank")
    for name, lines in blocks.items():
        if all(row[memory] == "—" for row in lines[1:]):
            lines = [row[:memory] + row[memory + 1:] for row in lines]
        width = terminal.columns()
        # on a narrow terminal: exposed (eff. says nearly as much), then nodes (the heading
        # says the GPUs a node), then img/s (step ms ranks the rows alike)
        spared = terminal.spare_columns(lines, width, _SPARED_ON_A_NARROW_TERMINAL)
        over = " and ".join(networks[name])
        a_node = [] if "nodes" in spared[0] else [f"{_gpus_a_node(lines)},"]
        out += ["", *terminal.pack(name, ["(projected from its runs", f"over {over},",
                                          *a_node, "not measured)"])]
        out += [line for row in terminal.aligned_rows(spared, width) for line in row]
        for what, reasons in untold.get(name, {}).items():
            told = "; ".join(f"{', '.join(gpus)} GPUs — {reason}"
                             for reason, gpus in reasons.items())
            out += terminal.wrap(f"{what} is not projected: {told}", subsequent_indent="  ")
    return "\n".join(out[1:])


def _gpus_a_node(lines: list[list[str]]) -> str:
    """How a block's rows (its header first) spread over nodes, said in its heading where
    the nodes column is left out: '8 GPUs a node' (from the rows of more than one node; a
    row of fewer GPUs is one node), '8 or 4 GPUs a node' where a user's --gpus-per-node made
    two of its runs' projections differ, 'one node' where every row is one."""
    gpus, nodes = lines[0].index("GPUs"), lines[0].index("nodes")
    counts = sorted({int(row[gpus]) // int(row[nodes]) for row in lines[1:]
                     if row[nodes].isdigit() and int(row[nodes]) > 1}, reverse=True)
    return " or ".join(map(str, counts)) + " GPUs a node" if counts else "one node"


def _count(value: int | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1e6:.1f} M" if value >= 1e6 else f"{value:,}"


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    """``bench project``'s options (``help``: its line in ``bench --help``)."""
    proj = sub.add_parser("project", help=help)
    results_argument(proj, "results folder or one record (default results)")
    proj.add_argument("--gpus", default="8,64,512,4096",
                      help="GPU counts, comma-separated (default 8,64,512,4096)")
    proj.add_argument("--gpus-per-node", type=int, default=8, help="default 8")
    proj.add_argument("--network", default="h100-nvlink-ndr",
                      help="h100-nvlink-ndr (default), a100-nvlink-hdr, pcie-ethernet-100g, "
                           "or probe (each series over the newest `bench probe` of its own "
                           "machine in the results)")
    proj.add_argument("--intra-busbw", type=float, default=None, metavar="GB/s",
                      help="all-reduce busbw inside a node (with --inter-busbw)")
    proj.add_argument("--inter-busbw", type=float, default=None, metavar="GB/s",
                      help="network bandwidth per node (with --intra-busbw)")
    proj.add_argument("--format", choices=("text", "csv", "json"), default="text",
                      help="text (a block per workload; default), csv or json")
    proj.add_argument("--validate", action="store_true",
                      help="predict the measured multi-rank runs instead and print the "
                           "error (and, where a probe at fewer ranks is here, the error of "
                           "predicting them from it, as a projection past a probe does)")
    proj.add_argument("--gpu-memory", type=float, default=None, metavar="GiB",
                      help="say from which N each strategy's ranks fit in this much memory "
                           "(ZeRO divides the optimizer state by N, FSDP all its parts)")
    proj.add_argument("--plot", default=None, metavar="FILE",
                      help="also draw efficiency against GPUs (.png or .svg), a panel per "
                           "workload, measured runs over the projection")


def main(args: argparse.Namespace, passed_on: list[str]) -> int:
    return cmd_project(results_source(args), parse_list(args.gpus, "--gpus", int),
                       args.gpus_per_node, args.network, args.intra_busbw,
                       args.inter_busbw, args.format, args.validate, args.plot, args.gpu_memory)
