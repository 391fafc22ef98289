"""The kubelet plugin front as the kubelet sees it: a real process, real sockets, real NATS.

The front runs as ``python -m services.cli kubeletplugin``; a fake preparer in
the test answers on the bus; the fake kubelet registers and calls over the
generated stubs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.model.schemas import (
    ClaimResult,
    Gpu,
    GpuHealth,
    HealthEvent,
    NodeInventory,
    NodeReply,
    NodeRequest,
    PluginPresence,
    PreparedDevice,
)
from services.core.telemetry import tracing
from services.local.kubelet import Claim, DeviceHealth, FakeKubelet
from services.local.natsserver import NatsServer
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from tests.helpers.bus import connect
from tests.helpers.discovery import gpudra
from tests.helpers.otlp import OtlpReceiver

pytestmark = pytest.mark.integration

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
CD_DRIVER = "compute-domain.nvidia.com"
REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass
class Front:
    """One ``gpudra kubeletplugin`` process, stopped by its PID."""

    root: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def terminate(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"no exit {timeout} s after SIGTERM:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_front(
    root: Path, nats: NatsServer, *extra: str, env: dict[str, str] | None = None
) -> Front:
    log = root.parent / f"{root.name}.log"
    args = [
        sys.executable, "-m", "services.cli", "kubeletplugin",
        "--node-name", NODE,
        "--kubelet-root", str(root),
        *nats.client_argv(Role.FRONT, NODE),
        *extra,
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return Front(root, proc, log)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to 107 bytes: pytest's tmp_path can be too long."""
    path = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def front(short_dir: Path, nats_server: NatsServer) -> Iterator[Front]:
    running = start_front(short_dir / "kubelet", nats_server)
    try:
        yield running
    finally:
        running.terminate()


@pytest.fixture
async def kubelet(front: Front) -> AsyncIterator[FakeKubelet]:
    async with FakeKubelet(front.root) as client:
        await client.wait_for_registration_socket(timeout=20)
        yield client


@dataclass
class FakePreparer:
    """Answers NodeRequests on the bus and records what arrived."""

    requests: list[tuple[str, NodeRequest, dict[str, str]]] = field(default_factory=list)
    hold: asyncio.Event | None = None  # when set, answers wait for it

    async def serve(self, bus: Bus, node: str = NODE, driver: str = DRIVER) -> None:
        await bus.serve(subjects.node_prepare(node, driver), NodeRequest, self._prepare)
        await bus.serve(subjects.node_unprepare(node, driver), NodeRequest, self._unprepare)

    async def _prepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        self.requests.append(("prepare", request, headers))
        if self.hold is not None:
            await self.hold.wait()
        claims = {}
        for i, claim in enumerate(request.claims):
            if claim.name == "broken":
                claims[claim.uid] = ClaimResult(error="claim is broken")
                continue
            device = f"gpu-{i}"
            claims[claim.uid] = ClaimResult(
                devices=[
                    PreparedDevice(
                        request_names=["gpus/large"],
                        pool_name=request.node,
                        device_name=device,
                        cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={claim.uid}-{device}"],
                        share_id="share-1",
                    )
                ]
            )
        return NodeReply(claims=claims)

    async def _unprepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        self.requests.append(("unprepare", request, headers))
        return NodeReply(claims={c.uid: ClaimResult() for c in request.claims})


def is_there(path: str) -> bool:
    return Path(path).exists()


async def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- registration


async def test_registration_socket_follows_the_kubelet_contract(
    front: Front, kubelet: FakeKubelet
) -> None:
    reg = front.root / "plugins_registry" / f"{DRIVER}-reg.sock"
    dra = front.root / "plugins" / DRIVER / "dra.sock"
    assert kubelet.registration_sockets() == [reg]
    info = await kubelet.register()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(dra)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert kubelet.version == "v1.DRAPlugin"
    assert kubelet.health_version == "v1.DRAResourceHealth"  # what a 1.37 kubelet picks
    for path in (reg, dra):
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Directories the front created are private; the kubelet root is not ours to change.
    assert stat.S_IMODE((front.root / "plugins" / DRIVER).stat().st_mode) == 0o700
    assert stat.S_IMODE((front.root / "plugins_registry").stat().st_mode) == 0o700


