"""The distributed engine under NATS server failures: a three-server JetStream cluster.

A simulated node (``gpudra discovery``, ``preparer``, ``kubeletplugin``, each
connected to the cluster's three URLs with its production identity) is driven
through the kubelet's own socket by :class:`FakeKubelet`, while the test acts
as the allocator (it writes each claim into the ``claims`` bucket, as the
claim watcher does, retrying while the bucket has no leader). Streams and
buckets have three replicas.

1. Four "pods" prepare and unprepare claims continuously; mid-run the server
   leading the ``CLAIMS`` stream is killed (SIGKILL). No kubelet call may fail
   more than once (the kubelet retries a failed call), and no process restarts.
2. Then two of the three servers are killed: quorum is lost. The node still
   answers: a claim it has prepared is prepared again (from its checkpoint)
   and unprepared (both node-local); a claim whose allocation it cannot read
   fails with an error saying why, before the kubelet's deadline, leaving
   nothing behind. Both servers come back: that claim is prepared, new claims
   cycle again.

At the end the ``CLAIMS`` stream holds every event the preparer emitted exactly
once (each carries a ``Nats-Msg-Id`` numbered by the preparer: no number
missing, none twice), including those emitted while the stream could not
store them, and every call the kubelet saw succeed has its event.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.bus.failures import unavailable
from services.core.kube.resource import ResourceClaim
from services.core.model.schemas import ClaimEvent, SimMigReply, SimMigRequest
from services.local.kubelet import Claim, FakeKubelet
from services.local.natsserver import NatsCluster, NatsServer
from services.local.ports import free_port
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_messages
from tests.helpers.preparer import Dev, Node, make_claim, ref

pytestmark = pytest.mark.integration

PODS = 4  # concurrent claim cycles, one GPU each
CYCLES_BEFORE_KILL = 8
CYCLES_AFTER_KILL = 32
KUBELET_TIMEOUT = 45.0  # the kubelet's timeout on a DRA plugin call
ALLOCATE_WITHIN = 120.0  # generous: a loaded machine elects leaders slowly
METRIC = "gpudra_preparer_claim_events_total"


# ------------------------------------------------------------------ the cluster and the node


@dataclass
class Setup:
    cluster: NatsCluster
    node: Node
    kubelet: FakeKubelet
    metrics_port: int


@pytest.fixture
async def setup(short_root: Path) -> AsyncIterator[Setup]:
    cluster = NatsCluster(short_root / "nats")
    cluster.start()
    try:
        cluster.provision()
        bus = await connect(cluster, name="tests-allocator")
        node = Node(short_root, cluster, bus, fleet="dgx-h100")
        metrics_port = free_port()
        try:
            await node.start_discovery()
            await node.start_preparer(env={"GPUDRA_METRICS_PORT": str(metrics_port)})
            node.start_front()
            async with FakeKubelet(node.paths.kubelet_root) as kubelet:
                await kubelet.wait_for_registration_socket(timeout=30)
                await kubelet.register()
                yield Setup(cluster, node, kubelet, metrics_port)
        finally:
            await node.stop_all()
            await bus.close()
    finally:
        cluster.stop()


# ------------------------------------------------------------------ the kubelet and the allocator


@dataclass
class Call:
    """One kubelet operation: its first attempt, and the retry if that failed."""

    op: str
    uid: str
    errors: list[str] = field(default_factory=list)  # one per failed attempt
    seconds: list[float] = field(default_factory=list)  # per attempt
    ok: bool = False


@dataclass
class Record:
    calls: list[Call] = field(default_factory=list)
    cycles: int = 0
    killed_at: float | None = None
    cycles_after_kill: int = 0
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    def retried(self) -> list[Call]:
        return [c for c in self.calls if c.errors]


def kclaim(claim: ResourceClaim) -> Claim:
    r = ref(claim)
    return Claim(r.uid, r.namespace, r.name)


async def attempt(
    kubelet: FakeKubelet, op: str, claim: ResourceClaim, timeout: float = KUBELET_TIMEOUT
) -> str:
    """One DRA call as the kubelet makes it; the claim's error ('' when it succeeded)."""
    uid = claim.metadata.uid or ""
    try:
        if op == "prepare":
            result = (await kubelet.prepare([kclaim(claim)], timeout=timeout))[uid]
            return result.error or ("" if result.devices else "no devices")
        return (await kubelet.unprepare([kclaim(claim)], timeout=timeout))[uid]
    except grpc.aio.AioRpcError as exc:
        return f"gRPC {exc.code().name}: {exc.details()}"


async def kubelet_call(record: Record, kubelet: FakeKubelet, op: str, claim: ResourceClaim) -> Call:
    """The call, and once more if it failed (the kubelet retries a failed call)."""
    call = Call(op, claim.metadata.uid or "")
    record.calls.append(call)
    for _ in range(2):
        started = time.monotonic()
        error = await attempt(kubelet, op, claim)
        call.seconds.append(time.monotonic() - started)
        if not error:
            call.ok = True
            break
        call.errors.append(error)
    return call


