"""Consumer quotas per identity, tried on a real nats-server with the production permissions.

A front, the least privileged identity, once made 1,000 durable consumers on
``KV_inventory`` in 2.1 s; the publisher's inventory watch was then refused
("maximum consumers limit reached": nats-server 2.15 allows 1,000 per stream by
default) for as long as they stayed, and durables stay. Now an identity creates
consumers only under its own few names (services/core/bus/slots.py), whatever it
asks for, and a watch that cannot get one waits: logged, counted, asked again.
"""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import api

from services.core.bus import ordered, payloads, provisioning, slots, subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.bus.failures import RequestFailed
from services.core.model.schemas import (
    ClaimRef,
    NodeInventory,
    NodeReply,
    NodeRequest,
    PluginPresence,
)
from services.local.natsserver import NatsServer
from tests.helpers.attacker import Attacker, MakeAttacker
from tests.helpers.bus import connect

pytestmark = pytest.mark.integration

FLOOD = 1000


def _config(attacker: Attacker, name: str = "", durable: bool = True) -> dict[str, object]:
    config = api.ConsumerConfig(
        name=name or None,
        durable_name=name if durable and name else None,
        deliver_subject=attacker.nc.new_inbox(),  # push, to its own inbox: it never goes idle
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=365 * 86400.0,
    )
    return config.as_dict()


async def _flood(attacker: Attacker, stream: str, count: int) -> dict[str, str]:
    """``count`` creation requests of every kind, sent at once (a refused request is never
    answered); one subject of each kind."""
    replies = attacker.nc.new_inbox()
    answered: list[bool] = []

    async def on_reply(msg: Msg) -> None:
        answered.append("error" not in json.loads(msg.data))

    await attacker.nc.subscribe(f"{replies}.>", cb=on_reply)
    own = slots.consumer_names(attacker.identity.name)
    api_ = f"$JS.API.CONSUMER.{{}}.{stream}"
    kinds = {
        "durable": lambda i: (api_.format("DURABLE.CREATE") + f".d{i}", _config(attacker, f"d{i}")),
        "ephemeral": lambda i: (api_.format("CREATE"), _config(attacker, durable=False)),
        "named": lambda i: (api_.format("CREATE") + f".n{i}", _config(attacker, f"n{i}")),
        "own names": lambda i: (
            api_.format("CREATE") + f".{own[i % len(own)]}",
            _config(attacker, own[i % len(own)]),
        ),
    }
    first: dict[str, str] = {}
    for i in range(count):
        kind = list(kinds)[i % len(kinds)]
        subject, config = kinds[kind](i)
        first.setdefault(kind, subject)
        body = json.dumps({"stream_name": stream, "config": config}).encode()
        await attacker.nc.publish(subject, body, reply=f"{replies}.{i}")
    await attacker.nc.flush()
    deadline = time.monotonic() + 10
    while len(answered) < count // len(kinds) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # its own names are answered (granted, or updated)
    return first


async def _consumers(bus: Bus, stream: str) -> int:
    return (await bus.js.stream_info(stream)).state.consumer_count


async def test_a_front_holds_at_most_its_own_few_consumers_and_the_publisher_still_watches(
    attacker: MakeAttacker, bus: Bus, nats_server: NatsServer
) -> None:
    """1,000 creations of every kind (durable, ephemeral, named, its own names over and
    over) by one node's front on KV_inventory: its own names are granted, nothing else;
    the publisher's watch opens and reads the inventory."""
    inventory = f"KV_{subjects.INVENTORY_BUCKET}"
    n2 = NodeInventory(node="n2", driver_version="", cuda_driver_version="", gpus=[])
    await bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key("n2"), n2)
    mallory = await attacker(Role.FRONT, "n1")
    started = time.monotonic()
    first = await _flood(mallory, inventory, FLOOD)
    took = time.monotonic() - started
    held = await _consumers(bus, inventory)
    assert held <= slots.SLOTS, f"{held} consumers made in {took:.1f} s"
    for kind in ("durable", "ephemeral", "named"):
        assert mallory.refused(first[kind]), (kind, mallory.errors[-3:])
    publisher = await connect(nats_server, Role.PUBLISHER, name="publisher")
    try:
        watch = publisher.watch_kv(subjects.INVENTORY_BUCKET, NodeInventory)
        update = await asyncio.wait_for(anext(watch), 10)
        assert update.value == n2
        await watch.aclose()
        keys = await asyncio.wait_for(publisher.kv_keys(subjects.INVENTORY_BUCKET), 10)
        assert keys == [subjects.inventory_key("n2")]
    finally:
        await publisher.close()


@pytest.mark.parametrize(
    ("role", "node", "stream"),
    [
        (Role.FRONT, "n1", f"KV_{subjects.INVENTORY_BUCKET}"),  # a stream it reads
        (Role.FRONT, "n1", f"KV_{subjects.CLAIMS_BUCKET}"),  # one it does not
        (Role.PREPARER, "n1", f"KV_{subjects.CLAIMS_BUCKET}"),
        (Role.DISCOVERY, "n1", f"KV_{subjects.INVENTORY_BUCKET}"),
        (Role.IMEX, "n1", f"KV_{subjects.DOMAINS_BUCKET}"),
        (Role.PUBLISHER, "", f"KV_{subjects.PRESENCE_BUCKET}"),
    ],
)
async def test_no_service_identity_creates_a_durable_or_unnamed_consumer(
    attacker: MakeAttacker, bus: Bus, role: Role, node: str, stream: str
) -> None:
    mallory = await attacker(role, node)
    manager = mallory.nc.jetstream(timeout=1)
    for config in (
        api.ConsumerConfig(durable_name="mallory"),  # $JS.API.CONSUMER.DURABLE.CREATE
        api.ConsumerConfig(name="mallory"),  # $JS.API.CONSUMER.CREATE.<stream>.mallory
        api.ConsumerConfig(deliver_subject=mallory.nc.new_inbox()),  # legacy ephemeral
    ):
        with pytest.raises(nats.errors.TimeoutError):
            await manager.add_consumer(stream, config)
    assert await _consumers(bus, stream) == 0
    for subject in ("DURABLE.CREATE", "CREATE"):
        assert mallory.refused(f"$JS.API.CONSUMER.{subject}.{stream}"), mallory.errors


