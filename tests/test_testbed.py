"""A network that costs something, on this machine: network namespaces joined by veth links
that `tc` shapes (benchmarks/testbed.py). `bench probe` across two of them measures the rate
the link was given, bench's multi-node torchrun runs across them unchanged, and a testbed
leaves nothing behind, even when its process is killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from benchmarks import testbed  # (its class named Test... would be collected)

WHY = testbed.unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no testbed here: {WHY}")


def _both_nodes(net: testbed.Testbed, argv: list[str], timeout: float = 240) -> list[str]:
    """``bench ARGV --node-rank i`` in node i, both at once; what each printed."""
    procs = [net.popen(i, [sys.executable, "-m", "bench", *argv, "--node-rank", str(i)],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, out[-3000:]
        outs.append(out)
    return outs


@pytest.mark.parametrize("rate_mbit", [50, 200])
def test_a_probe_across_two_nodes_measures_the_rate_of_their_link(rate_mbit, tmp_path):
    """Two ranks all-reducing a message of S bytes each send S over the link (ring: 2(n-1)/n
    of it), so the bus bandwidth of a large message is the link's rate; rates four times
    apart must read four times apart."""
    with testbed.Testbed(nodes=2, rate_mbit=rate_mbit) as net:
        _both_nodes(net, ["probe", "--cpu", "--gpus", "1", "--nodes", "2", "--rdzv-endpoint",
                          f"{net.address(0)}:29400", "--width", "0.125", "--max-size", "4",
                          "--timeout", "120", "--output", str(tmp_path)])
    [path] = (tmp_path / "probes").glob("*.json")
    probe = json.loads(path.read_text())
    assert probe["nodes"] == 2 and probe["world_size"] == 2, probe
    largest = max(probe["results"], key=lambda r: r["bytes"])
    rate_gbs = rate_mbit / 8 / 1000  # GB/s
    assert 0.8 * rate_gbs <= largest["busbw_GBps"] <= 1.05 * rate_gbs, (largest, rate_gbs)


def test_ddp_trains_across_two_nodes_of_the_testbed(tmp_path):
    """bench's own two-node path (torchrun's c10d rendezvous on node 0's address, one rank
    a node) over the shaped link: one record (the nodes share the folder), two nodes in it."""
    with testbed.Testbed(nodes=2, rate_mbit=200) as net:
        _both_nodes(net, ["run", "--strategy", "ddp", "--cpu", "--gpus", "1",
                                 "--nodes", "2", "--rdzv-endpoint", f"{net.address(0)}:29400",
                                 "--epochs", "1", "--data", "synthetic", "--train-limit", "128",
                                 "--test-limit", "16", "--width", "0.125", "--no-progress",
                                 "--comm-probe-steps", "0", "--output", str(tmp_path)])
    [path] = (tmp_path / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "ok" and rec["nodes"] == 2 and rec["world_size"] == 2, rec
    assert rec["processes"] == 2 and rec["backend"] == "gloo"


KILLED = """
import os, signal, sys
sys.path.insert(0, {root!r})
from benchmarks.testbed import Testbed
net = Testbed(nodes=4, rate_mbit=50, index=9)  # 4 nodes: a bridge in a hub namespace
net.open()
print(net.tag, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_testbed_leaves_no_namespace_and_no_link():
    done = subprocess.run([sys.executable, "-c", KILLED.format(root=str(ROOT))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    tag = done.stdout.strip()
    assert tag.startswith(testbed.PREFIX), done.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        if tag not in spaces and tag not in links:
            return
        time.sleep(0.2)
    raise AssertionError(f"left behind after kill -9: {spaces} {links}")
