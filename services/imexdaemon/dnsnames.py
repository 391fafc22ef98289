"""IMEXDaemonsWithDNSNames: the IMEX node list by stable DNS names, their addresses in hosts.

With the gate on (the reference's default), ``nodes.cfg`` is written once and never
changes: ``compute-domain-daemon-0000`` to ``-(MAX_NODES_PER_IMEX_DOMAIN - 1)``, one
name per index a clique can give. Which address each name has is the daemon's
hosts file (the pod's ``/etc/hosts``): one line per member of its clique that has
an index, ``<ip>\\t<name of its index>``, below the marker line, every other line
kept as it was. IMEX resolves the names it can and treats the others as absent
nodes; on a change the wrapper sends it SIGUSR1 (re-read, re-resolve, reconnect)
rather than restarting it. A daemon that comes back with another address keeps its
name, since its index is kept (services/domains/membership.py).
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "compute-domain-daemon-"
MARKER = "# Compute Domain Daemon mappings"


def name(index: int) -> str:
    """The DNS name of a clique's ``index``-th daemon (the reference's format)."""
    return f"{PREFIX}{index:04d}"


def static_nodes(max_nodes: int) -> str:
    """``nodes.cfg``: every name a clique of ``max_nodes`` can have, in index order."""
    return "".join(f"{name(i)}\n" for i in range(max_nodes))


def mapping(indexed: list[tuple[int, str]], max_nodes: int) -> dict[str, str]:
    """(index, IP) of the clique's members -> {IP: name}; an index outside the node
    list (never given by the controller) is left out, with a warning."""
    out: dict[str, str] = {}
    for index, ip in indexed:
        if not 0 <= index < max_nodes:
            log.warning("index outside the node list: no name", extra={"index": index, "ip": ip})
            continue
        out[ip] = name(index)
    return out


def render_hosts(existing: str, names: dict[str, str]) -> str:
    """``existing`` without our lines (the marker and every line naming one of our
    names), then the marker and one ``<ip>\\t<name>`` per entry, in name order."""
    kept = [line for line in existing.splitlines() if line.strip() != MARKER and PREFIX not in line]
    ours = [f"{ip}\t{n}" for ip, n in sorted(names.items(), key=lambda item: item[1])]
    return "".join(f"{line}\n" for line in [*kept, MARKER, *ours])


def update_hosts(path: Path, names: dict[str, str]) -> bool:
    """Bring ``path`` in line with ``names``; True when it changed. Written in place: a
    container's ``/etc/hosts`` is a file mounted by the kubelet, which a rename over it
    would fail on."""
    try:
        existing = path.read_text()
    except FileNotFoundError:
        existing = ""
    wanted = render_hosts(existing, names)
    if wanted == existing:
        return False
    with open(path, "w") as out:
        out.write(wanted)
    return True


def read_hosts(path: Path) -> dict[str, str]:
    """A hosts file's names -> the first address given for each (as a resolver reads it)."""
    found: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        for host in fields[1:]:
            found.setdefault(host, fields[0])
    return found


def resolve(entry: str, hosts: dict[str, str]) -> str | None:
    """A node-list entry's address: an IP address is itself, a name its hosts entry,
    None for a name nobody has (an empty slot of the list)."""
    try:
        return str(ipaddress.ip_address(entry))
    except ValueError:
        return hosts.get(entry)
