"""The audit trail is evidence against one compromised node (issue 22, point 4).

The attacker holds the preparer identity of node ``n2`` (its real nkey, on the
real nats-server with the production permissions) and plays by none of our
rules: a raw NATS client. What it may publish is only its own node's preparer
subjects, ``dra.claim.*.*.*.n2.{prepare.*,prepared,unprepare.*,unprepared}``,
and it may read any claim's last event. Each test tries one attack that worked
on the build before and asserts that the trail, and ``gpudra audit --verify``,
still tell the truth about node ``n1``'s claim.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import api

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.claimtrail import MSG_ID, SEQ_HEADER, ClaimTrail
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, ClaimEventName, ClaimRef, encode
from services.local.natsserver import NatsServer
from tests.helpers.attacker import MakeAttacker
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_subjects
from tests.helpers.preparer import Dev, make_claim
from tests.integration.core.test_claim_trail import audit

VICTIM = "n1"  # the node whose claim is attacked
OTHER = "n2"  # the node whose preparer the attacker holds
CLAIM = ClaimRef(uid="victim-uid", namespace="ns", name="train")


@pytest.fixture
async def emitters(nats_server: NatsServer) -> AsyncIterator[tuple[ClaimTrail, ClaimTrail]]:
    """The claim's honest emitters: the allocator and the victim node's preparer."""
    allocator = await connect(nats_server, Role.ALLOCATOR)
    preparer = await connect(nats_server, Role.PREPARER, VICTIM)
    try:
        yield ClaimTrail(allocator), ClaimTrail(preparer)
    finally:
        await allocator.close()
        await preparer.close()


def event(name: ClaimEventName, node: str = VICTIM, claim: ClaimRef = CLAIM) -> ClaimEvent:
    actor = "allocator" if name in ("allocated", "reserved", "released", "deleted") else "preparer"
    return ClaimEvent(event=name, claim=claim, node=node, actor=actor)


async def prepared_on_the_victim(emitters: tuple[ClaimTrail, ClaimTrail]) -> list[ClaimEvent]:
    """The claim allocated to n1, reserved, prepared there: still in use."""
    allocator, preparer = emitters
    return [
        await allocator.append(event("allocated"), "a/allocated"),
        await allocator.append(event("reserved"), "a/reserved"),
        await preparer.append(event("prepare.requested"), "p/prepare.requested"),
        await preparer.append(event("prepared"), "p/prepared"),
    ]


async def live(bus: Bus, ref: ClaimRef) -> None:
    """The claim in the ``claims`` bucket, allocated to n1, as the allocator keeps it."""
    claim = make_claim(VICTIM, [Dev("gpu", "gpu-0")], uid=ref.uid, name=ref.name,
                       namespace=ref.namespace)  # fmt: skip
    await bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(VICTIM, ref.uid), claim)


async def forge(nc: Client, subject_event: str, payload: ClaimEvent, **headers: str) -> None:
    """Publish on n2's own subject for the victim claim (the server lets it)."""
    subject = subjects.claim_event(CLAIM.namespace, CLAIM.name, CLAIM.uid, OTHER, subject_event)
    await nc.jetstream().publish(subject, encode(payload), headers=headers or None)


async def test_a_nodes_preparer_cannot_end_another_nodes_claim_in_the_trail(
    nats_server: NatsServer,
    bus: Bus,
    attacker: MakeAttacker,
    emitters: tuple[ClaimTrail, ClaimTrail],
) -> None:
    """n2's preparer "unprepares", "releases" and "deletes" n1's claim, each payload
    saying node n1 and actor allocator, on subjects it may use: the build before took
    every payload at its word and answered "1 claims complete"."""
    await prepared_on_the_victim(emitters)
    mallory = (await attacker(Role.PREPARER, OTHER)).nc
    lies: list[tuple[str, ClaimEventName]] = [
        ("unprepare.requested", "unprepare.requested"),
        ("unprepared", "unprepared"),
        ("unprepared", "released"),
        ("unprepared", "deleted"),
    ]
    for seq, (subject_event, said) in enumerate(lies, start=5):
        lie = ClaimEvent(event=said, claim=CLAIM, node=VICTIM, actor="allocator", seq=seq)
        await forge(mallory, subject_event, lie, **{SEQ_HEADER: str(seq)})

    got = await audit(nats_server, "--verify")
    assert got.returncode == 1, got.stdout
    assert "0 claims complete, 1 incomplete" in got.stdout, got.stdout
    out = got.stdout
    assert "not closed: no 'deleted' event" in out
    assert "prepared on n1 (event 4) and never unprepared" in out
    assert "'unprepared' on n2: its payload says event 'released', node 'n1', actor " in out
    assert "'unprepared' on n2: its payload says event 'deleted', node 'n1', actor " in out
    assert "events on n2 from n2's preparer, but the claim was allocated to n1 only" in out