async def test_a_watch_refused_a_consumer_waits_logged_and_counted_then_opens(
    attacker: MakeAttacker, bus: Bus, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every name of the publisher's identity held (a crashed replica's consumers, or a
    thief with its key), then the stream's consumer limit reached: its watch neither
    fails nor crashes the service; it says why, counts, and opens once a name is free."""
    presence = f"KV_{subjects.PRESENCE_BUCKET}"
    await bus.kv_put(subjects.PRESENCE_BUCKET, "n1.gpu", PluginPresence(
        node="n1", driver="gpu", endpoint="/e"))  # fmt: skip
    thief = await attacker(Role.PUBLISHER)
    manager = thief.nc.jetstream(timeout=5)
    names = slots.consumer_names(thief.identity.name)
    for name in names:
        await manager.add_consumer(presence, api.ConsumerConfig(name=name, durable_name=name))
    publisher = await connect(nats_server, Role.PUBLISHER, name="publisher")
    refused = ordered.REFUSALS.labels(stream=presence, reason="every name held")
    before = refused._value.get()
    watch = publisher.watch_kv(subjects.PRESENCE_BUCKET, PluginPresence)
    first = asyncio.ensure_future(anext(watch))
    try:
        while refused._value.get() < before + 2:
            assert not first.done(), first
            await asyncio.sleep(0.1)
        assert "consumer refused; asking again" in caplog.text
        for name in names[1:]:
            await manager.delete_consumer(presence, name)
        update = await asyncio.wait_for(first, 30)
        assert update.key == "n1.gpu"
    finally:
        first.cancel()
        await watch.aclose()
        await publisher.close()


async def test_a_watch_refused_by_the_streams_consumer_limit_opens_once_there_is_room(
    bus: Bus, nats_server: NatsServer
) -> None:
    presence = f"KV_{subjects.PRESENCE_BUCKET}"
    await bus.kv_put(subjects.PRESENCE_BUCKET, "n1.gpu", PluginPresence(
        node="n1", driver="gpu", endpoint="/e"))  # fmt: skip
    info = await bus.js.stream_info(presence)
    info.config.max_consumers = 1
    await bus.js.update_stream(info.config)
    await bus.js.add_consumer(presence, api.ConsumerConfig(durable_name="full"))
    front = await connect(nats_server, Role.FRONT, "n1", name="front")
    refused = ordered.REFUSALS.labels(stream=presence, reason="stream limit")
    before = refused._value.get()
    watch = front.watch_kv(subjects.PRESENCE_BUCKET, PluginPresence)
    first = asyncio.ensure_future(anext(watch))
    try:
        while refused._value.get() < before + 1:
            assert not first.done(), first
            await asyncio.sleep(0.1)
        await bus.js.delete_consumer(presence, "full")
        assert (await asyncio.wait_for(first, 30)).key == "n1.gpu"
    finally:
        first.cancel()
        await watch.aclose()
        await front.close()


async def test_every_stream_and_bucket_takes_every_identitys_consumers(bus: Bus) -> None:
    """nats-server 2.15 allows 1,000 consumers per stream that sets no limit: the
    watches of 334 nodes (front, preparer and discovery each watch ``inventory``). One
    identity's few names are the bound; the streams leave room for all of them."""
    streams = [*provisioning.STREAMS, *(f"KV_{b}" for b in provisioning.BUCKETS)]
    for stream in streams:
        config = (await bus.js.stream_info(stream)).config
        assert config.max_consumers == provisioning.MAX_CONSUMERS, stream


async def test_a_message_over_the_identitys_payload_is_not_sent_and_the_bus_stays_up(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A front may publish 512 KiB (its largest real request, 512 claims with the longest
    names, is 237 KiB). A larger one is refused before it is sent, logged and counted;
    the connection stays (nats-server closes one that exceeds a payload limit)."""
    front = await connect(nats_server, Role.FRONT, "n1", name="front")
    try:
        subject = subjects.node_prepare("n1")
        refused = payloads.REFUSED.labels(root="dra.node")
        before = refused._value.get()
        claims = [ClaimRef(uid=f"{i:036d}", namespace="n" * 63, name="c" * 253)
                  for i in range(2000)]  # fmt: skip
        huge = NodeRequest(node="n1", claims=claims, deadline=0)
        with pytest.raises(payloads.PayloadTooLarge, match="kubeletplugin may publish 524288"):
            await front.request(subject, huge, NodeReply, timeout=1)
        assert refused._value.get() == before + 1
        assert "message too large for this identity; not sent" in caplog.text
        with pytest.raises(RequestFailed):  # sent: nobody answers here
            await front.request(subject, NodeRequest(node="n1", claims=[], deadline=0),
                                NodeReply, timeout=1)  # fmt: skip
        assert front.nc.is_connected
    finally:
        await front.close()
