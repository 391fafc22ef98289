"""Every NATS subject, stream and KV bucket name gpudra uses, in one place.

Names that come from users (node, namespace, claim) pass through
:func:`escape_token` before they become a subject token or a KV key, so a
hostile or merely unusual name can never widen a subscription (``*``, ``>``),
split a token (``.``) or break the protocol line (whitespace).
"""

from __future__ import annotations

import re

from services.core.model.computedomain import CD_DRIVER
from services.core.model.nvidia import DRIVER_NAME

# Streams and buckets.
CLAIMS_STREAM = "CLAIMS"
HEALTH_STREAM = "HEALTH"
INVENTORY_EVENTS_STREAM = "INVENTORY"
INVENTORY_BUCKET = "inventory"
CLAIMS_BUCKET = "claims"
PRESENCE_BUCKET = "presence"
SIM_BUCKET = "simnvml"
PREPARED_BUCKET = "prepared"  # key = node: devices its prepared claims hold
PUBLISHERS_BUCKET = "publishers"  # publisher replicas' shard leases (services.publisher.shards)
DOMAINS_BUCKET = "domains"  # ComputeDomain membership: <uid>.member.<node>, <uid>.index.<node>

# Subject roots.
CLAIM_ROOT = "dra.claim"
HEALTH_ROOT = "dra.health"
INVENTORY_ROOT = "dra.inventory"
NODE_ROOT = "dra.node"
SIM_ROOT = "dra.sim"
DOMAIN_ROOT = "dra.domain"

_SAFE = re.compile(r"[A-Za-z0-9_-]")


def escape_token(value: str) -> str:
    """Escape one user-supplied name into a single, literal subject token.

    Letters, digits, ``_`` and ``-`` pass through; every other byte of the
    UTF-8 encoding becomes ``=XX`` (and ``=`` itself is escaped), so the mapping
    is reversible and injective. The empty string becomes ``=``.
    """
    if value == "":
        return "="
    out: list[str] = []
    for ch in value:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"={b:02X}" for b in ch.encode())
    return "".join(out)


def unescape_token(token: str) -> str:
    """Inverse of :func:`escape_token`."""
    if token == "=":
        return ""
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "=":
            raw.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(token[i].encode())
            i += 1
    return raw.decode()


# Device path.
def inventory_changed(node: str) -> str:
    return f"{INVENTORY_ROOT}.{escape_token(node)}.changed"


def inventory_changed_all() -> str:
    return f"{INVENTORY_ROOT}.*.changed"


def health(node: str) -> str:
    return f"{HEALTH_ROOT}.{escape_token(node)}"


def health_all() -> str:
    return f"{HEALTH_ROOT}.>"


def inventory_key(node: str) -> str:
    return escape_token(node)


def prepared_key(node: str) -> str:
    return escape_token(node)


def presence_key(node: str, driver: str) -> str:
    return f"{escape_token(node)}.{escape_token(driver)}"


# Claim path.
#: Tokens after ``dra.claim``: namespace, claim name, claim UID, node, then the
#: event (one or two tokens, e.g. ``prepared``, ``prepare.requested``).
CLAIM_EVENT_TOKENS = ("namespace", "claim", "uid", "node")
NO_NODE = ""  # a claim event about no node (``pending``): its node token is ``=``


def claim_event(namespace: str, name: str, uid: str, node: str, event: str) -> str:
    """``dra.claim.<namespace>.<claim>.<uid>.<node>.<event>``; ``event`` is one of our
    fixed names, every other token is escaped, so an auditor's filter on any of
    them is done by the server and matches that claim or node only."""
    names = (namespace, name, uid, node)
    return ".".join((CLAIM_ROOT, *(escape_token(n) for n in names), event))


def claim_trail(namespace: str, name: str, uid: str) -> str:
    """Every event of one claim, on every node (any node's preparer may publish here)."""
    return ".".join((CLAIM_ROOT, *(escape_token(n) for n in (namespace, name, uid)), ">"))


