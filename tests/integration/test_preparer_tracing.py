"""One trace per kubelet call: the preparer continues the caller's trace, span per step.

The preparer runs in-process here (with an in-memory span exporter) against a
real nats-server; the node's inventory is what discovery would write for a
simulated dgx-h100.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from services.core import featuregates, subjects, tracing
from services.core.access import Role
from services.core.bus import Bus
from services.core.natsserver import NatsServer
from services.core.schemas import ClaimEvent, NodeReply, NodeRequest
from services.discovery import fleet, inventory
from services.discovery.sim import SimNvml
from services.preparer.checkpoint import CheckpointStore
from services.preparer.claims import ClaimSource
from services.preparer.devices.simulated import SimulatedOps
from services.preparer.engine import Engine, Settings
from services.preparer.inventory import InventoryView
from services.preparer.service import PreparerService
from tests.helpers.bus import connect
from tests.helpers.preparer import Dev, make_claim, ref

pytestmark = pytest.mark.integration

NODE = "n1"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


@pytest.fixture
async def preparer(tmp_path: Path, bus: Bus) -> AsyncIterator[InMemorySpanExporter]:
    sim = SimNvml.boot(NODE, fleet.get_fleet("dgx-h100"), seed=0)
    await bus.kv_put(
        subjects.INVENTORY_BUCKET, subjects.inventory_key(NODE), inventory.scan(sim, NODE).inventory
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    store = CheckpointStore(tmp_path / "checkpoint.json", "boot")
    store.load()
    view = InventoryView(bus, NODE)
    await view.start()
    plugin_dir = tmp_path / "plugin"
    settings = Settings(NODE, featuregates.parse(""), tmp_path / "cdi", plugin_dir)
    ops = SimulatedOps(bus, NODE, view, plugin_dir)
    engine = Engine(
        settings, store, ClaimSource(bus, NODE, trust_bucket=True), view, ops, tracer=tracer
    )
    service = PreparerService(bus, engine, NODE, tracer=tracer)
    await service.start()
    try:
        yield exporter
    finally:
        await service.close()
        await view.stop()


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_spans_continue_the_callers_trace_and_carry_the_claim(
    preparer: InMemorySpanExporter, bus: Bus, nats_server: NatsServer
) -> None:
    good = make_claim(NODE, [Dev("gpu", "gpu-1")], name="good")
    bad = make_claim(NODE, [Dev("gpu", "gpu-99")], name="bad")
    for claim in (good, bad):
        await bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, ref(claim).uid), claim)
    request = NodeRequest(node=NODE, claims=[ref(good), ref(bad)], deadline=time.time() + 10)
    front = await connect(nats_server, Role.FRONT, NODE, name="front")  # whom it answers
    try:
        reply = await front.request(
            subjects.node_prepare(NODE),
            request,
            NodeReply,
            10,
            headers={"traceparent": TRACEPARENT},
        )
    finally:
        await front.close()
    assert reply.claims[ref(good).uid].error == ""
    assert "no GPU with minor 99" in reply.claims[ref(bad).uid].error

    spans = preparer.get_finished_spans()
    [root] = by_name(spans, "preparer.prepare")
    assert f"{root.context.trace_id:032x}" == TRACE_ID  # the kubelet plugin's trace goes on
    assert root.parent is not None and f"{root.parent.span_id:016x}" == "b7ad6b7169203331"
    assert [link.context for link in root.links] == [
        tracing.claim_anchor(ref(good).uid),
        tracing.claim_anchor(ref(bad).uid),
    ]
    claims = {
        s.attributes[tracing.ATTR_NAME]: s for s in by_name(spans, "claim.prepare") if s.attributes
    }
    assert set(claims) == {"good", "bad"}
    good_span = claims["good"]
    assert good_span.parent is not None and good_span.parent.span_id == root.context.span_id
    assert dict(good_span.attributes or {}) == tracing.claim_attributes(ref(good), NODE)
    assert claims["bad"].status.status_code == StatusCode.ERROR
    steps = [s.name for s in spans if s.parent and s.parent.span_id == good_span.context.span_id]
    assert steps == [
        "claim.fetch",
        "config.resolve",
        "checkpoint.started",
        "cdi.render",
        "cdi.write",
        "checkpoint.completed",
    ]

    events: dict[str, ClaimEvent] = {}

    async def collect() -> None:
        async for delivery in bus.pull(
            subjects.CLAIMS_STREAM, "tracing", subjects.claim_events_all(), ClaimEvent
        ):
            await delivery.ack()
            events[f"{delivery.value.claim.name}:{delivery.value.event}"] = delivery.value
            if len(events) == 4:
                return

    await asyncio.wait_for(collect(), 10)
    assert set(events) == {
        "good:prepare.requested",
        "good:prepared",
        "bad:prepare.requested",
        "bad:prepare.failed",
    }
    assert {e.trace_id for e in events.values()} == {TRACE_ID}
    failed = events["bad:prepare.failed"]
    assert failed.outcome == "error" and "gpu-99" in failed.error
