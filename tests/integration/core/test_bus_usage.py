"""Each stream's owner reads how full it is with its own identity (the permissions a
cluster grants), and what it reads is the server's truth: the allocator ``CLAIMS`` and the
``claims`` bucket, the publisher its four buckets, the ComputeDomain controller
``domains``; nobody reads another's."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import REGISTRY

from services.core.bus import retention, subjects, usage
from services.core.bus.access import Role
from services.core.bus.usage import StreamUsage
from services.core.model.schemas import PluginPresence
from services.local.natsserver import NatsServer
from services.publisher.app import BUCKETS as PUBLISHER_BUCKETS
from tests.helpers.bus import connect

pytestmark = pytest.mark.integration

OWNERS = {
    Role.ALLOCATOR: [subjects.CLAIMS_STREAM, usage.bucket(subjects.CLAIMS_BUCKET)],
    Role.PUBLISHER: PUBLISHER_BUCKETS,
    Role.DOMAINS: [usage.bucket(subjects.DOMAINS_BUCKET)],
}


async def test_each_owner_reads_its_streams_usage_and_not_anothers(
    nats_server: NatsServer,
) -> None:
    admin = await connect(nats_server, name="admin")
    started = time.time()
    await admin.js.publish("dra.claim.ns.c.u1.n1.allocated", b"{}")
    await admin.kv_put(
        subjects.PRESENCE_BUCKET, "n1.gpu", PluginPresence(node="n1", driver="d", endpoint="/x")
    )
    await admin.close()
    for role, streams in OWNERS.items():
        bus = await connect(nats_server, role, name=f"usage-{role}")
        try:
            for stream in streams:
                got = await usage.read(bus, stream)
                limits = retention.limits(stream.removeprefix("KV_"))
                assert got.max_bytes == limits.max_bytes, stream
                if stream in (subjects.CLAIMS_STREAM, "KV_presence"):
                    assert (got.messages, got.first_seq, got.dropped) == (1, 1, 0), stream
                    assert got.bytes > 0 and got.first_time is not None
                    assert started - 5 < got.first_time < time.time() + 5
            others = [s for r, ss in OWNERS.items() if r != role for s in ss]
            with pytest.raises(asyncio.TimeoutError):  # a permission violation: no answer
                await usage.read(bus, others[0], timeout=0.5)
        finally:
            await bus.close()


async def test_watch_records_each_reading_and_hands_it_on(nats_server: NatsServer) -> None:
    bus = await connect(nats_server, Role.ALLOCATOR, name="usage-watch")
    seen: list[StreamUsage] = []
    task = asyncio.create_task(
        usage.watch(bus, ["NO_SUCH_STREAM", subjects.CLAIMS_STREAM], 0.1, seen.append, 0.3)
    )
    try:
        while len(seen) < 2:
            await asyncio.sleep(0.05)
        assert {u.stream for u in seen} == {subjects.CLAIMS_STREAM}  # the missing one skipped
        labels = {"stream": subjects.CLAIMS_STREAM}
        assert REGISTRY.get_sample_value("gpudra_bus_stream_max_bytes", labels) == (
            retention.limits(subjects.CLAIMS_STREAM).max_bytes
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close()
