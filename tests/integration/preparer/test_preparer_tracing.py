"""One trace per claim: the preparer answers each claim in the claim's own trace,
under the front's send span (a client/server pair), with a span per step.

The preparer runs in-process here (with an in-memory span exporter) against a
real nats-server; the node's inventory is what discovery would write for a
simulated dgx-h100.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import Event
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.model import featuregates
from services.core.model.schemas import ClaimEvent, NodeReply, NodeRequest
from services.core.telemetry import tracing
from services.discovery import fleet, inventory
from services.discovery.sim import SimNvml
from services.local.natsserver import NatsServer
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import ClaimSource
from services.preparer.devices.simulated import SimulatedOps
from services.preparer.engine import Engine, Settings
from services.preparer.inventory import InventoryView
from services.preparer.service import PreparerService
from tests.helpers.bus import connect
from tests.helpers.preparer import Dev, make_claim, ref
from tests.helpers.tracing import attr, children, named, recording

pytestmark = pytest.mark.integration

NODE = "n1"
SEND_SPAN = "b7ad6b7169203331"
STEPS = [  # a full GPU without sharing: no PrepareStarted (docs/operations.md, Durability)
    "claim.fetch",
    "config.resolve",
    "cdi.render",
    "cdi.write",
    "checkpoint.completed",
]
FOREIGN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # another trace


@pytest.fixture
async def preparer(
    tmp_path: Path, bus: Bus, request: pytest.FixtureRequest
) -> AsyncIterator[InMemorySpanExporter]:
    """``request.param``: how steps are recorded (summary, events, spans; default summary)."""
    sim = SimNvml.boot(NODE, fleet.get_fleet("dgx-h100"), seed=0)
    await bus.kv_put(
        subjects.INVENTORY_BUCKET, subjects.inventory_key(NODE), inventory.scan(sim, NODE).inventory
    )
    tracer, exporter = recording()
    store = CheckpointStore(tmp_path / "checkpoint.json", "boot")
    store.load()
    view = InventoryView(bus, NODE)
    await view.start()
    plugin_dir = tmp_path / "plugin"
    settings = Settings(NODE, featuregates.parse(""), tmp_path / "cdi", plugin_dir)
    ops = SimulatedOps(bus, NODE, view, plugin_dir)
    engine = Engine(
        settings, store, ClaimSource(bus, NODE, trust_bucket=True), view, ops, tracer=tracer,
        step_mode=getattr(request, "param", None),
    )  # fmt: skip
    service = PreparerService(bus, engine, NODE, tracer=tracer)
    await service.start()
    try:
        yield exporter
    finally:
        await service.close()
        await view.stop()


async def request(nats_server: NatsServer, op: str, request: NodeRequest) -> NodeReply:
    front = await connect(nats_server, Role.FRONT, NODE, name="front")  # whom it answers
    try:
        subject = subjects.node_prepare(NODE) if op == "prepare" else subjects.node_unprepare(NODE)
        return await front.request(subject, request, NodeReply, 10)
    finally:
        await front.close()


async def test_each_claim_in_its_own_trace_under_the_fronts_send_span(
    preparer: InMemorySpanExporter, bus: Bus, nats_server: NatsServer
) -> None:
    good = make_claim(NODE, [Dev("gpu", "gpu-1")], name="good")
    bad = make_claim(NODE, [Dev("gpu", "gpu-99")], name="bad")
    for claim in (good, bad):
        await bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, ref(claim).uid), claim)
    good_trace = tracing.claim_trace_hex(ref(good).uid)
    contexts = {
        ref(good).uid: f"00-{good_trace}-{SEND_SPAN}-01",
        ref(bad).uid: FOREIGN,  # a context of another trace is not followed
    }
    reply = await request(
        nats_server,
        "prepare",
        NodeRequest(
            node=NODE, claims=[ref(good), ref(bad)], deadline=time.time() + 10,
            traceparents=contexts,
        ),
    )  # fmt: skip
    assert reply.claims[ref(good).uid].error == ""
    assert "no GPU with minor 99" in reply.claims[ref(bad).uid].error

    spans = preparer.get_finished_spans()
    hops = {attr(s, tracing.ATTR_NAME): s for s in named(spans, "process dra.node.{node}.prepare")}
    assert set(hops) == {"good", "bad"}
    for name, claim in (("good", good), ("bad", bad)):
        hop = hops[name]
        assert hop.kind == SpanKind.SERVER
        assert hop.context.trace_id == tracing.claim_trace_id(ref(claim).uid)
        assert attr(hop, "messaging.system") == "nats"
        assert attr(hop, "messaging.operation.type") == "process"
        assert attr(hop, "messaging.destination.name") == subjects.node_prepare(NODE)
    assert hops["good"].parent is not None
    assert f"{hops['good'].parent.span_id:016x}" == SEND_SPAN  # the front's client span
    assert hops["bad"].parent is None  # a root of its own claim's trace instead

    good_span, bad_span = hops["good"], hops["bad"]
    gpu = inventory_gpu(1)
    steps = {tracing.ATTR_STEPS}  # checked below
    assert {k: v for k, v in (good_span.attributes or {}).items() if k not in steps} == {
        **tracing.messaging_attributes(
            "process", subjects.node_prepare(NODE), "dra.node.{node}.prepare"
        ),
        **tracing.claim_attributes(ref(good), NODE),
        tracing.ATTR_DEVICES: ("gpu-1",),
        tracing.ATTR_GPU_UUIDS: (gpu,),
        tracing.ATTR_CDI_IDS: (f"k8s.gpu.nvidia.com/claim={ref(good).uid}-gpu-1",),
        tracing.ATTR_SHARING: "Exclusive",
        tracing.ATTR_OUTCOME: "ok",
    }
    assert attr(bad_span, tracing.ATTR_OUTCOME) == "error"
    assert bad_span.status.status_code == StatusCode.ERROR
    assert children(spans, good_span) == []  # its steps are one attribute: nearly free
    summary = str(attr(good_span, tracing.ATTR_STEPS))
    assert [step.split("=")[0] for step in summary.split()] == STEPS, summary
    assert all(re.fullmatch(r"[a-z.]+=\d+\.\d\dms", step) for step in summary.split()), summary
    assert re.fullmatch(r"claim\.fetch=\S+ms", str(attr(bad_span, tracing.ATTR_STEPS)))

    events = await collect_events(bus, 4)
    assert set(events) == {
        "good:prepare.requested",
        "good:prepared",
        "bad:prepare.requested",
        "bad:prepare.failed",
    }
    for key, (event, headers) in events.items():
        trace_id = tracing.claim_trace_hex(event.claim.uid)
        assert event.trace_id == trace_id, key
        assert headers["traceparent"].split("-")[1] == trace_id, key  # the stream has it too
    failed = events["bad:prepare.failed"][0]
    assert failed.outcome == "error" and "gpu-99" in failed.error

    # The unprepare: its span says what it undid, in the same trace.
    unprepared = await request(
        nats_server,
        "unprepare",
        NodeRequest(node=NODE, claims=[ref(good)], deadline=time.time() + 10),
    )
    assert unprepared.claims[ref(good).uid].error == ""
    [undo] = named(preparer.get_finished_spans(), "process dra.node.{node}.unprepare")
    assert undo.context.trace_id == tracing.claim_trace_id(ref(good).uid)
    assert attr(undo, tracing.ATTR_GPU_UUIDS) == (gpu,)
    assert attr(undo, tracing.ATTR_OUTCOME) == "ok"


async def test_hostile_trace_contexts_are_ignored(
    preparer: InMemorySpanExporter, bus: Bus, nats_server: NatsServer
) -> None:
    """Malformed, oversized or foreign values never fail the claim nor leave its trace."""
    claim = make_claim(NODE, [Dev("gpu", "gpu-2")], name="c")
    await bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, ref(claim).uid), claim)
    for value in ("garbage", "00-" + "f" * 32 + "-" + "0" * 16 + "-01", "x" * 100_000, FOREIGN):
        reply = await request(
            nats_server,
            "unprepare",
            NodeRequest(
                node=NODE, claims=[ref(claim)], deadline=time.time() + 10,
                traceparents={ref(claim).uid: value, "other-uid": value},
            ),
        )  # fmt: skip
        assert reply.claims[ref(claim).uid].error == "", value[:40]
    hops = named(preparer.get_finished_spans(), "process dra.node.{node}.unprepare")
    assert len(hops) == 4
    assert all(h.parent is None for h in hops)
    assert {h.context.trace_id for h in hops} == {tracing.claim_trace_id(ref(claim).uid)}


@pytest.mark.parametrize("preparer", ["spans", "events"], indirect=True)
async def test_steps_as_child_spans_or_events_when_asked(
    preparer: InMemorySpanExporter, bus: Bus, nats_server: NatsServer
) -> None:
    """``GPUDRA_TRACE_STEPS=spans``: the waterfall of every step, at a span's cost each;
    ``events``: a span event per step, with its duration."""
    claim = make_claim(NODE, [Dev("gpu", "gpu-3")], name="c")
    await bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, ref(claim).uid), claim)
    request_ = NodeRequest(node=NODE, claims=[ref(claim)], deadline=time.time() + 10)
    reply = await request(nats_server, "prepare", request_)
    assert reply.claims[ref(claim).uid].error == ""
    spans = preparer.get_finished_spans()
    [hop] = named(spans, "process dra.node.{node}.prepare")
    if children(spans, hop):
        assert [s.name for s in children(spans, hop)] == STEPS
        assert list(hop.events) == [] and attr(hop, tracing.ATTR_STEPS) is None
    else:
        assert [e.name for e in hop.events] == STEPS
        assert all(isinstance(attr_of(e, "duration_ms"), float) for e in hop.events)


def attr_of(event: Event, key: str) -> object:
    return (event.attributes or {}).get(key)


def inventory_gpu(minor: int) -> str:
    sim = SimNvml.boot(NODE, fleet.get_fleet("dgx-h100"), seed=0)
    [gpu] = [g for g in inventory.scan(sim, NODE).inventory.gpus if g.minor == minor]
    return gpu.uuid


async def collect_events(bus: Bus, count: int) -> dict[str, tuple[ClaimEvent, dict[str, str]]]:
    events: dict[str, tuple[ClaimEvent, dict[str, str]]] = {}

    async def collect() -> None:
        async for delivery in bus.pull(
            subjects.CLAIMS_STREAM, "tracing", subjects.claim_events_all(), ClaimEvent
        ):
            await delivery.ack()
            key = f"{delivery.value.claim.name}:{delivery.value.event}"
            events[key] = (delivery.value, delivery.headers)
            if len(events) == count:
                return

    await asyncio.wait_for(collect(), 10)
    return events
