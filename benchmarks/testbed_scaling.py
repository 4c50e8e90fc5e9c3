"""Does the projection's all-reduce scale with N as the ranks do? `bench project` takes a probe
at 2 ranks and predicts an all-reduce at 8 to 4,096 from it (a ring: 2(N-1) steps of the
probe's latency, and 2(N-1)/N of the bytes over its bus bandwidth). This checks that step of
the model on real links: four nodes of the testbed (benchmarks/testbed.py: network
namespaces, each on its own veth link to a bridge, every link shaped to one rate), probed
over 2, 3 and 4 of them, every size of the 3- and 4-node probes predicted from the 2-node
probe of the same round, beside the null model "an all-reduce costs at N what it cost at 2".

    python benchmarks/testbed_scaling.py [--rates 100,1000] [--rounds 3]
        [--output results/testbed-scaling]

Root only (namespaces). Node i's processes keep to core i mod the cores: on 2 cores two
nodes share one, which moves compute, not the link (the probe here times collectives only:
--contention-batch 0). Writes the probes to OUTPUT/probes/ and the comparison to
OUTPUT/scaling.json; `--analyse` redoes the comparison from the probes kept."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.testbed import Testbed, unavailable  # noqa: E402
from benchmarks.testbed_validation import on_nodes  # noqa: E402

RATES_MBIT = (100, 1000)
NODES = (2, 3, 4)
MAX_MIB = 4  # the largest message: 4 MiB at 4 nodes over 100 Mbit/s takes ~0.5 s
RESULT_FILE = "scaling.json"


def tag(rate_mbit: float) -> str:
    """The network's name in each probe: the hub of four links at this rate."""
    return f"testbed-hub-{rate_mbit:g}mbit"


def probe_nodes(net: Testbed, nodes: int, rate_mbit: float, output: Path, port: int,
                round_: int) -> Path:
    """`bench probe` over the first ``nodes`` nodes, one rank each; the record it wrote,
    with the testbed and the round noted in it."""
    before = set((output / "probes").glob("*.json"))
    argv = ["probe", "--cpu", "--gpus", "1", "--nodes", str(nodes), "--rdzv-endpoint",
            f"{net.address(0)}:{port}", "--width", "0.25", "--max-size", str(MAX_MIB),
            "--contention-batch", "0", "--timeout", "600", "--tag", tag(rate_mbit),
            "--output", str(output)]
    on_nodes(net, argv, timeout=1800, nodes=nodes)
    [path] = set((output / "probes").glob("*.json")) - before
    record = json.loads(path.read_text())
    record["testbed"] = {"nodes": net.nodes, "probed_nodes": nodes, "link_rate_mbit": rate_mbit,
                         "round": round_, "topology": "a bridge, each node on its own link",
                         "shaping": "tc tbf on both ends of each link (no added delay)"}
    path.write_text(json.dumps(record, indent=1))
    return path


def run_nodes(net: Testbed, nodes: int, rate_mbit: float, output: Path, port: int) -> None:
    """DDP over the first ``nodes`` nodes, one rank each: ResNet-18 x0.25 on 16 px images
    (2.8 MB of gradients), 16 images a rank (the global batch grows with N, as `bench
    project` holds it), one 25 MB bucket (its all-reduce after backward, nothing to
    overlap: what changes with N is the collective), 2 epochs of 384 images, the first the
    warm-up; 6 steps with gradient sync off measure the compute-only step."""
    argv = ["run", "--strategy", "ddp", "--cpu", "--gpus", "1", "--nodes", str(nodes),
            "--rdzv-endpoint", f"{net.address(0)}:{port}", "--data", "synthetic",
            "--synthetic-difficulty", "0", "--image-size", "16", "--train-limit", "384",
            "--test-limit", "64", "--epochs", "2", "--batch-size", str(16 * nodes),
            "--width", "0.25", "--bucket-cap-mb", "25", "--comm-probe-steps", "6",
            "--no-progress", "--timeout", "900", "--tag", tag(rate_mbit), "--output", str(output)]
    on_nodes(net, argv, timeout=3600, nodes=nodes)


