"""How much the bus keeps: age, size and message-size limits of every stream and bucket.

Nothing on the bus may grow without bound: a pending claim's events, a flood
of junk, the delete markers of ten thousand finished claims. Streams drop their
oldest messages past their age or size (auditors see how long the trail is
kept in docs/operations.md); buckets refuse a value over their size; a KV
delete leaves a marker that expires on its own (``DELETE_MARKER_TTL_S``), so
keys that come and go (one per claim) leave nothing behind.

Each limit can be changed per deployment with ``GPUDRA_<NAME>_MAX_AGE``
(a duration: 30d, 12h, 90m), ``GPUDRA_<NAME>_MAX_BYTES`` and
``GPUDRA_<NAME>_MAX_MSG_SIZE`` (bytes, or with Ki/Mi/Gi), where NAME is a
stream (CLAIMS, HEALTH, INVENTORY) or ``KV_`` and a bucket (KV_CLAIMS,
KV_INVENTORY, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from services.core.bus import subjects
from services.core.kit.env import env

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DAY = 86400.0
DELETE_MARKER_TTL_S = 15 * 60.0  # watchers away longer than this resync from the keys


@dataclass(frozen=True)
class Limits:
    max_age_s: float  # 0: no age limit
    max_bytes: int
    max_msg_size: int


DEFAULTS: dict[str, Limits] = {
    subjects.CLAIMS_STREAM: Limits(30 * DAY, 1 * GIB, 64 * KIB),
    subjects.HEALTH_STREAM: Limits(7 * DAY, 256 * MIB, 16 * KIB),
    subjects.INVENTORY_EVENTS_STREAM: Limits(1 * DAY, 64 * MIB, 16 * KIB),
    subjects.INVENTORY_BUCKET: Limits(0, 256 * MIB, 1 * MIB),
    subjects.CLAIMS_BUCKET: Limits(0, 512 * MIB, 256 * KIB),
    subjects.PRESENCE_BUCKET: Limits(0, 16 * MIB, 4 * KIB),
    subjects.SIM_BUCKET: Limits(0, 64 * MIB, 1 * MIB),
    subjects.PREPARED_BUCKET: Limits(0, 64 * MIB, 256 * KIB),
    # The max age is the publisher replicas' lease TTL: a lease not renewed is gone.
    subjects.PUBLISHERS_BUCKET: Limits(6, 1 * MIB, 1 * KIB),
    subjects.DOMAINS_BUCKET: Limits(0, 64 * MIB, 4 * KIB),
}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SIZE = re.compile(r"^\s*(\d+)\s*(Ki|Mi|Gi)?\s*$")


class RetentionError(ValueError):
    """A retention setting that does not parse; names the variable."""


BUCKETS = frozenset(
    {
        subjects.INVENTORY_BUCKET,
        subjects.CLAIMS_BUCKET,
        subjects.PRESENCE_BUCKET,
        subjects.SIM_BUCKET,
        subjects.PREPARED_BUCKET,
        subjects.PUBLISHERS_BUCKET,
        subjects.DOMAINS_BUCKET,
    }
)


def setting_name(name: str) -> str:
    """The NAME of a stream's or bucket's variables (a bucket's are prefixed KV_)."""
    return f"KV_{name.upper()}" if name in BUCKETS else name.upper()


def limits(name: str) -> Limits:
    """The limits of stream or bucket ``name``: its defaults, with any override from env."""
    found = DEFAULTS[name]
    prefix = setting_name(name)
    age = env(f"{prefix}-max-age")
    size = env(f"{prefix}-max-bytes")
    msg = env(f"{prefix}-max-msg-size")
    if age:
        found = replace(found, max_age_s=_duration(f"GPUDRA_{prefix}_MAX_AGE", age))
    if size:
        found = replace(found, max_bytes=_size(f"GPUDRA_{prefix}_MAX_BYTES", size))
    if msg:
        found = replace(found, max_msg_size=_size(f"GPUDRA_{prefix}_MAX_MSG_SIZE", msg))
    return found


def _duration(variable: str, value: str) -> float:
    match = _DURATION.match(value)
    if match is None:
        raise RetentionError(f"{variable}: expected a duration like 30d, 12h or 90m, got {value!r}")
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}[match.group(2) or "s"]
    return float(match.group(1)) * scale


def _size(variable: str, value: str) -> int:
    match = _SIZE.match(value)
    if match is None:
        raise RetentionError(f"{variable}: expected bytes like 1048576 or 64Mi, got {value!r}")
    return int(match.group(1)) * {"Ki": KIB, "Mi": MIB, "Gi": GIB, None: 1}[match.group(2)]