def claim_node_trail(namespace: str, name: str, uid: str, node: str) -> str:
    """One claim's events on one node (``node`` empty: about no node): the subjects only
    the allocator and that node's preparer may publish, over which their events are
    numbered (services/core/bus/claimtrail.py)."""
    names = (namespace, name, uid, node)
    return ".".join((CLAIM_ROOT, *(escape_token(n) for n in names), ">"))


def claim_events_all() -> str:
    return f"{CLAIM_ROOT}.>"


def claim_events(
    namespace: str | None = None,
    name: str | None = None,
    node: str | None = None,
    event: str | None = None,
) -> str:
    """A filter on claim events: each given name matches exactly, the rest match any."""
    tokens = [escape_token(v) if v is not None else "*" for v in (namespace, name)]
    tokens.append("*")  # uid
    tokens.append(escape_token(node) if node is not None else "*")
    tokens.append(event if event is not None else ">")
    return ".".join((CLAIM_ROOT, *tokens))


def claim_event_publishers(node_token: str, event: str) -> str:
    """The permission pattern for publishing ``event`` about any claim on one node
    (``node_token`` is an escaped node name, or ``*``)."""
    return f"{CLAIM_ROOT}.*.*.*.{node_token}.{event}"


def claim_key(node: str, uid: str) -> str:
    return f"{escape_token(node)}.{escape_token(uid)}"


#: The kubelet plugins' drivers, each with its own prepare/unprepare subjects: the
#: GPU driver's are ``dra.node.<node>.prepare``, the ComputeDomain driver's
#: ``dra.node.<node>.domain.prepare`` (so that a grant names each one exactly).
_DRIVER_PART = {DRIVER_NAME: "", CD_DRIVER: "domain."}


def node_prepare(node: str, driver: str = DRIVER_NAME) -> str:
    return f"{NODE_ROOT}.{escape_token(node)}.{_DRIVER_PART[driver]}prepare"


def node_unprepare(node: str, driver: str = DRIVER_NAME) -> str:
    return f"{NODE_ROOT}.{escape_token(node)}.{_DRIVER_PART[driver]}unprepare"


def node_operation_template(op: str, driver: str = DRIVER_NAME) -> str:
    """The subject with ``{node}`` in place of the node, for span names."""
    return f"{NODE_ROOT}.{{node}}.{_DRIVER_PART[driver]}{op}"


# ComputeDomains: membership (one key per domain and node) and status events.
MEMBER, INDEX = "member", "index"


def domain_member_key(uid: str, node: str) -> str:
    """A node's IMEX daemon in one domain; written only by that node's daemon."""
    return f"{escape_token(uid)}.{MEMBER}.{escape_token(node)}"


def domain_index_key(uid: str, node: str) -> str:
    """A node's index in its clique; written only by the controller, kept across restarts."""
    return f"{escape_token(uid)}.{INDEX}.{escape_token(node)}"


def domain_keys(uid: str) -> str:
    return f"{escape_token(uid)}.>"


def parse_domain_key(key: str) -> tuple[str, str, str] | None:
    """``(uid, "member"|"index", node)`` for a key of the domains bucket, else None."""
    parts = key.split(".")
    if len(parts) != 3 or parts[1] not in (MEMBER, INDEX):
        return None
    try:
        return unescape_token(parts[0]), parts[1], unescape_token(parts[2])
    except (ValueError, UnicodeDecodeError):
        return None


def domain_status(uid: str) -> str:
    return f"{DOMAIN_ROOT}.{escape_token(uid)}.status"


def domain_status_all() -> str:
    return f"{DOMAIN_ROOT}.*.status"


# Simulated NVML control (tests and `gpudra sim`).
def sim_control(node: str) -> str:
    return f"{SIM_ROOT}.{escape_token(node)}"


def matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` falls under ``pattern`` (NATS wildcards ``*`` and ``>``)."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)