def compare_runs(records: list[dict[str, Any]], probes: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Each run over 3 or more nodes predicted as `bench project --validate` predicts it
    past its probe: its own compute-only step and the network fitted to the 2-node probe of
    its rate (the all-reduce extrapolated, not measured); beside it the prediction from the
    probe over its own nodes (`--validate`'s first), "no communication" (the compute-only
    step), "communication as at 2 nodes" (its own compute-only step, and the 2-node
    projection's communication: what the extrapolation adds) and "as at 2 nodes" (the
    median step of the 2-node runs of its rate; on 2 cores the compute-only step grows with
    N too, as nodes share a core)."""
    from bench.project.from_records import matching_probe, workload_of
    from bench.project.validation import extrapolated, predict_measured
    from bench.records.describe import median_step_s

    runs = [r for r in records if r.get("status") == "ok" and r.get("tag", "").startswith(
        "testbed-hub-")]
    rate_of = {tag(rate): rate for rate in {p["testbed"]["link_rate_mbit"] for p in probes}}
    rows = []
    for rec in sorted(runs, key=lambda r: (r["tag"], r["world_size"], r["started_at"])):
        n, own, work = rec["world_size"], matching_probe(rec, probes), workload_of(rec)
        at_2 = [median_step_s(r) for r in runs if r["tag"] == rec["tag"]
                and r["world_size"] == 2]
        if n == 2 or own is None or work is None or not at_2:
            continue
        measured = median_step_s(rec)
        past = extrapolated(rec, work, probes, measured)
        if past["extrapolated_from"] != 2:
            continue
        guesses = {"model": past["extrapolated_ms"] / 1000,
                   "own_probe": predict_measured(rec, work, own).step_s,
                   "no_comm": work.compute_step_s,
                   "comm_as_at_2": past["comm_as_probed_ms"] / 1000,
                   "as_at_2": statistics.median(at_2)}
        rows.append({"run_id": rec["run_id"], "rate_mbit": rate_of.get(rec["tag"]),
                     "nodes": n, "measured_s": measured,
                     **{f"{k}_s": v for k, v in guesses.items()},
                     **{f"{k}_error_pct": 100 * (v - measured) / measured
                        for k, v in guesses.items()}})
    return rows


def timed_by(probe: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The probe with each size's all-reduce time read from ``key`` ("time_s", the median
    call, or "time_mean_s", the mean) as its "time_s", the other statistic dropped, or
    None where a size lacks it (probes before 2026-12-03 kept the median alone)."""
    if not all(key in r for r in probe["results"]):
        return None
    return {**probe, "results": [{**{k: v for k, v in r.items() if k != "time_mean_s"},
                                  "time_s": r[key]} for r in probe["results"]]}


def compare(probes: list[dict[str, Any]], key: str = "time_s") -> dict[str, Any]:
    """Every size of each probe over more than 2 nodes predicted from the 2-node probe of
    the same rate and round: the model (bench project's all-reduce over the network it fits
    to the 2-node probe) and the null model (the 2-node probe's own time at that size).
    Errors in % of the measured time; medians over all sizes and over those at least
    1 MiB (where the bytes, not the latency, take most of the time). ``key``: the
    statistic of a size's calls, fitted and measured alike (``timed_by``)."""
    from bench.project.scaling import allreduce_s, network_from_probe
    from bench.records.probes import ideal_allreduce_s

    rows = []
    timed = [t for t in (timed_by(p, key) for p in probes) if t is not None]
    by_key = {(p["testbed"]["link_rate_mbit"], p["testbed"]["round"], p["world_size"]): p
              for p in timed}
    for (rate, round_, n), probe in sorted(by_key.items()):
        base = by_key.get((rate, round_, 2))
        if n == 2 or base is None:
            continue
        net = network_from_probe(base)
        for r in sorted(probe["results"], key=lambda r: r["bytes"]):
            size, measured = r["bytes"], r["time_s"]
            model = allreduce_s(size, n, n, net)
            as_at_2 = ideal_allreduce_s(base, size)
            rows.append({"rate_mbit": rate, "round": round_, "nodes": n, "bytes": size,
                         "measured_s": measured, "model_s": model, "as_at_2_s": as_at_2,
                         "model_error_pct": 100 * (model - measured) / measured,
                         "as_at_2_error_pct": 100 * (as_at_2 - measured) / measured})

    def medians(selected: list[dict[str, Any]]) -> dict[str, Any]:
        return {"points": len(selected), **{
            key: statistics.median(abs(r[f"{key}_error_pct"]) for r in selected)
            if selected else None for key in ("model", "as_at_2")}}

    large = [r for r in rows if r["bytes"] >= 2**20]
    return {"date": _dt.date.today().isoformat(), "statistic": key, "rows": rows,
            "all_sizes": medians(rows),
            "from_1_mib": medians(large),
            "below_1_mib": medians([r for r in rows if r["bytes"] < 2**20]),
            "by_rate_nodes_from_1_mib": {
                f"{rate:g} Mbit/s, {n} nodes": medians(
                    [r for r in large if (r["rate_mbit"], r["nodes"]) == (rate, n)])
                for rate, n in sorted({(r["rate_mbit"], r["nodes"]) for r in large})}}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'link':>11} {'nodes':>5} {'size':>9} {'measured (ms)':>14} {'model (ms)':>11} "
          f"{'error':>7} {'as at 2 (ms)':>13} {'error':>7}")
    for r in result["rows"]:
        size = (f"{r['bytes'] / 2**20:.3g} MiB" if r["bytes"] >= 2**20
                else f"{r['bytes'] / 2**10:.3g} KiB")
        print(f"{r['rate_mbit']:>6g} Mb/s {r['nodes']:>5} {size:>9} "
              f"{1000 * r['measured_s']:>14.2f} {1000 * r['model_s']:>11.2f} "
              f"{r['model_error_pct']:>+6.1f}% {1000 * r['as_at_2_s']:>13.2f} "
              f"{r['as_at_2_error_pct']:>+6.1f}%")
    _print_size_errors(result)
    for label, m in result["by_rate_nodes_from_1_mib"].items():
        print(f"  {label}, 1 MiB and up: model {m['model']:.1f} %, as at 2 nodes "
              f"{m['as_at_2']:.1f} %")
    means = result.get("by_mean")
    if means and means["rows"]:
        print("the same with each size's mean call fitted and measured (above: the median "
              "call, as bench project fits it):")
        _print_size_errors(means, indent="  ")
    if not result.get("runs"):
        return
    guesses = (("model", "from 2 nodes"), ("own_probe", "own probe"),
               ("no_comm", "no comm"), ("comm_as_at_2", "comm as at 2"),
               ("as_at_2", "as at 2"))
    print("\nddp runs, the step in ms (error against the measured step):")
    print(f"{'link':>10} {'nodes':>5} {'measured':>8} "
          + " ".join(f"{name:>15}" for _, name in guesses))
    for r in result["runs"]:
        cells = " ".join(f"{1000 * r[f'{k}_s']:>6.1f} ({r[f'{k}_error_pct']:+5.1f}%)"
                         for k, _ in guesses)
        print(f"{r['rate_mbit']:>5g} Mb/s {r['nodes']:>5} {1000 * r['measured_s']:>8.1f} "
              f"{cells}")
    for key, name in guesses:
        print(f"  {name}: {_run_errors(result['runs'], key)}")
    for key, name in guesses[:2] if result.get("runs_by_mean") else ():
        print(f"  {name}, the probes' mean calls fitted: "
              f"{_run_errors(result['runs_by_mean'], key)}")