async def test_a_foreign_identity_cannot_take_an_events_message_id(
    bus: Bus, attacker: MakeAttacker, emitters: tuple[ClaimTrail, ClaimTrail]
) -> None:
    """JetStream drops a message whose ``Nats-Msg-Id`` it stored in the last two
    minutes, on any subject. The allocator's ids were ``<uid>/<event>/<version>``,
    the preparer's a counter after an id any preparer reads in the stream: n2
    stored the next ones first, and the real events were "stored" as duplicates of
    its decoys (the append answered, nothing was kept)."""
    allocator, preparer = emitters
    mallory = (await attacker(Role.PREPARER, OTHER)).nc
    await prepared_on_the_victim(emitters)
    last = await mallory.jetstream().get_last_msg(
        subjects.CLAIMS_STREAM, subjects.claim_trail(CLAIM.namespace, CLAIM.name, CLAIM.uid)
    )
    seen = (last.headers or {})[MSG_ID]  # the preparer's last id, readable by every preparer
    next_one = seen.replace("p/prepared", "p/unprepare.requested")  # its tag, reused
    guesses = ["p/unprepare.requested", "a/deleted/42", next_one]
    for guess in guesses:
        decoy = msgspec.structs.replace(event("prepared", OTHER), seq=1)
        await forge(mallory, "prepared", decoy, **{MSG_ID: guess, SEQ_HEADER: "1"})

    await preparer.append(event("unprepare.requested"), "p/unprepare.requested")
    await allocator.append(event("deleted"), "a/deleted/42")
    stored = [(s.split(".", 5)[-1], e.event) for s, e in await stored_claim_subjects(bus)]
    assert (f"{VICTIM}.unprepare.requested", "unprepare.requested") in stored, stored
    assert (f"{VICTIM}.deleted", "deleted") in stored, stored


async def test_a_foreign_event_cannot_break_a_claims_numbering(
    nats_server: NatsServer,
    bus: Bus,
    attacker: MakeAttacker,
    emitters: tuple[ClaimTrail, ClaimTrail],
) -> None:
    """n2 stores an event numbered 9999 for n1's claim before each real one: the
    build before numbered every real event after the claim's last stored one, so
    five real events were all number 10000."""
    allocator, preparer = emitters
    mallory = (await attacker(Role.PREPARER, OTHER)).nc
    steps: list[tuple[ClaimTrail, ClaimEventName]] = [
        (allocator, "allocated"),
        (allocator, "reserved"),
        (preparer, "prepare.requested"),
        (preparer, "prepared"),
        (preparer, "unprepare.requested"),
    ]
    numbers = []
    for i, (trail, name) in enumerate(steps):
        foreign = msgspec.structs.replace(event("prepared", OTHER), seq=9999)
        await forge(mallory, "prepared", foreign, **{SEQ_HEADER: "9999", MSG_ID: f"m{i}"})
        numbers.append((await trail.append(event(name), f"real/{name}")).seq)
    assert numbers == [1, 2, 3, 4, 5]
    real = [e for s, e in await stored_claim_subjects(bus) if f".{VICTIM}." in s]
    assert [e.seq for e in real] == [1, 2, 3, 4, 5]

    got = await audit(nats_server, "--verify")
    assert got.returncode == 1
    assert "events 1-9998 missing" not in got.stdout  # n1's numbering is whole
    assert "events on n2 from n2's preparer, but the claim was allocated to n1 only" in got.stdout


