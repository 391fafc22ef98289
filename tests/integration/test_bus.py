"""The bus client against a real nats-server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from services.core import subjects
from services.core.bus import Bus, KvUpdate, RequestFailed, RequestTimeout
from services.core.metrics import MALFORMED_MESSAGES
from services.core.schemas import ClaimEvent, ClaimRef, PluginPresence

pytestmark = pytest.mark.integration


async def test_provision_is_idempotent(bus: Bus) -> None:
    await bus.provision()
    await bus.provision()
    info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
    assert info.config.subjects == ["dra.claim.>"]


async def test_kv_round_trip_and_watch_skips_malformed(bus: Bus) -> None:
    before = MALFORMED_MESSAGES.labels(source="kv:presence")._value.get()
    seen: list[KvUpdate[PluginPresence]] = []

    async def watch() -> None:
        async for update in bus.watch_kv(subjects.PRESENCE_BUCKET, PluginPresence):
            seen.append(update)
            if len(seen) == 2:
                return

    kv = await bus.kv(subjects.PRESENCE_BUCKET)
    await kv.put("bad", b"\xc1 not msgpack")
    p = PluginPresence(node="n1", driver="gpu.nvidia.com", endpoint="/x")
    await bus.kv_put(subjects.PRESENCE_BUCKET, "good", p)
    task = asyncio.create_task(watch())
    while not seen:
        await asyncio.sleep(0.01)
    await bus.kv_delete(subjects.PRESENCE_BUCKET, "good")
    await asyncio.wait_for(task, 5)
    assert [u.key for u in seen] == ["good", "good"]
    assert seen[0].value == p and seen[1].value is None
    assert MALFORMED_MESSAGES.labels(source="kv:presence")._value.get() == before + 1
    assert await bus.kv_get(subjects.PRESENCE_BUCKET, "good", PluginPresence) is None


async def test_durable_pull_replays_claim_events(bus: Bus) -> None:
    ref = ClaimRef(uid="u1", namespace="ns", name="c")
    for event in ("prepare.requested", "prepared"):
        await bus.publish(
            subjects.claim_event("node.a", event.split(".")[0]),
            ClaimEvent(event=event, claim=ref, node="node.a", actor="test"),
            headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        )
    got: list[ClaimEvent] = []
    async for delivery in bus.pull(
        subjects.CLAIMS_STREAM, "auditor", subjects.claim_events_all(), ClaimEvent
    ):
        got.append(delivery.value)
        assert delivery.headers["traceparent"].startswith("00-111")
        await delivery.ack()
        if len(got) == 2:
            break
    assert [e.event for e in got] == ["prepare.requested", "prepared"]
    assert got[0].node == "node.a"


async def test_request_reply_and_timeout(bus: Bus) -> None:
    class Ping(msgspec.Struct):
        n: int

    async def double(value: Ping, headers: dict[str, str]) -> Ping:
        return Ping(value.n * 2)

    await bus.serve("svc.double", Ping, double)
    assert (await bus.request("svc.double", Ping(21), Ping, timeout=2)).n == 42
    with pytest.raises(RequestFailed, match=r"no responder on svc\.nobody"):
        await bus.request("svc.nobody", Ping(1), Ping, timeout=0.3)

    async def slow(value: Ping, headers: dict[str, str]) -> Ping:
        await asyncio.sleep(1)
        return value

    await bus.serve("svc.slow", Ping, slow)
    with pytest.raises(RequestTimeout, match=r"no reply on svc\.slow within 0\.2s"):
        await bus.request("svc.slow", Ping(1), Ping, timeout=0.2)