async def test_grpc_health_is_serving_on_the_dra_socket(kubelet: FakeKubelet) -> None:
    info = await kubelet.register()
    async with grpc.aio.insecure_channel(f"unix:{info.endpoint}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_presence_follows_registration_and_sigterm(
    front: Front, kubelet: FakeKubelet, bus: Bus
) -> None:
    key = subjects.presence_key(NODE, DRIVER)
    assert await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence) is None
    info = await kubelet.register()

    async def present() -> PluginPresence | None:
        found = await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence)
        return found[0] if found else None

    record = await wait_for(present, what="presence record")
    assert (record.node, record.driver, record.endpoint) == (NODE, DRIVER, info.endpoint)

    await kubelet.close()
    assert front.terminate() == 0
    assert await present() is None
    assert kubelet.registration_sockets() == []
    assert not is_there(info.endpoint)


async def test_a_deleted_or_rewritten_presence_record_is_put_back_by_the_front(
    front: Front, kubelet: FakeKubelet, bus: Bus
) -> None:
    """Only the admin identity (and the node's own front) may write the node's presence
    key; whatever it deletes or rewrites the front puts back within its check interval,
    logged, or the publisher would withdraw the node's devices."""
    key = subjects.presence_key(NODE, DRIVER)
    info = await kubelet.register()

    async def ours() -> PluginPresence | None:
        found = await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence)
        return found[0] if found and found[0].endpoint == info.endpoint else None

    await wait_for(ours, what="presence record")
    await bus.kv_delete(subjects.PRESENCE_BUCKET, key)
    await wait_for(ours, timeout=30, what="the deleted record put back")
    forged = PluginPresence(node=NODE, driver=DRIVER, endpoint="/forged.sock", registered_at=1)
    await bus.kv_put(subjects.PRESENCE_BUCKET, key, forged)
    await wait_for(ours, timeout=30, what="the rewritten record put back")
    assert "presence record deleted by someone else; putting it back" in front.output()
    assert "presence record rewritten by someone else; putting it back" in front.output()


async def test_refused_registration_withdraws_presence(kubelet: FakeKubelet, bus: Bus) -> None:
    key = subjects.presence_key(NODE, DRIVER)
    await kubelet.register()
    await wait_for(
        lambda: bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence), what="presence"
    )
    await kubelet.register(accept=False, error="version not supported")

    async def gone() -> bool:
        return await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence) is None

    await wait_for(gone, what="presence withdrawn")


async def test_stale_sockets_are_replaced_and_rolling_update_names_used(
    short_dir: Path, nats_server: NatsServer
) -> None:
    root = short_dir / "kubelet"
    uid = "0b3c2f5e-7d3a-4a47-9f0c-1d2e3f405162"
    stale = [
        root / "plugins_registry" / f"{DRIVER}-{uid}-reg.sock",
        root / "plugins" / DRIVER / f"dra-{uid}.sock",
    ]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # bound, never listening: what a crashed plugin leaves behind
    front = start_front(root, nats_server, "--rolling-update-uid", uid)
    try:
        async with FakeKubelet(root) as kubelet:
            reg = await kubelet.wait_for_registration_socket(timeout=20)
            assert reg == stale[0]
            info = await kubelet.register()
            assert info.endpoint == str(stale[1])
    finally:
        assert front.terminate() == 0
    assert not any(p.exists() for p in stale)


def test_dra_socket_serves_before_the_registration_socket_appears(
    short_dir: Path, nats_server: NatsServer
) -> None:
    root = short_dir / "kubelet"
    reg = root / "plugins_registry" / f"{DRIVER}-reg.sock"
    dra = root / "plugins" / DRIVER / "dra.sock"
    front = start_front(root, nats_server)
    try:
        deadline = time.monotonic() + 20
        while not reg.exists():  # the kubelet's watcher acts on the first inotify event
            assert time.monotonic() < deadline and front.proc.poll() is None, front.output()
            time.sleep(0.001)
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(dra))  # already accepting
    finally:
        assert front.terminate() == 0


