"""A service process's /metrics: only its own families and the runtime's, OpenMetrics with
the trace id of each claim operation as an exemplar. The preparer runs as a ``gpudra``
process on a simulated node, its claim events and metrics read from outside."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.core.model.schemas import ClaimEvent
from services.local.natsserver import NatsServer
from services.local.ports import free_port
from tests.helpers.events import stored_claim_events
from tests.helpers.preparer import Dev, Node, make_claim

pytestmark = pytest.mark.integration

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture
async def h100(tmp_path: Path, nats_server: NatsServer, bus: Bus) -> AsyncIterator[Node]:
    node = Node(tmp_path, nats_server, bus, fleet="dgx-h100")
    await node.start_discovery()
    try:
        yield node
    finally:
        await node.close()


async def prepared_event(bus: Bus, timeout: float = 30.0) -> ClaimEvent:
    """The ``prepared`` event, once stored (it is sent after the kubelet's answer)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in await stored_claim_events(bus) if e.event == "prepared"]
        if found:
            return found[-1]
        assert time.monotonic() < deadline, "the prepared event was never stored"
        await asyncio.sleep(0.05)


def scrape(port: int, accept: str = "", host: str = "127.0.0.1") -> str:
    request = urllib.request.Request(f"http://{host}:{port}/metrics")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return str(reply.read().decode())


async def test_the_preparer_exposes_its_own_metrics_with_trace_exemplars(h100: Node) -> None:
    port = free_port()
    # Tracing on (ids are made whether or not the collector answers; nothing listens here).
    env = {"GPUDRA_METRICS_PORT": str(port), "GPUDRA_OTLP_ENDPOINT": f"127.0.0.1:{free_port()}"}
    await h100.start_preparer(env=env)
    claim = await h100.put_claim(make_claim(h100.name, [Dev("gpu", "gpu-2")], name="m"))
    uid = claim.metadata.uid or ""
    assert (await h100.prepare(claim)).claims[uid].error == ""

    text = await asyncio.to_thread(scrape, port, OPENMETRICS)
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert "gpudra_preparer_claim_seconds" in families
    assert {"process_resident_memory_bytes", "python_info"} <= families
    mine = ("gpudra_preparer_", "gpudra_bus_", "gpudra_kube_", "gpudra_task_")
    foreign = {f for f in families if f.startswith("gpudra_") and not f.startswith(mine)}
    assert foreign == set()  # e.g. no discovery or allocator families, zero-valued or not

    trace_id = (await prepared_event(h100.bus)).trace_id
    assert len(trace_id) == 32 and set(trace_id) != {"0"}
    exemplar = re.search(
        r'^gpudra_preparer_claim_seconds_bucket\{[^}]*op="prepare"[^}]*\} 1\.0 '
        r'# \{trace_id="([0-9a-f]{32})"\}',
        text,
        re.M,
    )
    assert exemplar is not None, text
    assert exemplar.group(1) == trace_id
    # Prometheus' plain text format (no exemplars) is still served to those who ask for it.
    assert "# {trace_id" not in await asyncio.to_thread(scrape, port)


async def test_the_metrics_address_is_configurable(h100: Node) -> None:
    """Another address than the default 127.0.0.1 (a cluster gives 0.0.0.0; tests stay on
    loopback): the port listens there and nowhere else."""
    port = free_port()
    env = {"GPUDRA_METRICS_PORT": str(port), "GPUDRA_METRICS_ADDRESS": "127.0.0.2"}
    await h100.start_preparer(env=env)
    assert "gpudra_preparer_claims_total" in await asyncio.to_thread(scrape, port, "", "127.0.0.2")
    listening = await asyncio.to_thread(Path("/proc/net/tcp").read_text)
    assert f"0200007F:{port:04X}" in listening and f"0100007F:{port:04X}" not in listening
