"""Free ports for the servers gpudra starts: distinct, bindable, below the ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.local import ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen = ports.free_ports(40)
    assert len(set(chosen)) == 40
    assert all(ports.LOWEST <= p < low for p in chosen), chosen
    for port in chosen:  # nothing listens there: a server can bind it
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", taken)  # the range is that one port
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: taken + 1)
        with pytest.raises(OSError, match="no 1 free ports"):
            ports.free_ports(1)