async def test_sigint_also_removes_sockets_and_presence(
    front: Front, kubelet: FakeKubelet, bus: Bus
) -> None:
    key = subjects.presence_key(NODE, DRIVER)
    await kubelet.register()
    await wait_for(
        lambda: bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence), what="presence"
    )
    await kubelet.close()
    os.kill(front.proc.pid, signal.SIGINT)
    assert front.proc.wait(15) == 0
    assert await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence) is None
    assert kubelet.registration_sockets() == []
    assert not is_there(str(front.root / "plugins" / DRIVER / "dra.sock"))


def test_a_file_in_the_socket_path_is_refused_not_deleted(
    short_dir: Path, nats_server: NatsServer
) -> None:
    root = short_dir / "kubelet"
    squatter = root / "plugins_registry" / f"{DRIVER}-reg.sock"
    squatter.parent.mkdir(parents=True)
    squatter.write_text("not a socket")
    front = start_front(root, nats_server)
    assert front.proc.wait(20) == 1
    assert squatter.read_text() == "not a socket"
    assert "is not a unix socket" in front.output()
    assert not (root / "plugins" / DRIVER / "dra.sock").exists()


async def test_compute_domain_driver_has_its_own_sockets_presence_and_subjects(
    short_dir: Path, nats_server: NatsServer, bus: Bus
) -> None:
    """--compute-domains: a second driver in the same process, under the same socket rules,
    whose claims reach only that driver's preparer subjects."""
    root = short_dir / "kubelet"
    reg = root / "plugins_registry" / f"{CD_DRIVER}-reg.sock"
    dra = root / "plugins" / CD_DRIVER / "dra.sock"
    reg.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(reg))  # left by a crashed plugin: replaced
    gpu_preparer, cd_preparer = FakePreparer(), FakePreparer()
    await gpu_preparer.serve(bus)
    await cd_preparer.serve(bus, driver=CD_DRIVER)
    front = start_front(root, nats_server, "--compute-domains")
    key = subjects.presence_key(NODE, CD_DRIVER)
    try:
        async with FakeKubelet(root, driver=CD_DRIVER) as kubelet:

            async def live() -> bool:
                return dra.is_socket() and len(kubelet.registration_sockets()) == 2

            await wait_for(live, what="both drivers' sockets")
            info = await kubelet.register(reg)
            assert (info.name, info.endpoint) == (CD_DRIVER, str(dra))
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            for path in (reg, dra):
                assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert stat.S_IMODE(dra.parent.stat().st_mode) == 0o700
            await wait_for(
                lambda: bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence),
                what="the compute-domain driver's presence",
            )
            # Its registration alone makes only its own driver present.
            gpu_key = subjects.presence_key(NODE, DRIVER)
            assert await bus.kv_get(subjects.PRESENCE_BUCKET, gpu_key, PluginPresence) is None
            claim = Claim("uid-cd", "ns", "channel")
            assert (await kubelet.prepare([claim]))[claim.uid].error == ""
            assert await kubelet.unprepare([claim]) == {claim.uid: ""}
            assert [op for op, _, _ in cd_preparer.requests] == ["prepare", "unprepare"]
            assert gpu_preparer.requests == []  # never sent to the GPU driver's preparer
    finally:
        assert front.terminate() == 0
    assert await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence) is None
    assert not reg.exists() and not dra.exists()
    assert not (root / "plugins" / DRIVER / "dra.sock").exists()


