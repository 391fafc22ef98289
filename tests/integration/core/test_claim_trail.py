"""The claim trail on a real nats-server: events numbered per claim and node, whoever
emits them, and ``gpudra audit`` (the real CLI, as the read-only auditor) replaying,
filtering and verifying it."""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.access import ALLOCATOR_EVENTS, Role
from services.core.bus.claimtrail import SEQ_HEADER, ClaimTrail
from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent, ClaimRef, DeviceRef, encode
from services.local.natsserver import NatsServer
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_messages

REPO = Path(__file__).resolve().parents[3]
HOSTILE_NS = "a.b>*"


def ev(ref: ClaimRef, name: str, node: str = "n1", actor: str = "") -> ClaimEvent:
    """An event said by the service its subject belongs to (``actor``: another)."""
    actor = actor or ("allocator" if name in ALLOCATOR_EVENTS else "preparer")
    return ClaimEvent(event=name, claim=ref, node=node, actor=actor)  # type: ignore[arg-type]


async def test_events_of_one_claim_from_racing_emitters_are_numbered_without_gaps(
    nats_server: NatsServer, bus: Bus
) -> None:
    allocator = await connect(nats_server, Role.ALLOCATOR)
    preparer = await connect(nats_server, Role.PREPARER, "n1")
    try:
        ref = ClaimRef(uid="u-race", namespace="ns", name="c")
        a, p = ClaimTrail(allocator), ClaimTrail(preparer)
        sent = [
            *(a.append(ev(ref, "reserved", "n1", "allocator"), f"a{i}") for i in range(10)),
            *(p.append(ev(ref, "prepared"), f"p{i}") for i in range(10)),
        ]
        stored = await asyncio.gather(*sent)
    finally:
        await allocator.close()
        await preparer.close()
    assert sorted(e.seq for e in stored) == list(range(1, 21))
    messages = await stored_claim_messages(bus)
    assert [e.seq for e, _ in messages] == list(range(1, 21))  # stream order is claim order
    assert [int(h[SEQ_HEADER]) for _, h in messages] == list(range(1, 21))


async def test_an_event_sent_again_after_a_lost_ack_is_stored_once(bus: Bus) -> None:
    ref = ClaimRef(uid="u-again", namespace="ns", name="c")
    first = await ClaimTrail(bus).append(ev(ref, "prepare.requested"), "id-1")
    await ClaimTrail(bus).append(ev(ref, "prepared"), "id-2")
    # A process that never saw the ack sends id-1 again, expecting it to be number 1.
    again = await ClaimTrail(bus).append(ev(ref, "prepare.requested"), "id-1")
    assert first.seq == 1 and again.seq in (1, 3)
    assert [e.event for e in await stored_events(bus)] == ["prepare.requested", "prepared"]


async def stored_events(bus: Bus) -> list[ClaimEvent]:
    return [e for e, _ in await stored_claim_messages(bus)]


async def life(bus: Bus, ref: ClaimRef, node: str, *, close: bool = True) -> None:
    trail = ClaimTrail(bus)
    names = ["allocated", "reserved", "prepare.requested", "prepared", "unprepare.requested",
             "unprepared", "released", "deleted"]  # fmt: skip
    for name in names if close else names[:4]:
        dev = [DeviceRef(request="gpu", pool=node, device="gpu-0", gpu_uuid="GPU-1")]
        event = msgspec.structs.replace(ev(ref, name, node), devices=dev)
        await trail.append(event, f"{ref.uid}/{name}")


