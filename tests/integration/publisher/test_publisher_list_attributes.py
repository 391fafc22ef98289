"""DRAListTypeAttributes: the publisher process, a real nats-server and an API server that
cannot store list-type attributes (the fake of tests/helpers/publisher.py answering as
kube-apiserver does with its own gate off: the list dropped, the slice refused, 422).

The publisher writes the int instead, says why once (log, metrics) and does not
rewrite the slices; a server too old for lists (1.35) gets the int from the start.
The same against the real kube-apiserver is tests/e2e/publisher/test_publisher_list_attributes.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.local.natsserver import NatsServer
from services.publisher.memoryapi import MemorySliceApi
from tests.helpers.inventories import node
from tests.helpers.publisher import FakeKube, nodes_of, publisher, put_inventory, until

pytestmark = pytest.mark.integration

NUMA = "resource.kubernetes.io/numaNode"
GATES = ("--force-registered", "--feature-gates", "DRAListTypeAttributes=true")
REFUSED = "gpudra_publisher_list_attributes_refused"
DROPPED = "gpudra_publisher_dropped_fields_total"


@pytest.fixture
async def kube(request: pytest.FixtureRequest) -> AsyncIterator[FakeKube]:
    minor, refuses = request.param
    fake = FakeKube(MemorySliceApi(minor=minor, refuses_lists=refuses, history_size=1000))
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


def _forms(kube: FakeKube) -> set[str]:
    return {
        "ints" if d.attributes[NUMA].is_list else "int"
        for s in kube.api.stored()
        for d in s.spec.devices or []
        if d.attributes and NUMA in d.attributes
    }


@pytest.mark.parametrize("kube", [(37, True)], indirect=True)
async def test_a_server_without_the_gate_gets_the_int_and_is_not_rewritten(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    await put_inventory(bus, node("n1"))
    with publisher(nats_server, kube, tmp_path, *GATES) as proc:
        await until(lambda: nodes_of(kube) == {"n1": 8}, "n1's slice", proc)
        assert _forms(kube) == {"int"}
        assert kube.api.calls["create"] == 2  # refused with the list, then the int
        await until(lambda: proc.metric(REFUSED) == 1, "the refusal in the metrics", proc)
        assert proc.metric(DROPPED, '{field="listTypeAttributes"}') == 1
        log = proc.log.read_text()
        assert log.count("the API server refuses list-type attributes") == 1
        assert "numaNode is published as an int" in log
        assert "attributes[resource.kubernetes.io/numaNode]" in log  # the server's words
        # Another node now goes straight to the int: no refused write, no rewrite of n1.
        await put_inventory(bus, node("n2"))
        await until(lambda: nodes_of(kube) == {"n1": 8, "n2": 8}, "n2's slice", proc)
        assert kube.api.calls["create"] == 3 and "replace" not in kube.api.calls
        assert [w.op for w in kube.api.writes] == ["create", "create"]
    # A restart tries the list once more (refused), then writes nothing.
    with publisher(nats_server, kube, tmp_path, *GATES) as proc:
        await until(lambda: proc.metric("gpudra_publisher_published_nodes") == 2, "resync", proc)
        assert [w.op for w in kube.api.writes] == ["create", "create"]
        assert 1 <= kube.api.calls.get("replace", 0) <= 2 and _forms(kube) == {"int"}


@pytest.mark.parametrize("kube", [(37, False)], indirect=True)
async def test_a_server_with_the_gate_stores_the_list(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    await put_inventory(bus, node("n1"))
    with publisher(nats_server, kube, tmp_path, *GATES) as proc:
        await until(lambda: nodes_of(kube) == {"n1": 8}, "n1's slice", proc)
        assert _forms(kube) == {"ints"} and kube.api.calls["create"] == 1
        assert proc.metric(REFUSED) == 0
        assert "list-type attributes" not in proc.log.read_text()


@pytest.mark.parametrize("kube", [(35, True)], indirect=True)
async def test_a_server_older_than_1_36_gets_the_int_without_a_refused_write(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    await put_inventory(bus, node("n1"))
    with publisher(nats_server, kube, tmp_path, *GATES) as proc:
        await until(lambda: nodes_of(kube) == {"n1": 8}, "n1's slice", proc)
        assert _forms(kube) == {"int"} and kube.api.calls["create"] == 1
        await until(lambda: proc.metric(REFUSED) == 1, "the gauge", proc)
        assert "the API server has no list-type attributes" in proc.log.read_text()