# ---------------------------------------------------------------- prepare / unprepare


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
async def test_prepare_and_unprepare_through_the_preparer(
    kubelet: FakeKubelet, bus: Bus, version: str
) -> None:
    preparer = FakePreparer()
    await preparer.serve(bus)
    await kubelet.register()
    claims = [Claim("uid-1", "ns", "first"), Claim("uid-2", "ns", "second")]
    results = await kubelet.prepare(claims, version=version)

    assert set(results) == {"uid-1", "uid-2"}
    for i, claim in enumerate(claims):
        result = results[claim.uid]
        assert result.error == ""
        [device] = result.devices
        assert device.request_names == ["gpus"]  # subrequest suffix stripped
        assert (device.pool_name, device.device_name) == (NODE, f"gpu-{i}")
        assert device.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-{i}"]
        assert device.share_id == ("share-1" if version == "v1.DRAPlugin" else None)

    [(op, request, _)] = preparer.requests
    assert op == "prepare" and request.node == NODE
    assert [(c.uid, c.namespace, c.name) for c in request.claims] == [
        ("uid-1", "ns", "first"),
        ("uid-2", "ns", "second"),
    ]
    # The kubelet's 45 s deadline is carried over, less the front's margin.
    assert 43 < request.deadline - time.time() <= 45

    assert await kubelet.unprepare(claims, version=version) == {"uid-1": "", "uid-2": ""}
    assert [op for op, _, _ in preparer.requests] == ["prepare", "unprepare"]


async def test_per_claim_errors_and_duplicate_uids(kubelet: FakeKubelet, bus: Bus) -> None:
    preparer = FakePreparer()
    await preparer.serve(bus)
    await kubelet.register()
    results = await kubelet.prepare(
        [
            Claim("uid-1", "ns", "broken"),
            Claim("uid-2", "ns", "fine"),
            Claim("uid-2", "ns", "fine"),  # the same claim twice: sent once
            Claim("uid-3", "ns", "a"),
            Claim("uid-3", "other", "b"),  # one UID, two claims: refused
            Claim("", "ns", "no-uid"),
        ]
    )
    assert results["uid-1"].error == "claim is broken" and results["uid-1"].devices == []
    assert results["uid-2"].error == "" and len(results["uid-2"].devices) == 1
    assert "uid-3 is listed for both ns/a and other/b" in results["uid-3"].error
    assert "empty uid" in results[""].error
    [(_, request, _)] = preparer.requests
    assert [c.uid for c in request.claims] == ["uid-1", "uid-2"]


async def test_empty_request_is_answered_without_the_preparer(
    kubelet: FakeKubelet, bus: Bus
) -> None:
    preparer = FakePreparer()
    await preparer.serve(bus)
    await kubelet.register()
    assert await kubelet.prepare([]) == {}
    assert await kubelet.unprepare([]) == {}
    assert preparer.requests == []


async def test_without_a_preparer_every_claim_gets_an_error(kubelet: FakeKubelet) -> None:
    await kubelet.register()
    claims = [Claim("uid-1"), Claim("uid-2")]
    for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
        # (the front waits up to 3 s, within the deadline, for a preparer to subscribe)
        results = await kubelet.prepare(claims, version=version, timeout=2)
        assert set(results) == {"uid-1", "uid-2"}
        for result in results.values():
            assert result.devices == []
            assert "no preparer is serving node 'node-a'" in result.error, result.error
        errors = await kubelet.unprepare(claims, version=version, timeout=2)
        assert all("unprepare failed: no preparer" in e for e in errors.values()), errors


async def test_a_late_preparer_yields_errors_before_the_kubelet_deadline(
    kubelet: FakeKubelet, bus: Bus
) -> None:
    hold = asyncio.Event()
    preparer = FakePreparer(hold=hold)
    await preparer.serve(bus)
    await kubelet.register()
    started = time.monotonic()
    try:
        results = await kubelet.prepare([Claim("uid-1"), Claim("uid-2")], timeout=2)
    finally:
        hold.set()
    elapsed = time.monotonic() - started
    assert elapsed < 2  # an answer, not DEADLINE_EXCEEDED
    assert len(preparer.requests) == 1
    assert set(results) == {"uid-1", "uid-2"}
    for result in results.values():
        assert re.search(r"preparer of node 'node-a' did not answer within 1\.\ds", result.error)


