"""A network you can shape, on one machine: N network namespaces ("nodes") joined by veth
links whose rate `tc` sets (a token bucket: this kernel has no netem, so no added delay or
loss), so that ranks in different namespaces all-reduce
over real TCP through a link of known speed. bench's multi-node torchrun (c10d rendezvous on
the first node's address) runs across it unchanged.

Two nodes are one veth pair; more hang off a bridge in a namespace of their own. Every name
carries this process's id (``pb<pid>``) and the addresses are assigned only inside namespaces
made here, so a testbed never touches the host's network. A reaper process, started with the
first namespace, deletes them all (and ends what runs in them) when the testbed closes or
when its process dies, even by kill -9: it waits on a pipe that only the owner holds. Needs
root (``ip netns``); ``unavailable()`` says why not.

    with Testbed(nodes=2, rate_mbit=1000) as net:
        net.popen(0, ["python", "-m", "bench", "probe", ...])
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

PREFIX = "pb"  # every namespace and link: pb<pid>-...
SUBNET = "10.213.{index}.0/24"  # a testbed's own addresses, inside its namespaces only


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why a testbed cannot be made here (None: it can)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (`ip`, `tc`): apt-get install iproute2"
    if os.geteuid() != 0:
        return "needs root: network namespaces and tc are root's"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


# The reaper: reads namespace names, one a line, until the pipe closes (the testbed closed,
# or its process died), then ends what runs in them and deletes them, newest first.
_REAPER = r"""
import os, signal, subprocess, sys
names = []
for line in sys.stdin:
    names.append(line.strip())
for name in reversed([n for n in names if n]):
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                          text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    for _ in range(100):  # a killed process leaves its namespace a moment later
        if subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode == 0:
            break
        subprocess.run(["sleep", "0.05"])
"""


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


@dataclass
class Testbed:
    """``nodes`` namespaces; each link shaped to ``rate_mbit`` in each direction."""

    nodes: int = 2
    rate_mbit: float = 1000.0
    index: int = 1  # the third octet of the subnet: two testbeds at once use two indexes
    names: list[str] = field(default_factory=list, init=False)
    links: list[str] = field(default_factory=list, init=False)
    _reaper: subprocess.Popen | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ValueError("a testbed has at least 2 nodes")
        if not 1 <= self.index <= 254:
            raise ValueError("index is an address octet: 1 to 254")
        self.tag = f"{PREFIX}{os.getpid()}-{self.index}"

    # ------------------------------------------------------------------ addresses
    def address(self, node: int) -> str:
        """The node's address on the testbed (its only address besides loopback)."""
        return SUBNET.format(index=self.index).rsplit(".", 1)[0] + f".{node + 1}"

    def namespace(self, node: int) -> str:
        return f"{self.tag}-n{node}"

    def interface(self, node: int) -> str:
        """The node's end of its link (for GLOO_SOCKET_IFNAME)."""
        return f"eth{node}"

    # ------------------------------------------------------------------ life
    def __enter__(self) -> Testbed:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        for node in range(self.nodes):
            self._add_namespace(self.namespace(node))
        if self.nodes == 2:
            self._link(self.namespace(0), self.interface(0), self.namespace(1), self.interface(1))
            for node in range(2):
                self._configure(node)
            return
        hub = f"{self.tag}-hub"
        self._add_namespace(hub)
        _ip("netns", "exec", hub, "ip", "link", "add", "br0", "type", "bridge")
        _ip("netns", "exec", hub, "ip", "link", "set", "br0", "up")
        for node in range(self.nodes):
            port = f"p{node}"
            self._link(self.namespace(node), self.interface(node), hub, port)
            _ip("netns", "exec", hub, "ip", "link", "set", port, "master", "br0")
            _ip("netns", "exec", hub, "ip", "link", "set", port, "up")
            self._shape(hub, port)  # the hub's side: traffic towards the node
            self._configure(node)

    def _add_namespace(self, name: str) -> None:
        if self._reaper is None:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER], stdin=subprocess.PIPE, text=True,
                start_new_session=True)  # not in the owner's process group: outlives its kill
        self._reaper.stdin.write(name + "\n")  # told before it exists: never orphaned
        self._reaper.stdin.flush()
        _ip("netns", "add", name)
        self.names.append(name)
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")

    def _link(self, ns_a: str, if_a: str, ns_b: str, if_b: str) -> None:
        # made in the host under temporary names, then moved: nothing stays in the host
        tmp_a, tmp_b = f"{self.tag}a{len(self.links)}"[-15:], f"{self.tag}b{len(self.links)}"[-15:]
        _ip("link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        self.links.append(tmp_a)
        _ip("link", "set", tmp_a, "netns", ns_a)
        _ip("link", "set", tmp_b, "netns", ns_b)
        _ip("netns", "exec", ns_a, "ip", "link", "set", tmp_a, "name", if_a)
        _ip("netns", "exec", ns_b, "ip", "link", "set", tmp_b, "name", if_b)

    def _configure(self, node: int) -> None:
        ns, dev = self.namespace(node), self.interface(node)
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{self.address(node)}/24", "dev", dev)
        _ip("netns", "exec", ns, "ip", "link", "set", dev, "up")
        self._shape(ns, dev)

    def _shape(self, ns: str, dev: str) -> None:
        """A token bucket at the rate on the device's egress: its bucket holds 2 ms of the
        rate (at least 64 KiB, so that one TCP segment burst passes), its queue 50 ms."""
        burst = max(64 * 1024, int(self.rate_mbit * 1e6 / 8 * 0.002))
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                        "tbf", "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst),
                        "latency", "50ms"], check=True, capture_output=True, text=True)

    def close(self) -> None:
        """End every process in the namespaces and delete them (their links go with them):
        the reaper does it once its pipe closes; this waits for it."""
        if self._reaper is not None:
            self._reaper.stdin.close()
            self._reaper.wait(timeout=60)
            self._reaper = None
        self.names.clear()
        self.links.clear()

    # ------------------------------------------------------------------ running
    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's namespace."""
        return ["ip", "netns", "exec", self.namespace(node), *argv]

    def env(self, node: int, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment in which the node is reached at its testbed address: torchrun
        advertises it to the rendezvous (``PET_LOCAL_ADDR`` is its ``--local-addr``; it would
        say the host name, which every namespace shares), and gloo and NCCL send over the
        node's link."""
        env = dict(os.environ if base is None else base)
        env.update(PET_LOCAL_ADDR=self.address(node), GLOO_SOCKET_IFNAME=self.interface(node),
                   NCCL_SOCKET_IFNAME=self.interface(node),
                   TORCH_CPP_LOG_LEVEL="ERROR")  # c10d: "cannot retrieve the hostname" of peers
        return env

    def popen(self, node: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("env", self.env(node))
        return subprocess.Popen(self.command(node, argv), **kwargs)