async def allocate(node: Node, claim: ResourceClaim) -> None:
    """Write the claim into the ``claims`` bucket as the claim watcher does: a write the
    cluster cannot take now (no leader yet) is written again."""
    deadline = time.monotonic() + ALLOCATE_WITHIN
    while True:
        try:
            await node.put_claim(claim)
            return
        except Exception as exc:
            if not unavailable(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # pacing between writes, not a wait for an outcome


async def pod(record: Record, kubelet: FakeKubelet, node: Node, index: int) -> None:
    """Claims on GPU ``index``, one after the other, until enough ran after the kill."""
    n = 0
    while record.cycles_after_kill < CYCLES_AFTER_KILL:
        after_kill = record.killed_at is not None
        n += 1
        claim = make_claim(node.name, [Dev("gpu", f"gpu-{index}")], name=f"pod{index}-c{n}")
        await allocate(node, claim)
        for op in ("prepare", "unprepare"):
            call = await kubelet_call(record, kubelet, op, claim)
            assert call.ok, f"{op} of {claim.metadata.name} failed twice: {call.errors}"
        async with record.progress:
            record.cycles += 1
            record.cycles_after_kill += after_kill
            record.progress.notify_all()


async def cycle_once(record: Record, kubelet: FakeKubelet, node: Node, name: str) -> None:
    claim = make_claim(node.name, [Dev("gpu", "gpu-7")], name=name)
    await allocate(node, claim)
    for op in ("prepare", "unprepare"):
        call = await kubelet_call(record, kubelet, op, claim)
        assert call.ok, f"{op} of {name} failed twice: {call.errors}"


# ------------------------------------------------------------------ what the cluster says


async def leader(bus: Bus, stream: str, timeout: float = 5.0) -> str:
    """The server leading ``stream`` ('' while it has none)."""
    reply = await bus.nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=timeout)
    info = json.loads(reply.data)
    return str(info.get("cluster", {}).get("leader") or "")