async def test_each_claim_of_a_traced_call_gets_its_own_trace_and_links_the_kubelet(
    short_dir: Path, nats_server: NatsServer, bus: Bus
) -> None:
    """A kubelet with tracing on sends its span context in the gRPC metadata; the
    front (exporting to a real OTLP receiver) answers each claim in the claim's
    trace, links the kubelet's span, and hands the preparer each claim's context."""
    receiver = await OtlpReceiver().start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    front = start_front(short_dir / "kubelet", nats_server, env=env)
    try:
        async with FakeKubelet(front.root) as kubelet:
            await kubelet.wait_for_registration_socket(timeout=20)
            preparer = FakePreparer()
            await preparer.serve(bus)
            await kubelet.register()
            kubelet.metadata = (("traceparent", TRACEPARENT),)
            await kubelet.prepare([Claim("uid-1"), Claim("uid-2")])
            sends = await receiver.wait_for("send dra.node.{node}.prepare", 2)
    finally:
        front.terminate()
        await receiver.stop()
    [(_, request, _)] = preparer.requests
    kubelet_span = tuple(TRACEPARENT.split("-")[1:3])
    for uid in ("uid-1", "uid-2"):
        trace_id = tracing.claim_trace_hex(uid)
        [send] = [s for s in sends if s.attributes[tracing.ATTR_UID] == uid]
        assert send.trace_id == trace_id and send.parent_span_id == ""  # a root: no dead link
        assert send.links == [kubelet_span]  # the kubelet's trace, linked
        assert send.attributes[tracing.ATTR_OUTCOME] == "ok"
        version, parent_trace, parent_span, flags = request.traceparents[uid].split("-")
        assert (version, parent_trace, parent_span) == ("00", trace_id, send.span_id)
        assert int(flags, 16) & 1  # sampled


# ---------------------------------------------------------------- health


def _gpu(index: int, **kw: object) -> Gpu:
    return Gpu(
        index=index,
        minor=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        memory_bytes=80 << 30,
        pci_bus_id=f"0000:{index + 10:02x}:00.0",
        **kw,  # type: ignore[arg-type]
    )


async def test_health_stream_follows_inventory_and_events(
    kubelet: FakeKubelet, bus: Bus, nats_server: NatsServer
) -> None:
    inventory = NodeInventory(
        node=NODE,
        driver_version="570.124.06",
        cuda_driver_version="12.8",
        gpus=[_gpu(0), _gpu(1, health=GpuHealth(lost=True)), _gpu(2)],
    )
    await bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(NODE), inventory)
    await kubelet.register()
    stream = kubelet.watch_health()
    first = await asyncio.wait_for(anext(stream), 10)
    assert first == {f"{NODE}/gpu-0": 1, f"{NODE}/gpu-1": 2, f"{NODE}/gpu-2": 1}

    def xid(gpu: int) -> HealthEvent:
        uuid = inventory.gpus[gpu].uuid
        return HealthEvent(node=NODE, gpu_uuid=uuid, gpu_index=gpu, kind="xid", xid=79)

    # Someone other than the node's discovery says gpu-0 failed: refused. (Flushed
    # first, so the front sees it before the real event below.)
    await bus.publish(subjects.health(NODE), xid(0))
    await bus.nc.flush()
    discovery = await connect(nats_server, Role.DISCOVERY, NODE, name="discovery")
    try:
        await discovery.publish(subjects.health(NODE), xid(2))
    finally:
        await discovery.close()
    second = await asyncio.wait_for(anext(stream), 10)
    assert second == {f"{NODE}/gpu-0": 1, f"{NODE}/gpu-1": 2, f"{NODE}/gpu-2": 2}
    await stream.aclose()


def kubelet_135_response() -> type[Message]:
    """NodeWatchResourcesResponse as a 1.35 kubelet knows it: v1alpha1 without ``message``."""
    file = descriptor_pb2.FileDescriptorProto()
    health_v1alpha1.DESCRIPTOR.CopyToProto(file)
    file.name = "kubelet-1.35/dra-health/v1alpha1/api.proto"
    (device_health,) = [m for m in file.message_type if m.name == "DeviceHealth"]
    kept = [f for f in device_health.field if f.name != "message"]
    del device_health.field[:]
    device_health.field.extend(kept)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    response = pool.FindMessageTypeByName("v1alpha1.NodeWatchResourcesResponse")
    return message_factory.GetMessageClass(response)


