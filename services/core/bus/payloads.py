"""The largest message each identity may publish: its own largest real message, with room.

One server-wide ``max_payload`` (1 MiB, :data:`MAX_PAYLOAD`) let every
identity send what the largest of them needs; an event is small. In a cluster the
auth callout writes the role's limit into each user JWT (``nats.payload``) and
nats-server enforces it; the static nkeys configuration of the local stack has no
per-user payload (only per account), so there the server-wide limit stays. Either
way the bus client refuses a message over its own limit before sending it
(:func:`check`): the server would otherwise close the connection on the violation.

Measured with the longest names the API allows (tests/unit/core/test_payloads.py
rebuilds each):

- front: a prepare request of 512 claims (the preparer's limit), 237 KiB;
- preparer: its reply, 299 KiB (16 claims of 32 devices each: 273 KiB); claim events
  at most 64 KiB (the ``CLAIMS`` message limit); its prepared key (56 MIG devices)
  6.4 KiB;
- discovery: an 8-GPU node's inventory with 56 MIG devices, 22 KiB; its simulated
  state 8 KiB;
- allocator: a claim in KV ``claims``, up to 256 KiB (the bucket's value limit); a
  ``reserved`` event naming 256 pods 80 KiB;
- domains: a domain's status naming 18 nodes 4.9 KiB; an IMEX daemon's member key
  1.8 KiB; a publisher's lease under 1 KiB; an auditor's consumer requests under 4 KiB.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from services.core.bus.access import Role
from services.core.bus.natsauth import MAX_PAYLOAD  # the server's, for every connection

log = logging.getLogger(__name__)
KIB = 1024

#: Headers and payload together, as nats-server counts them.
PAYLOAD: dict[Role, int] = {
    Role.FRONT: 512 * KIB,
    Role.PREPARER: 512 * KIB,
    Role.DISCOVERY: 128 * KIB,
    Role.ALLOCATOR: 384 * KIB,
    Role.PUBLISHER: 16 * KIB,
    Role.AUDITOR: 16 * KIB,
    Role.DOMAINS: 64 * KIB,
    Role.IMEX: 16 * KIB,
    Role.SIM: MAX_PAYLOAD,  # simulated NVML states: the simnvml bucket takes 1 MiB
    Role.ADMIN: MAX_PAYLOAD,
}

REFUSED = Counter(
    "gpudra_bus_payloads_refused_total",
    "Messages not sent because they were larger than the identity may publish.",
    ["root"],
)


class PayloadTooLarge(ValueError):
    """A message larger than this identity may publish; it was not sent."""


def limit(role: Role) -> int:
    return PAYLOAD[role]


def size(data: bytes, headers: dict[str, str] | None) -> int:
    """The bytes nats-server counts: the payload and the header block (``NATS/1.0``,
    each ``Name: value`` line, the blank line)."""
    if not headers:
        return len(data)
    block = 10 + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 2
    return len(data) + block


def check(role: Role, subject: str, data: bytes, headers: dict[str, str] | None = None) -> None:
    """Raise :class:`PayloadTooLarge` (logged, counted) when the message does not fit."""
    have, most = size(data, headers), limit(role)
    if have <= most:
        return
    root = ".".join(subject.split(".")[:2])
    REFUSED.labels(root=root).inc()
    log.error("message too large for this identity; not sent",
              extra={"subject": subject, "bytes": have, "limit": most})  # fmt: skip
    raise PayloadTooLarge(f"{subject}: {have} bytes, {role.value} may publish {most}")