async def audit(server: NatsServer, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpudra audit`` in its own process, as the auditor."""
    argv = [sys.executable, "-m", "services.cli", "audit",
            *server.client_argv(Role.AUDITOR), *args]  # fmt: skip
    return await asyncio.to_thread(
        subprocess.run, argv, cwd=REPO, capture_output=True, text=True, timeout=60
    )


async def test_audit_replays_and_filters_on_the_server(nats_server: NatsServer, bus: Bus) -> None:
    one = ClaimRef(uid="u1", namespace="team-a", name="train")
    two = ClaimRef(uid="u2", namespace=HOSTILE_NS, name="train.*")
    await life(bus, one, "n1")
    await life(bus, two, "node.2")

    everything = await audit(nats_server)
    assert everything.returncode == 0, everything.stderr
    lines = [json.loads(line) for line in everything.stdout.splitlines()]
    assert len(lines) == 16 and {line["claim"]["uid"] for line in lines} == {"u1", "u2"}
    assert lines[0]["devices"][0]["gpu_uuid"] == "GPU-1"

    cases = {
        ("--namespace", HOSTILE_NS): ("u2", 8),
        ("--claim", "train"): ("u1", 8),  # not train.*: a name is matched whole
        ("--node", "node.2"): ("u2", 8),
        ("--namespace", "team-a", "--event", "prepared"): ("u1", 1),
        ("--event", "prepare.requested", "--event", "deleted"): (None, 4),
    }
    for args, (uid, count) in cases.items():
        got = await audit(nats_server, *args)
        assert got.returncode == 0, (args, got.stderr)
        found = [json.loads(line) for line in got.stdout.splitlines()]
        assert len(found) == count, (args, found)
        if uid:
            assert {f["claim"]["uid"] for f in found} == {uid}, args

    table = await audit(nats_server, "-o", "table", "--claim", "train")
    assert table.stdout.splitlines()[0].startswith("TIME")
    assert "team-a/train" in table.stdout and "GPU-1" in table.stdout


async def test_verify_passes_complete_trails_and_lists_gaps(
    nats_server: NatsServer, bus: Bus
) -> None:
    await life(bus, ClaimRef(uid="ok", namespace="ns", name="done"), "n1")
    good = await audit(nats_server, "--verify")
    assert good.returncode == 0, good.stdout
    assert "1 claims complete, 0 incomplete" in good.stdout

    await life(bus, ClaimRef(uid="open", namespace="ns", name="open"), "n1", close=False)
    # An event lost on the way: number 3 follows number 1.
    lost = ClaimRef(uid="lost", namespace="ns", name="lost")
    await ClaimTrail(bus).append(ev(lost, "allocated", "n1", "allocator"), "l1")
    gap = ev(lost, "deleted", "n1", "allocator")
    await bus.js.publish(
        subjects.claim_event("ns", "lost", "lost", "n1", "deleted"),
        encode(msgspec.structs.replace(gap, seq=3)),
        headers={SEQ_HEADER: "3"},
    )
    bad = await audit(nats_server, "--verify")
    assert bad.returncode == 1
    assert "1 claims complete, 2 incomplete" in bad.stdout
    assert "ns/lost (lost):\n  - events 2 missing" in bad.stdout
    assert "ns/open (open):\n  - not closed: no 'deleted' event (last: 'prepared')" in bad.stdout
    assert "  - prepared on n1 (event 4) and never unprepared" in bad.stdout


async def test_verify_waits_for_the_events_still_on_their_way(
    nats_server: NatsServer, bus: Bus
) -> None:
    ref = ClaimRef(uid="late", namespace="ns", name="late")
    await life(bus, ref, "n1", close=False)
    waiting = asyncio.create_task(audit(nats_server, "--verify", "--wait", "30"))
    trail = ClaimTrail(bus)
    for name in ("unprepare.requested", "unprepared", "released", "deleted"):
        await trail.append(ev(ref, name), f"late/{name}")
    done = await waiting
    assert done.returncode == 0, done.stdout
    assert "1 claims complete, 0 incomplete" in done.stdout


async def test_verify_with_wait_reads_to_the_streams_end_before_it_judges(
    nats_server: NatsServer, bus: Bus
) -> None:
    """Trails that end one after another: ``--wait`` stopped at the first complete one,
    judged 1 claim of 4 and passed, never reading the open trail after it."""
    for i in range(3):
        await life(bus, ClaimRef(uid=f"w{i}", namespace="ns", name=f"w{i}"), "n1")
    await life(bus, ClaimRef(uid="open", namespace="ns", name="open"), "n1", close=False)
    done = await audit(nats_server, "--verify", "--wait", "2")
    assert done.returncode == 1, done.stdout
    assert "3 claims complete, 1 incomplete" in done.stdout
    assert "INCOMPLETE ns/open (open):" in done.stdout


async def test_audit_leaves_quietly_when_it_stops_before_the_stream_ends(
    nats_server: NatsServer, bus: Bus
) -> None:
    """``gpudra up --exit-after-demo`` prints the tail of ``audit --verify --wait``'s
    stderr. A verify that stops as soon as every trail is complete left its replay
    suspended mid-stream; closed by the garbage collector during the bus's drain, it
    printed a ConnectionDrainingError traceback (and asyncio nats-py's TLS warning)."""
    await life(bus, ClaimRef(uid="q", namespace="ns", name="q"), "n1")
    early = await audit(nats_server, "--verify", "--wait", "30")
    assert early.returncode == 0, early.stdout + early.stderr
    assert "1 claims complete, 0 incomplete" in early.stdout
    assert early.stderr == ""
    for args in (["--verify"], ["-o", "table"]):  # to the stream's end
        done = await audit(nats_server, *args)
        assert (done.returncode, done.stderr) == (0, ""), args


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--event", "prepare"), "--event: expected one of"),
        (("--since", "yesterday"), "--since: expected 'start'"),
        (("--durable", "a.b"), "--durable: expected 1 to 64"),
        (("--verify", "--event", "prepared"), "--verify judges whole trails"),
        (("--verify", "--node", "n1"), "--verify judges whole trails"),
        (("--wait", "5"), "--wait goes with --verify"),
    ],
)
async def test_audit_refuses_bad_arguments_by_name(
    nats_server: NatsServer, args: tuple[str, ...], needle: str
) -> None:
    got = await audit(nats_server, *args)
    assert got.returncode == 2 and needle in got.stderr