async def test_a_flood_from_one_node_evicts_no_other_nodes_history(
    nats_server: NatsServer, attacker: MakeAttacker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n2 published 17,000 fake complete trails of 64 KB in 33.5 s: CLAIMS (1 GiB,
    discard old) dropped every real trail, and ``--verify`` said "8274 claims
    complete, 0 incomplete". Here the stream holds 1 MiB: the flood is refused once
    it is full, nothing stored before is gone, and no fake trail passes."""
    monkeypatch.setenv("GPUDRA_CLAIMS_MAX_BYTES", "1Mi")
    bus = await connect(nats_server, name="small")  # provisions the smaller stream
    allocator = await connect(nats_server, Role.ALLOCATOR)
    preparer = await connect(nats_server, Role.PREPARER, VICTIM)
    try:
        done = ClaimRef(uid="done-uid", namespace="ns", name="done")
        for name in ("allocated", "reserved", "released", "deleted"):
            await ClaimTrail(allocator).append(event(name, claim=done), f"done/{name}")
        await prepared_on_the_victim((ClaimTrail(allocator), ClaimTrail(preparer)))
        await live(bus, CLAIM)
        before = await stored_claim_subjects(bus)
        mallory = (await attacker(Role.PREPARER, OTHER)).nc.jetstream()
        refused = 0
        for i in range(40):  # 2.5 MB of 64 KB fake events
            fake = ClaimRef(uid=f"fake-{i}", namespace="ns", name=f"fake-{i}")
            lie = ClaimEvent(event="prepared", claim=fake, node=OTHER, actor="preparer", seq=1,
                             error="x" * 60_000)  # fmt: skip
            subject = subjects.claim_event("ns", fake.name, fake.uid, OTHER, "prepared")
            try:
                await mallory.publish(subject, encode(lie), headers={SEQ_HEADER: "1"})
            except nats.js.errors.APIError:
                refused += 1
        assert refused > 0  # refused once the stream was full
        after = await stored_claim_subjects(bus)
        assert after[: len(before)] == before  # nothing stored before is gone
    finally:
        await allocator.close()
        await preparer.close()
        await bus.close()
    got = await audit(nats_server, "--verify")
    assert got.returncode == 1
    assert "1 claims complete" in got.stdout, got.stdout
    assert "FULL: CLAIMS refuses new events" in got.stdout, got.stdout
    assert "events on n2 from n2's preparer, but the claim was never allocated" in got.stdout


async def test_verify_names_live_claims_whose_first_events_the_window_no_longer_holds(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trail that left the stream whole was never reported: ``--verify`` judged what
    was left and said every claim was complete. Here the stream keeps events 10 s; two
    claims still exist (the ``claims`` bucket says so), one with an event after the
    window began, one with none left."""
    monkeypatch.setenv("GPUDRA_CLAIMS_MAX_AGE", "10s")
    bus = await connect(nats_server, name="short")  # provisions the shorter window
    allocator = await connect(nats_server, Role.ALLOCATOR)
    preparer = await connect(nats_server, Role.PREPARER, VICTIM)
    quiet = ClaimRef(uid="quiet-uid", namespace="ns", name="quiet")
    try:
        trails = (ClaimTrail(allocator), ClaimTrail(preparer))
        await prepared_on_the_victim(trails)
        await trails[0].append(event("allocated", claim=quiet), "quiet/allocated")
        await live(bus, CLAIM)
        await live(bus, quiet)
        deadline = time.monotonic() + 60
        while (await bus.js.stream_info(subjects.CLAIMS_STREAM)).state.messages:
            assert time.monotonic() < deadline, "the events never aged out"
            await asyncio.sleep(0.5)
        await trails[1].append(event("unprepare.requested"), "p/unprepare.requested")
        got = await audit(nats_server, "--verify")
    finally:
        await allocator.close()
        await preparer.close()
        await bus.close()
    out = got.stdout
    assert got.returncode == 1, out
    assert "1 events, 0 claims complete, 2 incomplete" in out, out
    assert "WINDOW: CLAIMS holds events from " in out and "its first 5 are gone" in out, out
    # All of its events on n1 aged out, so the next one is number 1 again: its allocation
    # (in the bucket, written by the allocator alone) says the trail began before.
    assert "INCOMPLETE ns/train (victim-uid):\n" in out, out
    assert "  - its 'allocated' event on n1 is older than the stream's window" in out, out
    assert (
        "INCOMPLETE ns/quiet (quiet-uid):\n  - allocated to n1 (claims bucket), but none of "
        "its events is in the stream" in out
    ), out


async def test_a_claims_stream_of_an_earlier_release_refuses_floods_once_provisioned(
    nats_server: NatsServer,
) -> None:
    """Streams made before dropped their oldest events when full; provisioning turns
    ``CLAIMS`` to refusing new ones (and keeps what it holds)."""
    bus = await connect(nats_server, name="upgrade")
    try:
        info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
        await bus.js.update_stream(dataclasses.replace(info.config, discard=api.DiscardPolicy.OLD))
        await bus.provision()
        info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
        assert info.config.discard == api.DiscardPolicy.NEW
    finally:
        await bus.close()
