"""Rendezvous ports on this machine: which is free, which is taken, and where the kernel's
own (ephemeral) ports lie, which bench keeps out of."""

from __future__ import annotations

import random
import socket
from pathlib import Path

MASTER_ADDR = "127.0.0.1"
_LOWEST_PORT = 10000  # below it: well-known services' registered ports


def free_port() -> int:
    """A TCP port that is free now on the loopback interface, below the kernel's ephemeral
    range where there is room: a port of that range may meanwhile become the source port of
    some outgoing connection, and a rank that connects before its store listens may be
    given it and connect to itself (TCP's simultaneous open), then wait on itself until the
    timeout."""
    low = ephemeral_ports()[0]
    if low - _LOWEST_PORT >= 4096:
        # not the seeded generator: two runs at once must not try the same ports
        for port in random.SystemRandom().sample(range(_LOWEST_PORT, low), 64):
            if not port_in_use(port, reuse=False):
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