def _print_size_errors(result: dict[str, Any], indent: str = "") -> None:
    """A comparison's median errors over all sizes, from 1 MiB up and below it."""
    for name, key in (("all sizes", "all_sizes"), ("1 MiB and up", "from_1_mib"),
                      ("below 1 MiB", "below_1_mib")):
        m = result[key]
        print(f"{indent}median |error|, {name} ({m['points']} points): model "
              f"{m['model']:.1f} %, as at 2 nodes {m['as_at_2']:.1f} %")


def _run_errors(runs: list[dict[str, Any]], key: str) -> str:
    """The median and the worst |error| of one guess over the runs."""
    errors = [abs(r[f"{key}_error_pct"]) for r in runs]
    return f"median |error| {statistics.median(errors):.1f} %, worst {max(errors):.1f} %"


def load(output: Path) -> list[dict[str, Any]]:
    probes = []
    for path in sorted((output / "probes").glob("*.json")):
        record = json.loads(path.read_text())
        if "testbed" in record and "round" in record["testbed"]:
            probes.append(record)
    return probes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="results/testbed-scaling", help="results folder")
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES_MBIT),
                        help="link rates in Mbit/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=3,
                        help="probes over 2, 3 and 4 nodes, this many times, interleaved")
    parser.add_argument("--runs", action=argparse.BooleanOptionalAction, default=True,
                        help="after each probe, a DDP run over the same nodes (default on)")
    parser.add_argument("--analyse", action="store_true",
                        help="compare the probes kept in OUTPUT; measure nothing")
    args = parser.parse_args()
    output = Path(args.output)
    if not args.analyse:
        why = unavailable()
        if why:
            print(f"testbed_scaling: {why}", file=sys.stderr)
            return 2
        port, start = 29600, time.monotonic()
        for index, rate in enumerate((float(r) for r in args.rates.split(",")), start=40):
            with Testbed(nodes=max(NODES), rate_mbit=rate, index=index) as net:
                for round_ in range(args.rounds):
                    for nodes in NODES:
                        probe_nodes(net, nodes, rate, output, port, round_)
                        if args.runs:
                            run_nodes(net, nodes, rate, output, port + 1)
                        port += 2
                        print(f"[{time.monotonic() - start:6.0f} s] {rate:g} Mbit/s, "
                              f"{nodes} nodes, round {round_ + 1}", flush=True)
    from bench.records.files import load_records

    probes, records = load(output), load_records(output)[0]
    result = compare(probes)  # each size's median call, as bench project fits it
    result["runs"] = compare_runs(records, probes)
    by_mean = [t for t in (timed_by(p, "time_mean_s") for p in probes) if t is not None]
    if by_mean:  # beside it, the mean call (probes from 2026-12-03 keep it)
        result["by_mean"] = compare(by_mean)
        result["runs_by_mean"] = compare_runs(records, by_mean)
    if not result["rows"]:
        print(f"testbed_scaling: no probes over 3 or more nodes with a 2-node probe of the "
              f"same round in {output / 'probes'}", file=sys.stderr)
        return 2
    (output / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
