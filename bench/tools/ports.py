"""Rendezvous ports on this machine: which is free, which is taken, and where the kernel's
own (ephemeral) ports lie, which bench keeps out of."""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path

MASTER_ADDR = "127.0.0.1"
_LOWEST_PORT = 10000  # below it: well-known services' registered ports
# Ports chosen by this process, each promised to it by a socket it holds (promise_port).
_PROMISES: dict[int, socket.socket] = {}


def promise_port(port: int) -> bool:
    """Promise ``port`` to this process until it releases it (``release_port``) or ends,
    unless another process on this machine holds its promise; on Linux by an abstract
    socket named after the port (the kernel lets one process hold a name, and drops it
    with the process, killed or not; a network namespace has names of its own, as it has
    ports). Elsewhere every port is promised.

    Why: a run's port is bound only when its store starts, at once under torchrun, but
    under mp.spawn after each rank has started Python and imported torch: seconds later on
    a loaded machine. A run started meanwhile could see the port free and take it; its
    store would then answer the first run's ranks, who would join the wrong group (in CI on
    2 cores, EADDRINUSE in one run and 'connection closed by peer' in another, the same
    second: the timeline fits one port drawn twice)."""
    if not sys.platform.startswith("linux") or port in _PROMISES:
        return True
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        holder.bind(f"\0parallel-bench-port-{port}")
    except OSError:
        holder.close()
        return False
    _PROMISES[port] = holder
    return True


def release_port(port: int) -> None:
    """End this process's promise of ``port`` (its run is over, or its store listens)."""
    holder = _PROMISES.pop(port, None)
    if holder is not None:
        holder.close()


def free_port() -> int:
    """A TCP port that is free now on the loopback interface and promised to this process
    (``promise_port``: no other run here chooses it before its store listens), below the
    kernel's ephemeral range where there is room: a port of that range may meanwhile become
    the source port of some outgoing connection, and a rank that connects before its store
    listens may be given it and connect to itself (TCP's simultaneous open), then wait on
    itself until the timeout."""
    low = ephemeral_ports()[0]
    if low - _LOWEST_PORT >= 4096:
        # not the seeded generator: two runs at once must not try the same ports
        for port in random.SystemRandom().sample(range(_LOWEST_PORT, low), 64):
            if port not in _PROMISES and not port_in_use(port, reuse=False) \
                    and promise_port(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((MASTER_ADDR, 0))
        return sock.getsockname()[1]


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_in_use(port: int, reuse: bool = True) -> bool:
    """Whether ``port`` cannot be bound on the loopback interface now (``reuse``: a port
    whose last connection is still in TIME_WAIT counts as free, as a store may bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((MASTER_ADDR, port))
        except OSError:
            return True
    return False
