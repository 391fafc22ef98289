"""Whether ``CLAIMS`` still reaches back to the start of every live claim's trail.

The stream drops events past its age (``GPUDRA_CLAIMS_MAX_AGE``), so a claim that
lives longer than that loses its first events and ``gpudra audit --verify`` can no
longer show its whole trail. The watcher knows every claim allocated for our
drivers (and when each was created); the stream's usage
(:mod:`services.core.bus.usage`) says when its oldest event was stored and whether
older ones are gone. :func:`record` counts the live claims created before that
oldest event, once the stream has dropped any: a claim's trail starts at or after
its creation, so those are the claims whose first events may be gone (``gpudra audit
--verify`` names the ones that are).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from services.allocator.watcher import metrics
from services.allocator.watcher.lifecycle import Tracked
from services.allocator.watcher.pending import parse_time
from services.core.bus import subjects
from services.core.bus.usage import StreamUsage
from services.core.kube.informer import Informer
from services.core.kube.resource import ResourceClaim


class Watcher(Protocol):
    """What is read of the claim watcher: its claims and what it tracks of them."""

    @property
    def claims(self) -> Informer[ResourceClaim]: ...

    @property
    def tracked(self) -> dict[str, Tracked]: ...


def before_window(
    claims: Iterable[ResourceClaim], tracked: Mapping[str, Tracked], usage: StreamUsage
) -> int:
    """Claims allocated for our drivers (tracked with devices) created before the oldest
    event ``usage``'s stream holds; 0 while it has dropped none."""
    if not usage.dropped:
        return 0
    count = 0
    for claim in claims:
        held = tracked.get(claim.metadata.uid or "")
        if held is None or not held.devices:
            continue
        created = parse_time(claim.metadata.creation_timestamp)
        if usage.first_time is None or created is None or created < usage.first_time:
            count += 1  # an empty stream holds no claim's first event
    return count


def record(watcher: Watcher, usage: StreamUsage) -> None:
    """Set ``gpudra_allocator_claims_before_audit_window`` from a reading of ``CLAIMS``."""
    if usage.stream == subjects.CLAIMS_STREAM:
        found = before_window(watcher.claims.items.values(), watcher.tracked, usage)
        metrics.CLAIMS_BEFORE_AUDIT_WINDOW.set(found)
