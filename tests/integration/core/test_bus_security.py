"""Attacks on the bus, each tried against a real nats-server with the production
permissions (and, where one is attacked, a real preparer), each asserting that
the server or the service refused it and that nothing changed.

The attacker holds, in turn: nothing; a plain-TCP connection; the credentials
of a compromised component of *another* node; a read-only auditor's; the
provisioning identity's. See docs/security.md for the table these rows fill.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from services.core.bus import provisioning, subjects
from services.core.bus.access import Identity, Role
from services.core.bus.claimtrail import ClaimTrail
from services.core.bus.client import Bus
from services.core.bus.failures import RequestTimeout
from services.core.kube.resource import ResourceClaim
from services.core.model import computedomain as cd
from services.core.model import nvidia
from services.core.model.schemas import (
    ClaimEvent,
    ClaimRef,
    HealthEvent,
    NodeInventory,
    NodeRequest,
    encode,
)
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_events
from tests.helpers.preparer import Dev, Node, make_claim, ref
from tests.helpers.waiting import until

VICTIM = "n1"  # the node attacked
OTHER = "n2"  # a node whose components the attacker has compromised


async def test_no_credentials_or_no_tls_gets_nothing(nats_server: NatsServer) -> None:
    admin = nats_server.credentials(Role.ADMIN)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            nats_server.url, tls=admin.tls(), max_reconnect_attempts=0, allow_reconnect=False
        )
    # TLS is required: a client that talks plain text gets no PONG.
    with socket.create_connection(("127.0.0.1", nats_server.port), timeout=5) as raw:
        info = raw.recv(4096)
        assert b'"tls_required":true' in info
        raw.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := raw.recv(4096):
                answer += chunk
        assert b"PONG" not in answer
    untrusting = ssl.create_default_context()  # the system CAs do not know our server
    with pytest.raises(ssl.SSLCertVerificationError):
        await nats.connect(
            nats_server.url,
            nkeys_seed_str=admin.seed(),
            tls=untrusting,
            max_reconnect_attempts=0,
            allow_reconnect=False,
        )


@pytest.mark.parametrize(
    ("role", "node"),
    [
        (Role.PREPARER, VICTIM),  # even the victim's own preparer
        (Role.FRONT, VICTIM),
        (Role.DISCOVERY, OTHER),
        (Role.PUBLISHER, ""),
        (Role.AUDITOR, ""),
    ],
)
async def test_only_the_claim_watcher_writes_allocations(
    attacker, bus: Bus, role: Role, node: str
) -> None:
    forged = make_claim(VICTIM, [Dev("gpu", "gpu-4")], name="forged")
    key = subjects.claim_key(VICTIM, ref(forged).uid)
    mallory = await attacker(role, node)
    with pytest.raises(nats.errors.TimeoutError):
        await mallory.nc.jetstream().publish(
            f"$KV.{subjects.CLAIMS_BUCKET}.{key}", encode(forged), timeout=1
        )
    await mallory.denied(f"$KV.{subjects.CLAIMS_BUCKET}.{key}")
    assert await bus.kv_keys(subjects.CLAIMS_BUCKET) == []
    watcher = await attacker(Role.ALLOCATOR)  # the one that may
    await watcher.nc.jetstream().publish(f"$KV.{subjects.CLAIMS_BUCKET}.{key}", encode(forged))
    assert await bus.kv_keys(subjects.CLAIMS_BUCKET) == [key]


async def test_a_node_writes_only_its_own_inventory_and_health(attacker, bus: Bus) -> None:
    other = await attacker(Role.DISCOVERY, OTHER)
    empty = NodeInventory(node=VICTIM, driver_version="", cuda_driver_version="", gpus=[])
    subject = f"$KV.{subjects.INVENTORY_BUCKET}.{subjects.inventory_key(VICTIM)}"
    await other.nc.publish(subject, encode(empty))
    await other.denied(subject)
    xid = HealthEvent(node=VICTIM, gpu_uuid="GPU-x", gpu_index=0, kind="xid", xid=79)
    await other.nc.publish(subjects.health(VICTIM), encode(xid))
    await other.denied(subjects.health(VICTIM))
    assert await bus.kv_keys(subjects.INVENTORY_BUCKET) == []


@pytest.mark.parametrize(
    ("role", "node", "event"),
    [
        (Role.PREPARER, OTHER, "prepared"),  # another node's preparer
        (Role.ALLOCATOR, "", "prepared"),  # the allocator says only allocation events
        (Role.PREPARER, VICTIM, "allocated"),  # and the preparer only its own
        (Role.FRONT, VICTIM, "unprepared"),
        (Role.AUDITOR, "", "deleted"),
    ],
)
async def test_nobody_forges_another_services_claim_events(
    attacker, bus: Bus, role: Role, node: str, event: str
) -> None:
    mallory = await attacker(role, node)
    subject = subjects.claim_event("ns", "c", "u", VICTIM, event)
    forged = ClaimEvent(
        event=event,  # type: ignore[arg-type]
        claim=ClaimRef(uid="u", namespace="ns", name="c"),
        node=VICTIM,
        actor="preparer",
    )
    await mallory.nc.publish(subject, encode(forged))
    await mallory.denied(subject)
    assert await stored_claim_events(bus) == []


@pytest.mark.parametrize("role", [Role.ADMIN, Role.ALLOCATOR, Role.AUDITOR])
async def test_nobody_purges_or_deletes_the_audit_trail_or_a_bucket(
    attacker, bus: Bus, nats_server: NatsServer, role: Role
) -> None:
    event = ClaimEvent(
        event="prepared", claim=ClaimRef(uid="u", namespace="ns", name="c"), node=VICTIM,
        actor="preparer",
    )  # fmt: skip
    preparer = await connect(nats_server, Role.PREPARER, VICTIM)
    try:
        await ClaimTrail(preparer).append(event, "u/prepared/1")
    finally:
        await preparer.close()
    mallory = await attacker(role)
    manager = mallory.nc.jetstream(timeout=1)  # the refusal comes as an error, not a reply
    attacks = [
        (manager.purge_stream(subjects.CLAIMS_STREAM), "$JS.API.STREAM.PURGE.CLAIMS"),
        (manager.delete_stream(subjects.CLAIMS_STREAM), "$JS.API.STREAM.DELETE.CLAIMS"),
        (manager.delete_msg(subjects.CLAIMS_STREAM, 1), "$JS.API.STREAM.MSG.DELETE.CLAIMS"),
        (manager.delete_key_value(subjects.CLAIMS_BUCKET), "$JS.API.STREAM.DELETE.KV_claims"),
    ]
    outcomes = await asyncio.gather(
        *(asyncio.wait_for(attack, 10) for attack, _ in attacks), return_exceptions=True
    )  # at once: each refusal is only known when its request times out
    for outcome, (_, subject) in zip(outcomes, attacks, strict=True):
        assert isinstance(outcome, nats.errors.TimeoutError), (subject, outcome)
        await mallory.denied(subject)
    assert [e.event for e in await stored_claim_events(bus)] == ["prepared"]
    assert (await bus.js.stream_info(f"KV_{subjects.CLAIMS_BUCKET}")).config.name


@pytest.mark.parametrize(
    ("role", "bucket", "key"),
    [
        (Role.DISCOVERY, subjects.INVENTORY_BUCKET, subjects.inventory_key(OTHER)),
        (Role.PREPARER, subjects.PREPARED_BUCKET, subjects.prepared_key(OTHER)),
        (Role.FRONT, subjects.PRESENCE_BUCKET, f"{OTHER}.gpu"),
        (Role.IMEX, subjects.DOMAINS_BUCKET, f"d.{subjects.MEMBER}.{OTHER}"),
    ],
)
async def test_a_writer_of_one_key_cannot_roll_up_the_bucket(
    attacker, bus: Bus, role: Role, bucket: str, key: str
) -> None:
    """``Nats-Rollup: all`` on a key an identity may write removed every other key of
    the bucket (every node's inventory, from one node's discovery); a purge of a key
    too. Both are refused by the stream now; its own key stays writable."""
    value = msgspec.json.encode({"other": "nodes"})
    victims = {
        subjects.INVENTORY_BUCKET: subjects.inventory_key(VICTIM),
        subjects.PREPARED_BUCKET: subjects.prepared_key(VICTIM),
        subjects.PRESENCE_BUCKET: f"{VICTIM}.gpu",
        subjects.DOMAINS_BUCKET: f"d.{subjects.MEMBER}.{VICTIM}",
    }
    await (await bus.kv(bucket)).put(victims[bucket], value)
    mallory = (await attacker(role, OTHER)).nc.jetstream(timeout=5)
    await mallory.publish(f"$KV.{bucket}.{key}", value)  # its own key: allowed
    for rollup in ("all", "sub"):
        with pytest.raises(nats.js.errors.APIError, match="rollup"):
            await mallory.publish(
                f"$KV.{bucket}.{key}", b"", headers={"KV-Operation": "PURGE", "Nats-Rollup": rollup}
            )
    assert sorted(await bus.kv_keys(bucket)) == sorted([victims[bucket], key])
    config = (await bus.js.stream_info(f"KV_{bucket}")).config
    assert (config.allow_rollup_hdrs, config.deny_purge) == (False, True)


async def test_a_bucket_made_open_is_closed_by_provisioning(bus: Bus) -> None:
    """A bucket as an earlier release (nats-py's defaults) made it: rollups allowed,
    purges too. Provisioning closes each of ours the same way."""
    await bus.js.create_key_value(bucket="earlier", history=1)
    assert (await bus.js.stream_info("KV_earlier")).config.allow_rollup_hdrs
    await provisioning.close_bucket(bus.js, "earlier")
    config = (await bus.js.stream_info("KV_earlier")).config
    assert (config.allow_rollup_hdrs, config.deny_purge) == (False, True)


async def test_a_rogue_cannot_answer_or_overhear_a_nodes_prepare(attacker) -> None:
    rogue = await attacker(Role.PREPARER, OTHER)
    for driver in (nvidia.DRIVER_NAME, cd.CD_DRIVER):  # both kubelet plugin drivers
        await rogue.nc.subscribe(subjects.node_prepare(VICTIM, driver))
        await rogue.denied(subjects.node_prepare(VICTIM, driver))
    other_front = await attacker(Role.FRONT, OTHER)
    await other_front.nc.publish(subjects.node_prepare(VICTIM, cd.CD_DRIVER), b"{}")
    await other_front.denied(subjects.node_prepare(VICTIM, cd.CD_DRIVER))
    front_inbox = Identity(Role.FRONT, VICTIM).inbox_prefix + ".>"
    await rogue.nc.subscribe(front_inbox)  # read the front's replies
    await rogue.denied(front_inbox)
    await rogue.nc.publish(Identity(Role.FRONT, VICTIM).inbox_prefix + ".x.y", b"{}")  # answer
    await rogue.denied(Identity(Role.FRONT, VICTIM).inbox_prefix + ".x.y")
    auditor = await attacker(Role.AUDITOR)
    await auditor.nc.subscribe(">")  # read everything
    await auditor.denied(">")


# ---------------------------------------------------------------- against a preparer


@pytest.fixture
async def victim(node: Node) -> AsyncIterator[Node]:
    """Node n1 with discovery and a preparer running (see tests/integration/conftest.py)."""
    await node.start_preparer()
    yield node


async def prepared_claim(node: Node) -> ResourceClaim:
    claim = make_claim(node.name, [Dev("gpu", "gpu-5")], name="running")
    await node.put_claim(claim)
    reply = await node.prepare(claim)
    assert reply.claims[ref(claim).uid].error == ""
    return claim


async def test_only_the_nodes_front_can_unprepare_a_running_pods_claim(
    victim: Node, bus: Bus, attacker
) -> None:
    claim = await prepared_claim(victim)
    files = victim.files()
    request = NodeRequest(node=victim.name, claims=[ref(claim)], deadline=time.time() + 5)
    subject = subjects.node_unprepare(victim.name)
    # Another node's front may not publish there at all.
    other_front = await attacker(Role.FRONT, OTHER)
    await other_front.nc.publish(subject, encode(request))
    await other_front.denied(subject)
    # The provisioning identity may publish anything, but the preparer answers only
    # its node's front: no reply, nothing undone.
    with pytest.raises(RequestTimeout, match="no reply"):
        await bus.request(subject, request, ClaimEvent, timeout=2)
    assert victim.files() == files
    assert set(victim.checkpoint().claims) == {ref(claim).uid}


async def test_stored_messages_pushed_at_the_preparer_by_a_consumer_are_refused(
    victim: Node, bus: Bus, attacker
) -> None:
    """A compromised node stores a well-formed unprepare request in its own event
    subject; an auditor's push consumer delivers it to the victim's unprepare
    subject (publish permissions do not cover what JetStream delivers)."""
    claim = await prepared_claim(victim)
    files = victim.files()
    request = NodeRequest(node=victim.name, claims=[ref(claim)], deadline=time.time() + 60)
    other = await attacker(Role.PREPARER, OTHER)
    stored_at = subjects.claim_event("ns", "c", "u", OTHER, "prepared")
    await other.nc.jetstream().publish(stored_at, encode(request))
    auditor = await attacker(Role.AUDITOR)
    seen_before = victim_log_refusals(victim)
    await auditor.nc.jetstream().add_consumer(
        subjects.CLAIMS_STREAM,
        api.ConsumerConfig(
            deliver_subject=subjects.node_unprepare(victim.name),
            filter_subject=stored_at,
            ack_policy=api.AckPolicy.NONE,
        ),
    )
    deadline = time.monotonic() + 10
    while victim_log_refusals(victim) == seen_before:  # the preparer saw it and said no
        assert time.monotonic() < deadline, "the preparer never saw the pushed message"
        await asyncio.sleep(0.05)
    assert victim.files() == files
    assert set(victim.checkpoint().claims) == {ref(claim).uid}


def victim_log_refusals(node: Node) -> int:
    preparer = next(p for p in reversed(node.procs) if p.name == "preparer")
    return preparer.output().count("refusing a foreign message")


async def test_a_nodes_preparer_answers_only_into_its_own_fronts_inbox(
    victim: Node, bus: Bus, attacker
) -> None:
    """The attack of one compromised node (its front and its preparer): the front
    asks its own preparer with a reply subject on another node's unprepare subject
    (or a bucket key, or another node's claim event), and the preparer "answers"
    there with an unprepare request whose own reply sits in the victim's front
    inbox, so the victim's preparer would take it for its front's. With
    ``allow_responses`` the server let that answer through; now a preparer may
    publish replies into its own node's front inbox only."""
    claim = await prepared_claim(victim)
    files = victim.files()
    front = await attacker(Role.FRONT, OTHER)
    preparer = await attacker(Role.PREPARER, OTHER)
    asked = await preparer.nc.subscribe(subjects.node_prepare(OTHER))
    await preparer.nc.flush()
    forged = NodeRequest(node=victim.name, claims=[ref(claim)], deadline=time.time() + 30)
    victim_inbox = Identity(Role.FRONT, victim.name).inbox_prefix + ".forged.1"
    targets = [
        subjects.node_unprepare(victim.name),
        f"$KV.{subjects.CLAIMS_BUCKET}.forged",
        f"$KV.{subjects.INVENTORY_BUCKET}.{subjects.inventory_key(victim.name)}",
        f"$KV.{subjects.DOMAINS_BUCKET}.d.{subjects.INDEX}.0",
        subjects.claim_event("ns", "c", "u", victim.name, "unprepared"),
    ]
    for target in targets:
        await front.nc.publish(subjects.node_prepare(OTHER), b"{}", reply=target)
        request = await asked.next_msg(timeout=5)
        assert request.reply == target
        await preparer.nc.publish(request.reply, encode(forged), reply=victim_inbox)
        await preparer.denied(target)
    # The victim's own front asks next: what came before it has been handled.
    assert (await victim.prepare(claim)).claims[ref(claim).uid].error == ""
    assert victim.files() == files
    assert set(victim.checkpoint().claims) == {ref(claim).uid}
    assert "forged" not in await bus.kv_keys(subjects.CLAIMS_BUCKET)
    assert await bus.kv_keys(subjects.DOMAINS_BUCKET) == []
    trail = await until(lambda: stored_claim_events(bus), "the claim's events")
    assert {e.event for e in trail if e.claim.uid == "u"} == set()
    assert "unprepared" not in {e.event for e in trail if e.claim.uid == ref(claim).uid}


async def test_no_message_over_one_mebibyte(attacker) -> None:
    mallory = await attacker(Role.ADMIN)
    assert mallory.nc.max_payload == 1024 * 1024  # what the server announced it enforces
    with pytest.raises(nats.errors.MaxPayloadError):
        await mallory.nc.publish(
            subjects.claim_event("ns", "c", "u", VICTIM, "prepared"), b"x" * (1 << 20 | 1)
        )


async def test_the_auditor_ends_no_services_watch_but_may_end_its_own_replay(
    attacker, bus: Bus
) -> None:
    """An auditor deletes consumers only on CLAIMS (its replays), never a service's KV
    watch (here the admin's, standing in for the preparer's on KV ``claims``)."""
    watched = await bus.js.add_consumer(
        f"KV_{subjects.CLAIMS_BUCKET}", api.ConsumerConfig(durable_name="a-watch")
    )
    auditor = await attacker(Role.AUDITOR)
    manager = auditor.nc.jetstream(timeout=1)
    with pytest.raises(nats.errors.TimeoutError):
        await asyncio.wait_for(manager.delete_consumer(f"KV_{subjects.CLAIMS_BUCKET}",
                                                       watched.name), 10)  # fmt: skip
    await auditor.denied(f"$JS.API.CONSUMER.DELETE.KV_{subjects.CLAIMS_BUCKET}")
    assert (await bus.js.consumer_info(f"KV_{subjects.CLAIMS_BUCKET}", watched.name)).name

    mine = await manager.add_consumer(
        subjects.CLAIMS_STREAM, api.ConsumerConfig(durable_name="audit-mine")
    )
    assert await manager.delete_consumer(subjects.CLAIMS_STREAM, mine.name)
