"""Free TCP ports on 127.0.0.1 for the servers gpudra starts itself (tests, ``gpudra up``).

A port is chosen below the kernel's ephemeral range. The ports ``bind(0)`` hands
out come from that range, which is also where every outgoing connection takes its
source port: a port chosen that way and bound a moment later by the server could
be taken in between, and was (a NATS cluster's last server binds its ports a
second or so after they were chosen, while the other test worker's connections
come and go; it exited with "address already in use"). Below the range only
another chooser can collide, and the choice is random over some 12,000 ports.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LOWEST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default, where the file cannot be read
TRIES = 200


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nothing listens on now, below the ephemeral range."""
    high = _ephemeral_low()
    chosen: list[int] = []
    for _ in range(TRIES):
        if len(chosen) == count:
            return chosen
        port = random.randrange(LOWEST, high) if high > LOWEST else _any_port()
        if port not in chosen and _bindable(port):
            chosen.append(port)
    if len(chosen) == count:
        return chosen
    raise OSError(f"no {count} free ports between {LOWEST} and {high} on 127.0.0.1")


def _ephemeral_low() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    return DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_port() -> int:
    """The kernel's choice, where the ephemeral range leaves no room below it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
