"""Why a small all-reduce's time jumps between probes on a busy host, with no network at all:
two gloo ranks on loopback, each held to a core of its own, time sets of 50 calls of 1 KiB
(a `bench probe` size takes the median of up to 50), and a plain TCP ping-pong of 1 KiB
between two processes on the same cores gives what the kernel's loopback itself costs.

    python benchmarks/small_messages.py [--sets 20] [--size 1024]

On a 2-core VM (2026-12-03) gloo's calls were bimodal: about 0.3 ms, or 2 to 4 ms (one
scheduler tick, 4 ms here, a few two), as gloo's work threads waited for a core (`perf
sched`: up to 7.8 ms). The share of slow calls moved around a half from set to set, so
the median of a set jumped between the two modes while its mean did not; the ping-pong
stayed under 0.1 ms. Prints each set's median, mean and share of calls over 1.5 ms, then
the spreads."""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

SLOW_S = 1.5e-3  # between the two modes
PORT = 29613


def _rank(rank: int, sets: int, size: int) -> None:
    """One gloo rank: ``sets`` sets of 50 all-reduces of ``size`` bytes, each timed."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", PORT, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.ones(size // 4)
    found = []
    for _ in range(sets):
        for _ in range(3):  # as bench probe warms up
            dist.all_reduce(tensor)
        times = []
        for _ in range(50):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        found.append({"median_s": statistics.median(times), "mean_s": statistics.fmean(times),
                      "slow_share": sum(t > SLOW_S for t in times) / len(times)})
        time.sleep(0.2)  # a set apart from the next, as a probe's sizes are
    if rank == 0:
        print(json.dumps(found))
    dist.destroy_process_group()


def _ping_pong(role: str, size: int, calls: int = 2000) -> None:
    """A TCP round trip of ``size`` bytes each way, Nagle off; the client prints its times."""
    def receive(conn: socket.socket) -> None:
        left = size
        while left:
            chunk = conn.recv(left)
            if not chunk:
                raise SystemExit("ping-pong: the peer closed")
            left -= len(chunk)

    if role == "server":
        with socket.create_server(("127.0.0.1", PORT + 1)) as listener:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(calls):
                receive(conn)
                conn.sendall(b"x" * size)
        return
    for _ in range(200):
        try:
            conn = socket.create_connection(("127.0.0.1", PORT + 1))
            break
        except OSError:
            time.sleep(0.05)
    else:
        raise SystemExit("ping-pong: no server")
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        conn.sendall(b"x" * size)
        receive(conn)
        times.append(time.perf_counter() - start)
    print(json.dumps(times[calls // 10:]))  # the first tenth warms up


def _on_cores(args: list[str]) -> str:
    """Two processes of this script, the first on core 0, the second on core 1 (where there
    is one), OMP held to one thread; the first's standard output."""
    cores = sorted(os.sched_getaffinity(0))
    procs = []
    for i in range(2):
        argv = [sys.executable, __file__, *args, str(i)]
        procs.append(subprocess.Popen(
            ["taskset", "-c", str(cores[i % len(cores)]), *argv], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"small_messages: a process of {args[0]} failed")
    return next(o for o in outputs if o.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=20, help="sets of 50 calls")
    parser.add_argument("--size", type=int, default=1024, help="bytes a call")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("index", nargs="?", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "rank":
        _rank(args.index, args.sets, args.size)
        return 0
    if args.role == "ping-pong":
        _ping_pong("client" if args.index else "server", args.size)
        return 0
    common = ["--sets", str(args.sets), "--size", str(args.size)]
    sets = json.loads(_on_cores([*common, "--role", "rank"]))
    print(f"gloo all-reduce of {args.size} bytes, 2 ranks on loopback, cores apart, "
          f"{args.sets} sets of 50 calls:")
    print(f"{'set':>4} {'median (ms)':>12} {'mean (ms)':>10} {'calls over 1.5 ms':>18}")
    for i, s in enumerate(sets, start=1):
        print(f"{i:>4} {1e3 * s['median_s']:>12.2f} {1e3 * s['mean_s']:>10.2f} "
              f"{s['slow_share']:>18.0%}")
    medians, means = [s["median_s"] for s in sets], [s["mean_s"] for s in sets]
    print(f"medians {1e3 * min(medians):.2f} to {1e3 * max(medians):.2f} ms "
          f"({max(medians) / min(medians):.1f}x); means {1e3 * min(means):.2f} to "
          f"{1e3 * max(means):.2f} ms ({max(means) / min(means):.1f}x)")
    trips = sorted(json.loads(_on_cores([*common, "--role", "ping-pong"])))
    print(f"TCP ping-pong of {args.size} bytes, the same cores: median "
          f"{1e3 * statistics.median(trips):.3f} ms, 99th percentile "
          f"{1e3 * trips[int(0.99 * (len(trips) - 1))]:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