async def until(stream: AsyncIterator[T], check: Callable[[T], bool], timeout: float = 30) -> T:
    """The first message of ``stream`` that passes ``check``."""

    async def first() -> T:
        async for message in stream:
            if check(message):
                return message
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(first(), timeout)


async def test_v1_v1alpha1_and_a_1_35_kubelet_see_an_injected_xid_with_its_reason(
    kubelet: FakeKubelet, nats_server: NatsServer, short_dir: Path
) -> None:
    """A real discovery (simulated fleet), an XID injected with `gpudra sim xid`, three kubelets.

    A 1.37 kubelet watches v1 (its pick), a 1.36 one v1alpha1; a 1.35 one calls
    v1alpha1 with a message type that has no ``message`` field and must still
    read every device's health (the field is unknown to it and skipped).
    """
    log = short_dir / "discovery.log"
    with log.open("wb") as log_file:
        discovery = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "services.cli", "discovery"),
            *nats_server.client_argv(Role.DISCOVERY, NODE),
            *("--node-name", NODE, "--fleet", "dgx-h100", "--rescan-interval", "300"),
            cwd=REPO,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        info = await kubelet.register()
        assert kubelet.health_version == "v1.DRAResourceHealth"
        gpus = [f"{NODE}/gpu-{i}" for i in range(8)]
        v1 = kubelet.watch_device_health()
        v1alpha1 = kubelet.watch_device_health("v1alpha1.DRAResourceHealth")
        old = kubelet_135_response()
        channel = grpc.aio.insecure_channel(f"unix:{info.endpoint}")
        kubelet_135 = channel.unary_stream(
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
            request_serializer=lambda _: b"",
            response_deserializer=old.FromString,
        )(None)

        def all_healthy(devices: dict[str, DeviceHealth]) -> bool:
            return sorted(devices) == gpus and all(
                d == DeviceHealth(1, "") for d in devices.values()
            )

        for stream in (v1, v1alpha1):
            await until(stream, all_healthy, timeout=60)  # discovery's first inventory

        sim = nats_server.client_argv(Role.SIM)
        rc, out = await gpudra("sim", "xid", *sim, "--node", NODE, "--gpu", "3", "--xid", "79")
        assert rc == 0, out

        xid = DeviceHealth(2, "XID 79: GPU has fallen off the bus")
        want = {g: xid if g == f"{NODE}/gpu-3" else DeviceHealth(1, "") for g in gpus}
        for stream in (v1, v1alpha1):
            assert await until(stream, lambda d: d[f"{NODE}/gpu-3"].health == 2) == want

        def gpu3_unhealthy(message: Message) -> bool:
            return any(
                d.device.device_name == "gpu-3" and d.health == 2
                for d in message.devices  # type: ignore[attr-defined]
            )

        seen = await until(kubelet_135, gpu3_unhealthy)
        health = {d.device.device_name: d.health for d in seen.devices}
        assert health == {f"gpu-{i}": 2 if i == 3 else 1 for i in range(8)}
        (gpu3,) = [d for d in seen.devices if d.device.device_name == "gpu-3"]
        assert "message" not in {f.name for f in gpu3.DESCRIPTOR.fields}
        skipped = unknown_fields.UnknownFieldSet(gpu3)
        assert [(skipped[i].field_number, skipped[i].data) for i in range(len(skipped))] == [
            (5, b"XID 79: GPU has fallen off the bus")
        ]
        kubelet_135.cancel()
        await channel.close()
        for stream in (v1, v1alpha1):
            await stream.aclose()
    finally:
        if discovery.returncode is None:
            discovery.terminate()
            await asyncio.wait_for(discovery.wait(), 15)
