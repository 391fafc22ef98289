"""The claim watcher's restart: what it reported before comes back from the ``claims``
bucket in one read, and an entry that does not decode is dropped, not fatal."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest
from prometheus_client import REGISTRY

from services.allocator.watcher.watcher import ClaimWatcher, WatcherConfig
from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.kube.resource import ResourceClaim
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect

pytestmark = pytest.mark.integration
MALFORMED = "gpudra_allocator_malformed_bucket_entries_total"
LABELS = {"resource": "claims-bucket"}


def claim(uid: str, reserved: bool) -> ResourceClaim:
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "p1"}]}
    return msgspec.convert(
        {
            "metadata": {"name": f"c-{uid}", "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": status if reserved else {},
        },
        ResourceClaim,
    )


async def test_a_restart_loads_the_bucket_and_drops_what_does_not_decode(
    nats_server: NatsServer,
) -> None:
    watcher_bus = await connect(nats_server, Role.ALLOCATOR)
    try:
        for i in range(40):
            key = subjects.claim_key(f"node-{i % 4}", f"u{i}")
            await watcher_bus.kv_put(subjects.CLAIMS_BUCKET, key, claim(f"u{i}", i % 2 == 0))
        bad = subjects.claim_key("node-0", "bad")
        await (await watcher_bus.kv(subjects.CLAIMS_BUCKET)).put(bad, b"\xc1 not msgpack")
        await watcher_bus.kv_delete(subjects.CLAIMS_BUCKET, subjects.claim_key("node-1", "u1"))
        before = REGISTRY.get_sample_value(MALFORMED, LABELS)
        watcher = ClaimWatcher(cast(Any, None), watcher_bus, WatcherConfig(pending_threshold=60))
        await watcher.load_bucket()
        assert set(watcher.tracked) == {f"u{i}" for i in range(40) if i != 1}
        assert watcher.tracked["u3"].released  # no consumer any more: released
        assert not watcher.tracked["u2"].released
        after = REGISTRY.get_sample_value(MALFORMED, LABELS)
        assert (after or 0) - (before or 0) == 1
        assert bad not in await watcher_bus.kv_keys(subjects.CLAIMS_BUCKET)
    finally:
        await watcher_bus.close()
