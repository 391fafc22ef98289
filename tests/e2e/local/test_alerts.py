"""The chart's alert rules in a real Prometheus (Debian's) scraping a `gpudra up` stack.

One simulated node (dgx-h100) with the whole stack (services.local.stack, what `gpudra
up` runs); Prometheus on a free 127.0.0.1 port scrapes every gpudra process's metrics
port each second and evaluates deploy/chart/gpudra/files/alerts.yaml each second. The
shipped file waits 5 minutes to an hour (``for:``) before an alert fires; the test loads
a copy with every ``for:`` set to 0s, and nothing else changed, so that an alert fires as
soon as its expression holds.

What fires: GpudraPreparesFailing. The test is the kubelet asking the node's real front
(its DRA socket) to prepare claims that do not exist; the preparer refuses each (not in
the API server) and the front counts the errors, until Prometheus's /api/v1/alerts shows
the alert firing for that node. What does not: the front is registered (kubelet-dra
registered both drivers), no stream is near its limit (the allocator, publisher and
ComputeDomain controller report their streams' fill), no live claim is outside the
audit window and no explanation is due. About 25 s on two cores, most of it the stack's
start.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from services.core.bus import retention, subjects
from services.kubeletplugin.sockets import SocketPaths
from services.local.prometheus import RULES, Prometheus
from services.local.stack import Stack
from services.local.stacknodes import NodeSpec
from services.proto_gen.kubelet.dra.v1 import api_pb2 as dra
from services.proto_gen.kubelet.dra.v1 import api_pb2_grpc as dra_grpc
from tests.helpers.prometheus import prometheus_binary
from tests.helpers.stackrun import started_stack
from tests.helpers.waiting import until

pytestmark = [pytest.mark.e2e]

NODE = "gpu-node-h100"
DRIVERS = ("gpu.nvidia.com", "compute-domain.nvidia.com")
#: Every stream whose fill its owner reports (services/core/bus/usage.py).
OWNED = [subjects.CLAIMS_STREAM] + [
    f"KV_{b}"
    for b in (subjects.CLAIMS_BUCKET, subjects.INVENTORY_BUCKET, subjects.PRESENCE_BUCKET,
              subjects.PREPARED_BUCKET, subjects.PUBLISHERS_BUCKET, subjects.DOMAINS_BUCKET)
]  # fmt: skip
QUIET = (
    "GpudraFrontUnregistered",
    "GpudraBusStreamNearLimit",
    "GpudraBusStreamFull",
    "GpudraAuditWindowShort",
    "GpudraExplanationBacklogStuck",
)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    prometheus_binary()  # skip before starting anything when there is none
    s = Stack(nodes=(NodeSpec(NODE, "dgx-h100"),), binary=controlplane_binary)
    with started_stack(request, s):
        yield s


def immediate_rules(workdir: Path) -> Path:
    """The shipped rules with every ``for:`` set to 0s (the only change): fire at once."""
    copy = workdir / "alerts-for-0s.yaml"
    text, count = re.subn(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", RULES.read_text())
    assert count == RULES.read_text().count("\n        for: ")
    copy.write_text(text)
    return copy


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[Prometheus]:
    targets = {name: f"127.0.0.1:{port}" for name, port in stack.metrics_ports.items()}
    # A node process's series get the node's name, as the chart's PodMonitor labels them.
    labels = {name: {"node": NODE} for name in targets if name.endswith(f"-{NODE}")}
    server = Prometheus(
        tmp_path / "prometheus", prometheus_binary(), targets, [immediate_rules(tmp_path)],
        labels=labels, interval=1.0,
    )  # fmt: skip
    with server:
        yield server


async def failed_prepare(stack: Stack) -> str:
    """The kubelet's call to the node's front for a claim that does not exist; its error."""
    socket = SocketPaths.for_driver(stack.nodes[NODE].paths.kubelet_root, DRIVERS[0]).dra
    uid = str(uuid.uuid4())
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        reply = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(uid=uid, namespace="default", name=f"nope-{uid[:8]}")]
            ),
            timeout=30,
        )
    return str(reply.claims[uid].error)


async def test_failing_prepares_fire_their_alert_and_nothing_else_fires(
    stack: Stack, prometheus: Prometheus
) -> None:
    def all_up() -> dict[str, bool] | None:
        up = prometheus.targets_up()
        return up if len(up) == len(stack.metrics_ports) and all(up.values()) else None

    up = await until(all_up, "Prometheus scraping every gpudra process", 60, 0.5)
    assert up and f"kubeletplugin-{NODE}" in up and "allocator" in up

    async def fails_and_fires() -> list[dict[str, object]]:
        error = await failed_prepare(stack)  # one more failure: the rate keeps rising
        assert "not found" in error, error
        return prometheus.firing("GpudraPreparesFailing")

    (alert,) = await until(fails_and_fires, "GpudraPreparesFailing firing", timeout=120, every=1)
    labels = alert["labels"]
    assert isinstance(labels, dict)
    assert (labels["node"], labels["pod"], labels["op"], labels["severity"]) == (
        NODE, f"kubeletplugin-{NODE}", "prepare", "warning",
    )  # fmt: skip
    annotations = alert["annotations"]
    assert isinstance(annotations, dict)
    assert annotations["summary"] == (
        f"100% of claim prepares fail on node {NODE} (kubeletplugin-{NODE})"
    )

    # What the quiet alerts watch is there, and healthy: both drivers registered, the
    # streams' fill reported by their owners (the allocator may read CLAIMS' state).
    registered = prometheus.query("gpudra_kubeletplugin_registered")
    assert {(s["metric"]["driver"], s["value"][1]) for s in registered} == {
        (driver, "1") for driver in DRIVERS
    }
    limits = {
        s["metric"]["stream"]: float(s["value"][1])
        for s in prometheus.query("gpudra_bus_stream_max_bytes")
    }
    for stream in OWNED:
        assert limits[stream] == retention.limits(stream.removeprefix("KV_")).max_bytes, stream
    for gauge in (
        "gpudra_allocator_claims_before_audit_window",
        "gpudra_allocator_explanations_due",
    ):
        assert [s["value"][1] for s in prometheus.query(gauge)] == ["0"], gauge
    states = {(a["labels"]["alertname"], a["state"]) for a in prometheus.alerts()}
    assert not [s for s in states if s[0] in QUIET], states
