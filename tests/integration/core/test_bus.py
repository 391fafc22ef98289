"""The bus client against a real nats-server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import msgspec
import nats.js
import nats.js.errors
import pytest

from services.core.bus import retention, subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus, KvUpdate
from services.core.bus.failures import RequestFailed, RequestTimeout
from services.core.kit import supervisor
from services.core.model.schemas import (
    ClaimEvent,
    ClaimRef,
    PluginPresence,
    SchemaError,
    decode,
)
from services.core.telemetry.metrics import MALFORMED_MESSAGES
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


class Ping(msgspec.Struct):
    n: int


async def test_provision_is_idempotent(bus: Bus) -> None:
    await bus.provision()
    await bus.provision()
    info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
    assert info.config.subjects == ["dra.claim.>"]


def test_provision_from_the_cli_says_only_what_it_did(nats_server: NatsServer) -> None:
    """Nothing on stderr: asyncio's warning about nats-py's TLS connections (its
    eof_received() "has no effect") was printed by every CLI that connected."""
    argv = [sys.executable, "-m", "services.cli", "provision",
            *nats_server.client_argv(Role.ADMIN)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"provisioned the streams and buckets on {nats_server.url}\n"


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


async def test_a_watch_says_when_it_has_given_every_current_value(bus: Bus) -> None:
    """``current`` is set only after the values the bucket held (a malformed one among
    them, skipped) were all given, never at a later change; at once for an empty one."""
    seen: list[str] = []
    empty = asyncio.Event()

    async def watch(current: asyncio.Event, bucket: str) -> None:
        async for update in bus.watch_kv(bucket, PluginPresence, current=current):
            seen.append(update.key)

    empty_watch = asyncio.create_task(watch(empty, subjects.PREPARED_BUCKET))
    await asyncio.wait_for(empty.wait(), 10)
    kv = await bus.kv(subjects.PRESENCE_BUCKET)
    for i in range(50):
        p = PluginPresence(node=f"n{i}", driver="gpu.nvidia.com", endpoint="/x")
        await bus.kv_put(subjects.PRESENCE_BUCKET, f"k{i:02d}", p)
    await kv.put("k99-bad", b"\xc1 not msgpack")  # the last current value does not decode
    current = asyncio.Event()
    task = asyncio.create_task(watch(current, subjects.PRESENCE_BUCKET))
    try:
        await asyncio.wait_for(current.wait(), 10)
        assert seen == [f"k{i:02d}" for i in range(50)]
        p = PluginPresence(node="late", driver="gpu.nvidia.com", endpoint="/x")
        await bus.kv_put(subjects.PRESENCE_BUCKET, "late", p)
        while "late" not in seen:
            await asyncio.sleep(0.01)
    finally:
        for each in (task, empty_watch):
            each.cancel()
        await asyncio.gather(task, empty_watch, return_exceptions=True)


async def test_kv_keys_are_the_live_keys_read_to_the_end(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live keys, deleted keys and an empty bucket, also when the consumer's info
    answers after every delivery arrived (the end is counted from what the server
    says it delivered, not guessed from what arrived before its answer)."""
    value = PluginPresence(node="n", driver="gpu.nvidia.com", endpoint="/x")
    assert await bus.kv_keys(subjects.PRESENCE_BUCKET) == []
    for i in range(20):
        await bus.kv_put(subjects.PRESENCE_BUCKET, f"n{i}", value)
    for i in range(0, 20, 2):
        await bus.kv_delete(subjects.PRESENCE_BUCKET, f"n{i}")
    live = sorted(f"n{i}" for i in range(1, 20, 2))
    assert sorted(await bus.kv_keys(subjects.PRESENCE_BUCKET)) == live
    answer = nats.js.JetStreamContext.PushSubscription.consumer_info

    async def late(sub: nats.js.JetStreamContext.PushSubscription) -> object:
        await asyncio.sleep(0.3)
        return await answer(sub)

    monkeypatch.setattr(nats.js.JetStreamContext.PushSubscription, "consumer_info", late)
    assert sorted(await bus.kv_keys(subjects.PRESENCE_BUCKET)) == live
    assert await bus.kv_keys(subjects.CLAIMS_BUCKET) == []


async def test_kv_read_gives_each_live_key_its_latest_value_in_one_pass(bus: Bus) -> None:
    """Rewritten keys give their latest value, deleted keys none, ``keys`` filters, a
    malformed value comes back raw for the reader to judge, an empty bucket reads empty."""
    assert await bus.kv_read(subjects.PRESENCE_BUCKET) == []
    for i in range(12):
        value = PluginPresence(node=f"n{i}", driver="gpu.nvidia.com", endpoint="/first")
        await bus.kv_put(subjects.PRESENCE_BUCKET, f"n{i}.gpu", value)
    for i in range(0, 12, 3):
        await bus.kv_delete(subjects.PRESENCE_BUCKET, f"n{i}.gpu")
    for i in range(1, 12, 3):
        value = PluginPresence(node=f"n{i}", driver="gpu.nvidia.com", endpoint="/second")
        await bus.kv_put(subjects.PRESENCE_BUCKET, f"n{i}.gpu", value)
    kv = await bus.kv(subjects.PRESENCE_BUCKET)
    await kv.put("n99.gpu", b"\xc1 not msgpack")
    read = {e.key: e for e in await bus.kv_read(subjects.PRESENCE_BUCKET)}
    live = {f"n{i}.gpu" for i in range(12) if i % 3} | {"n99.gpu"}
    assert set(read) == live
    assert read["n99.gpu"].value == b"\xc1 not msgpack"
    for i in range(1, 12):
        if i % 3:
            found = decode(read[f"n{i}.gpu"].value or b"", PluginPresence)
            assert found.endpoint == ("/second" if i % 3 == 1 else "/first")
            stored = await bus.kv_get(subjects.PRESENCE_BUCKET, f"n{i}.gpu", PluginPresence)
            assert stored is not None and read[f"n{i}.gpu"].revision == stored[1]
    assert [e.key for e in await bus.kv_read(subjects.PRESENCE_BUCKET, "n1.*")] == ["n1.gpu"]