async def test_the_auditor_cannot_write_the_trail(nats_server: NatsServer, bus: Bus) -> None:
    auditor = await connect(nats_server, Role.AUDITOR)
    try:
        with pytest.raises(TimeoutError):  # refused: no ack ever comes
            await asyncio.wait_for(
                ClaimTrail(auditor).append(ev(ClaimRef(uid="x", namespace="n", name="c"),
                                              "deleted"), "x"), 5)  # fmt: skip
    finally:
        await auditor.close()
    assert await stored_events(bus) == []


async def test_a_named_consumer_resumes_where_it_stopped_and_since_starts_at_a_time(
    nats_server: NatsServer, bus: Bus
) -> None:
    await life(bus, ClaimRef(uid="first", namespace="ns", name="a"), "n1")
    got = await audit(nats_server, "--durable", "nightly")
    assert len(got.stdout.splitlines()) == 8, got.stderr
    await life(bus, ClaimRef(uid="second", namespace="ns", name="b"), "n1")
    again = await audit(nats_server, "--durable", "nightly")
    assert {json.loads(line)["claim"]["uid"] for line in again.stdout.splitlines()} == {"second"}

    recent = await audit(nats_server, "--since", "1h")
    assert len(recent.stdout.splitlines()) == 16
    later = await audit(nats_server, "--since", "2999-01-01T00:00:00Z")
    assert later.returncode == 0 and later.stdout == ""
    # A trail cut by --since is judged from its first event on, not as missing 1..k.
    await ClaimTrail(bus).append(ev(ClaimRef(uid="first", namespace="ns", name="a"),
                                    "pending", "", "allocator"), "late")  # fmt: skip
    newest = (await stored_claim_messages(bus))[-1][0].timestamp
    since = datetime.datetime.fromtimestamp(newest - 0.001, datetime.UTC).isoformat()
    tail = await audit(nats_server, "--verify", "--since", since)
    assert tail.returncode == 1, tail.stdout
    assert "ns/a (first):\n  - not closed: no 'deleted' event (last: 'pending')" in tail.stdout
    assert "missing" not in tail.stdout  # events 1-8 are before --since, not lost


async def test_follow_prints_events_as_they_are_stored(nats_server: NatsServer, bus: Bus) -> None:
    argv = [sys.executable, "-m", "services.cli", "audit", "--follow",
            *nats_server.client_argv(Role.AUDITOR)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
    try:
        ref = ClaimRef(uid="live", namespace="ns", name="live")
        await ClaimTrail(bus).append(ev(ref, "allocated", "n1", "allocator"), "live/1")
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert json.loads(line)["claim"]["uid"] == "live"
        await ClaimTrail(bus).append(ev(ref, "deleted", "n1", "allocator"), "live/2")
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert (json.loads(line)["event"], json.loads(line)["seq"]) == ("deleted", 2)
        assert proc.poll() is None  # still following
    finally:
        proc.terminate()
        proc.wait(10)
