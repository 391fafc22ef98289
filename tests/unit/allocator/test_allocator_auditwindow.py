"""Which live claims ``CLAIMS`` may no longer hold the first events of
(``gpudra_allocator_claims_before_audit_window``, the chart's GpudraAuditWindowShort):
claims allocated now, created before the oldest event the stream holds, once it has
dropped any."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
from prometheus_client import REGISTRY

from services.allocator.watcher import auditwindow
from services.allocator.watcher.lifecycle import Tracked
from services.core.bus.usage import StreamUsage
from services.core.kube.resource import ResourceClaim
from services.core.model.schemas import ClaimRef

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def claim(uid: str, created: str | None) -> ResourceClaim:
    meta: dict[str, Any] = {"name": uid, "namespace": "ns", "uid": uid}
    if created:
        meta["creationTimestamp"] = created
    return msgspec.convert({"metadata": meta, "spec": {}}, ResourceClaim)


def tracked(uid: str, devices: bool = True) -> Tracked:
    held = (("gpu", "n1", "gpu-0"),) if devices else ()
    return Tracked(ClaimRef(uid=uid, namespace="ns", name=uid), "n1", held)


def claims_usage(first_seq: int, first_time: float | None, messages: int = 5) -> StreamUsage:
    return StreamUsage("CLAIMS", messages, 1000, 1 << 30, first_seq, first_seq + messages - 1,
                       first_time)  # fmt: skip


CLAIMS = [
    claim("old", "2025-12-31T00:00:00Z"),  # a day before the oldest event kept
    claim("new", "2026-01-01T12:00:00Z"),  # after it
    claim("unknown", None),  # no creation time: counted, it cannot be shown to be covered
    claim("pending-old", "2025-12-01T00:00:00Z"),  # not allocated: no trail to lose
]
TRACKED = {"old": tracked("old"), "new": tracked("new"), "unknown": tracked("unknown"),
           "pending-old": tracked("pending-old", devices=False)}  # fmt: skip


def test_nothing_is_before_the_window_while_the_stream_has_dropped_nothing() -> None:
    assert auditwindow.before_window(CLAIMS, TRACKED, claims_usage(1, T0)) == 0


def test_live_claims_created_before_the_oldest_kept_event_are_counted() -> None:
    assert auditwindow.before_window(CLAIMS, TRACKED, claims_usage(40, T0)) == 2


def test_a_stream_that_dropped_everything_holds_no_live_claims_first_events() -> None:
    emptied = claims_usage(41, None, messages=0)
    assert auditwindow.before_window(CLAIMS, TRACKED, emptied) == 3


@dataclass
class FakeWatcher:
    claims: Any
    tracked: dict[str, Tracked] = field(default_factory=dict)


@dataclass
class Items:
    items: dict[str, ResourceClaim]


def test_record_sets_the_gauge_from_claims_readings_only() -> None:
    watcher = cast(
        auditwindow.Watcher, FakeWatcher(Items({c.metadata.uid or "": c for c in CLAIMS}), TRACKED)
    )

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("gpudra_allocator_claims_before_audit_window")

    auditwindow.record(watcher, claims_usage(40, T0))
    assert gauge() == 2
    auditwindow.record(watcher, StreamUsage("KV_claims", 0, 0, 1, 99, 98, None))  # not CLAIMS
    assert gauge() == 2
    auditwindow.record(watcher, claims_usage(1, T0))
    assert gauge() == 0