async def test_durable_pull_replays_claim_events(bus: Bus) -> None:
    ref = ClaimRef(uid="u1", namespace="ns", name="c")
    for event in ("prepare.requested", "prepared"):
        await bus.publish(
            subjects.claim_event("ns", "c", "u1", "node.a", event),
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


async def test_serve_runs_at_most_max_inflight_and_stop_serving_lets_them_answer(
    nats_server: NatsServer, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Bus, "max_inflight", 3)
    server = await connect(nats_server, name="limited")
    release = asyncio.Event()
    running = 0
    peak = 0

    async def slow(value: Ping, headers: dict[str, str]) -> Ping:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return Ping(value.n * 2)

    try:
        await server.serve("svc.limited", Ping, slow)
        calls = [
            asyncio.create_task(bus.request("svc.limited", Ping(i), Ping, timeout=5))
            for i in range(10)
        ]
        while server.inflight < 3:
            await asyncio.sleep(0.01)
        assert running == 3  # the other 7 wait in the client, not in tasks
        stopping = asyncio.create_task(server.stop_serving(timeout=20))
        await asyncio.sleep(0.1)
        assert not stopping.done()  # waits for the three running ones
        release.set()
        await stopping
        done = await asyncio.gather(*calls, return_exceptions=True)
        replies = [r for r in done if isinstance(r, Ping)]
        assert peak == 3 and len(replies) >= 3, (peak, done)
        # The rest were never taken: the caller sees a failed request, not a lost answer.
        assert all(isinstance(r, Ping | RequestFailed) for r in done), done
        with pytest.raises(RequestFailed):  # nobody serves it any more
            await bus.request("svc.limited", Ping(1), Ping, timeout=0.5)
    finally:
        await server.close()


async def test_an_unknown_schema_version_or_a_too_deep_payload_is_refused_and_counted(
    bus: Bus,
) -> None:
    """A newer writer's payload is not read as ours, and a hostile one stops nothing."""
    before = MALFORMED_MESSAGES.labels(source="kv:presence")._value.get()
    future = PluginPresence(node="n1", driver="gpu.nvidia.com", endpoint="/x", schema_version=99)
    kv = await bus.kv(subjects.PRESENCE_BUCKET)
    await kv.put("future", msgspec.msgpack.encode(future))
    with pytest.raises(SchemaError, match="schema_version 99 is not one this build reads"):
        await bus.kv_get(subjects.PRESENCE_BUCKET, "future", PluginPresence)
    fields = msgspec.msgpack.encode({"node": "n3", "driver": "d", "endpoint": "/z"})
    deep = b"\x84" + fields[1:] + b"\xa1x" + b"\x91" * 2000 + b"\xc0"  # x: [[[...]]] 2,000 deep
    await kv.put("deep", deep)
    with pytest.raises(SchemaError, match="nested too deeply"):
        await bus.kv_get(subjects.PRESENCE_BUCKET, "deep", PluginPresence)
    good = PluginPresence(node="n2", driver="gpu.nvidia.com", endpoint="/y")
    await bus.kv_put(subjects.PRESENCE_BUCKET, "good", good)
    seen = []
    async for update in bus.watch_kv(subjects.PRESENCE_BUCKET, PluginPresence):
        seen.append(update.key)
        if update.key == "good":
            break
    assert seen == ["good"]  # the other two were skipped, not fatal
    assert MALFORMED_MESSAGES.labels(source="kv:presence")._value.get() >= before + 2
    with pytest.raises(nats.js.errors.BadRequestError, match="message size exceeds maximum"):
        await kv.put("huge", b"\x00" * (retention.DEFAULTS["presence"].max_msg_size + 1))


async def test_a_connection_the_client_gives_up_on_stops_the_process(
    nats_server: NatsServer,
) -> None:
    """nats-py closes for good on a server error while connected (an auth callout that
    did not answer in time, an expired token); the process must then stop (exit 1) so
    that its orchestrator restarts it, not serve on with a dead connection."""
    tasks = supervisor.current()
    healthy = await connect(nats_server, Role.PUBLISHER, name="healthy")
    await healthy.close()
    await asyncio.sleep(0)  # the close callback has run
    assert tasks.failure is None and not tasks.stopped.is_set()
    doomed = await connect(nats_server, Role.PUBLISHER, name="doomed")
    # A line the server answers with -ERR 'Unknown Protocol Operation' (then it hangs up).
    doomed.nc._transport.write(b"FOO BAR\r\n")  # type: ignore[union-attr]
    await asyncio.wait_for(tasks.stopped.wait(), 60)
    assert tasks.failure == "the bus connection 'doomed' closed for good"
    assert doomed.nc.is_closed