async def new_leader(bus: Bus, stream: str, old: str, within: float = 120.0) -> str:
    """Until ``stream`` has a leader other than ``old`` (asked again while it has none)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            found = await leader(bus, stream, timeout=0.5)  # asked often: a precise figure
        except Exception as exc:
            if not unavailable(exc):
                raise
            found = ""
        if found and found != old:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{stream} has no leader other than {old} after {within}s")


def event_counts(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(METRIC + "{"):
            label, value = line.rsplit(" ", 1)
            counts[label.split('result="', 1)[1].split('"', 1)[0]] = float(value)
    return counts


async def all_events_stored(port: int, within: float = 120.0) -> dict[str, float]:
    """Until the preparer has stored every event it emitted (its sink retries them)."""
    deadline = time.monotonic() + within
    while True:
        counts = await asyncio.to_thread(event_counts, port)
        if counts.get("emitted", 0) == counts.get("published", -1):
            return counts
        if time.monotonic() > deadline:
            raise AssertionError(f"claim events still unstored after {within}s: {counts}")
        await asyncio.sleep(0.2)


async def stream_contents(
    bus: Bus, within: float = 60.0
) -> list[tuple[ClaimEvent, dict[str, str]]]:
    """The CLAIMS stream's messages (read again if its consumer cannot be made yet)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await stored_claim_messages(bus)
        except Exception as exc:
            if not unavailable(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


STILL_ELECTING = ("ServiceUnavailableError", "TimeoutError: nats: timeout")


async def discovery_answers(cluster: NatsCluster, node: str, within: float = 120.0) -> None:
    """Until discovery answers a simulated-NVML request as NVML would: it reads its state
    from the ``simnvml`` bucket, which answers 503 until its stream has a leader again."""
    sim = await connect(cluster, Role.SIM, name="tests-sim")
    request = SimMigRequest(op="mig-mode", gpu_uuid="GPU-none", mig_enabled=False)
    deadline = time.monotonic() + within
    try:
        while True:
            reply = await sim.request(subjects.sim_control(node), request, SimMigReply, 30)
            if "no GPU with UUID 'GPU-none'" in reply.error:
                return
            # JetStream still electing: the bucket read answers 503, or nothing in time
            assert any(e in reply.error for e in STILL_ELECTING), reply
            assert time.monotonic() < deadline, f"discovery still answers {reply.error}"
            await asyncio.sleep(0.2)
    finally:
        await sim.close()


# ------------------------------------------------------------------ the test


async def test_the_node_rides_out_a_leader_kill_and_a_lost_quorum(setup: Setup) -> None:
    cluster, node, kubelet = setup.cluster, setup.node, setup.kubelet
    bus = node.bus
    pids = {p.name: p.popen.pid for p in node.procs}
    record = Record()

    # --- 1. the CLAIMS stream's leader dies mid-run
    pods = [asyncio.create_task(pod(record, kubelet, node, i)) for i in range(PODS)]
    async with record.progress:
        await record.progress.wait_for(
            lambda: record.cycles >= CYCLES_BEFORE_KILL or any(p.done() for p in pods)
        )
    doomed = cluster.server(await leader(bus, subjects.CLAIMS_STREAM))
    doomed.kill()
    record.killed_at = killed_at = time.monotonic()
    elected = await new_leader(bus, subjects.CLAIMS_STREAM, doomed.name)
    failover_s = time.monotonic() - killed_at
    await asyncio.gather(*pods)
    phase1 = list(record.calls)
    moved = [p.name for p in node.procs if "nats reconnected" in p.output()]
    print(
        f"\nleader {doomed.name} killed: {elected} leads CLAIMS after {failover_s:.1f}s "
        f"(clients that were on it: {moved}); "
        f"{record.cycles} cycles ({record.cycles_after_kill} after the kill), "
        f"{len(record.retried())} of {len(phase1)} calls retried "
        f"{[(c.op, c.errors) for c in record.retried()]}; slowest call "
        f"{max(max(c.seconds) for c in phase1):.1f}s"
    )
    assert record.cycles_after_kill >= CYCLES_AFTER_KILL

    # --- 2. quorum lost: only the server killed before is up (every client moves to it)
    doomed.start(timeout=60)
    held = [make_claim(node.name, [Dev("gpu", f"gpu-{i}")], name=f"held{i}") for i in (4, 5)]
    for claim in held:
        await allocate(node, claim)
        call = await kubelet_call(record, kubelet, "prepare", claim)
        assert call.ok, call.errors
    others: list[NatsServer] = [s for s in cluster.servers if s is not doomed]
    for server in others:
        server.kill()

    for claim in held:  # node-local: from the checkpoint, and undone on the node
        for op in ("prepare", "unprepare"):
            call = await kubelet_call(record, kubelet, op, claim)
            assert call.ok, f"{op} without quorum failed twice: {call.errors}"
    # A claim allocated meanwhile: the claim watcher cannot write the bucket without a
    # quorum, but the preparer reads claims from the API server, so the claim is
    # prepared; its events wait for the stream.
    unread = make_claim(node.name, [Dev("gpu", "gpu-6")], name="unread")
    await node.put_claim(unread, bucket=False)
    started = time.monotonic()
    call = await kubelet_call(record, kubelet, "prepare", unread)
    assert call.ok, f"a claim allocated without quorum was not prepared: {call.errors}"
    print(f"without quorum, a new claim was prepared in {time.monotonic() - started:.1f}s")
    uid = unread.metadata.uid or ""
    assert uid in node.checkpoint().claims
    assert [f for f in node.cdi_files() if uid in f.name]

    # --- 3. both come back: the failed claim is prepared, claims cycle again
    for server in others:
        server.start(timeout=60)
    await allocate(node, unread)
    recovered = time.monotonic()
    for op in ("prepare", "unprepare"):
        call = await kubelet_call(record, kubelet, op, unread)
        assert call.ok, f"{op} of the claim prepared without quorum: {call.errors}"
    print(f"after the quorum came back, that claim cycled in "
          f"{time.monotonic() - recovered:.1f}s")  # fmt: skip
    for n in range(4):
        await cycle_once(record, kubelet, node, f"after{n}")
    await discovery_answers(cluster, node.name)

    # --- every process is the one started, and moved to another server at least once
    assert {p.name: p.popen.pid for p in node.procs} == pids
    for proc in node.procs:
        assert proc.alive(), f"{proc.name} exited:\n{proc.output()}"
        assert "nats reconnected" in proc.output(), f"{proc.name} never reconnected"

    # --- the audit trail: every event the preparer emitted, each exactly once
    counts = await all_events_stored(setup.metrics_port)
    assert counts.get("retried", 0) > 0, counts  # the outage did hold events back
    assert counts.get("dropped", 0) == 0, counts
    stored = [
        (event, headers)
        for event, headers in await stream_contents(bus)
        if event.actor == "preparer"
    ]
    ids = [headers.get("Nats-Msg-Id", "") for _, headers in stored]
    assert len(set(ids)) == len(ids), "an event stored twice"
    numbers, instances = [], set()
    for (event, _), msg_id in zip(stored, ids, strict=True):
        # <claim uid>/<event>/<instance>-<number>/<the process's tag: see claimtrail>
        uid_, name, serial, _ = msg_id.split("/")
        assert (uid_, name) == (event.claim.uid, event.event), msg_id
        instance, number = serial.split("-")
        instances.add(instance)
        numbers.append(int(number))
    assert len(instances) == 1, instances  # one preparer process, never restarted
    assert sorted(numbers) == list(range(1, int(counts["emitted"]) + 1)), "an event is missing"
    have = {(event.claim.uid, event.event) for event, _ in stored}
    for call in record.calls:
        done = "prepared" if call.op == "prepare" else "unprepared"
        assert (call.uid, done) in have, f"{call.op} of {call.uid} answered, never recorded"
