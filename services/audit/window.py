"""What ``CLAIMS`` still holds, and which claims still exist: nothing is lost silently.

A stream keeps its events for a while (``GPUDRA_CLAIMS_MAX_AGE``), so an
auditor must be told when the stored window no longer reaches back to a
claim's first events; a trail gone whole is otherwise never noticed. The
``claims`` bucket, which only the allocator writes, holds every claim that is
allocated now: a live claim whose trail begins before the window (or is not in
it at all) is named. And a stream that refuses events because it is full
(``CLAIMS`` discards new ones, services/core/bus/provisioning.py) is said to be.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from services.audit.replay import Filters
from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.core.model.schemas import SchemaError


@dataclass(frozen=True)
class Window:
    """The stream's state and limits as the server reports them."""

    first_seq: int
    last_seq: int
    messages: int
    bytes: int
    max_bytes: int
    max_msg_size: int
    max_age_s: float

    @property
    def dropped(self) -> int:
        """How many of the stream's first events it no longer holds (age limit)."""
        return self.first_seq - 1 if self.messages else self.last_seq

    @property
    def room(self) -> int:
        return max(0, self.max_bytes - self.bytes) if self.max_bytes > 0 else -1

    @property
    def full(self) -> bool:
        """It may refuse an event now: less room left than its largest event."""
        return 0 <= self.room < self.max_msg_size


async def read_window(bus: Bus) -> Window:
    info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
    state, config = info.state, info.config
    return Window(
        first_seq=state.first_seq,
        last_seq=state.last_seq,
        messages=state.messages,
        bytes=state.bytes,
        max_bytes=config.max_bytes or -1,
        max_msg_size=config.max_msg_size or -1,
        max_age_s=config.max_age or 0.0,
    )


async def live_claims(bus: Bus) -> dict[str, str]:
    """uid -> node of every claim in the ``claims`` bucket (keys ``<node>.<uid>``)."""
    live: dict[str, str] = {}
    for key in await bus.kv_keys(subjects.CLAIMS_BUCKET):
        node, _, uid = key.partition(".")
        try:
            live[subjects.unescape_token(uid)] = subjects.unescape_token(node)
        except (ValueError, IndexError, UnicodeDecodeError):
            continue  # not a key the allocator writes
    return live


async def label(bus: Bus, uid: str, node: str, filters: Filters) -> str | None:
    """``ns/name (uid)`` of a live claim, from its bucket entry; None if ``filters``
    leave it out."""
    key = subjects.claim_key(node, uid)
    try:
        found = await bus.kv_get(subjects.CLAIMS_BUCKET, key, ResourceClaim)
    except SchemaError:
        found = None
    meta = found[0].metadata if found else None
    namespace, name = (meta.namespace or "?", meta.name or "?") if meta else ("?", "?")
    if filters.namespace not in (None, namespace) or filters.claim not in (None, name):
        return None
    return f"{namespace}/{name} ({uid})"


def lines(window: Window, first_time: float | None, from_start: bool) -> list[str]:
    """What an auditor must know about the window before the trails' verdicts."""
    found: list[str] = []
    if from_start and window.dropped:
        since = _when(first_time) if first_time else f"stream seq {window.first_seq}"
        found.append(
            f"WINDOW: CLAIMS holds events from {since} on: its first {window.dropped} are "
            f"gone (max age {_age(window.max_age_s)}); trails that ended before are not "
            "judged, those that began before are reported"
        )
    if window.full:
        found.append(
            f"FULL: CLAIMS refuses new events over {window.room} bytes: it holds "
            f"{window.bytes} of its {window.max_bytes}; new events wait in their emitters "
            "until old ones age out or GPUDRA_CLAIMS_MAX_BYTES is raised"
        )
    return found


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")


def _age(seconds: float) -> str:
    if not seconds:
        return "none"
    return f"{seconds / 86400:g}d" if seconds >= 86400 else f"{seconds:g}s"
