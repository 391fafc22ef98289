"""The compute-domain.nvidia.com node driver end to end on one simulated GB200 node.

Real processes over real sockets: the fake kubelet registers the driver on
``gpudra kubeletplugin --compute-domains``'s own registration socket and calls
its DRA socket; the front forwards over a real nats-server (production
permissions) to ``gpudra preparer --compute-domains``, which checks every claim
and pod against a real kube-apiserver, reads ComputeDomains there and labels
the node. The node's IMEX daemon is played by the test writing its member key.
Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.client import KubeApi, http_api
from services.core.model import computedomain as cd
from services.core.model.schemas import ClaimEvent, DomainMember, DomainNodeState, NodeInventory
from services.core.telemetry import tracing
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.kubelet import Claim, FakeKubelet
from services.local.natsserver import NatsServer
from services.local.stack import COMPUTE_DOMAIN_CRD
from services.offline.slices import fleet_inventory
from services.preparer import checkpoint, checkpointfile
from tests.helpers.events import stored_claim_events
from tests.helpers.otlp import OtlpReceiver
from tests.helpers.preparer import Node
from tests.helpers.publisher import put_inventory

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODE = "gb-node"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=[NODE]) as cp:
        install_crd(cp, COMPUTE_DOMAIN_CRD.read_text())
        for ns in ("team-a", "team-b", "gpudra"):
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        yield cp


@dataclass
class Setup:
    node: Node
    api: KubeApi
    bus: Bus
    kubelet: FakeKubelet
    kubeconfig: str
    traces: OtlpReceiver  # what the front and the preparer export (``traced`` only)

    @property
    def cd_root(self) -> Path:
        return self.node.paths.kubelet_root / "plugins" / cd.CD_DRIVER

    def entries(self) -> dict[str, checkpoint.ClaimEntry]:
        path = self.cd_root / "checkpoint.json"
        return dict(checkpointfile.decode(path.read_bytes()).claims) if path.exists() else {}

    def specs(self) -> list[Path]:
        root = self.node.paths.cdi_root
        return sorted(root.glob("k8s.compute-domain.nvidia.com-*")) if root.is_dir() else []

    async def label(self) -> str | None:
        node = json.loads(await self.api.get(f"/api/v1/nodes/{NODE}"))
        value = node["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL)
        return str(value) if value is not None else None

    async def domain(self, name: str, namespace: str = "team-a") -> str:
        spec = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": name}}}
        body = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
        created = json.loads(await self.api.create(cd.domains_path(namespace), body))
        return str(created["metadata"]["uid"])

    async def member(self, domain_uid: str, status: DomainNodeState, reason: str = "") -> None:
        member = DomainMember(domain_uid=domain_uid, node=NODE, ip_address="127.0.0.2",
                              clique_id="c.1", status=status, reason=reason)  # fmt: skip
        key = subjects.domain_member_key(domain_uid, NODE)
        await self.bus.kv_put(subjects.DOMAINS_BUCKET, key, member)

    async def claim(self, name: str, namespace: str, device: str, params: dict[str, Any]) -> Claim:
        """An allocated claim reserved for a pod bound to this node, as the scheduler
        leaves it: in the API server, nowhere else."""
        request = cd.CHANNEL_REQUEST if device.startswith("channel") else cd.DAEMON_REQUEST
        klass = cd.CHANNEL_CLASS if request == cd.CHANNEL_REQUEST else cd.DAEMON_CLASS
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"devices": {"requests": [
                    {"name": request, "exactly": {"deviceClassName": klass}}]}}}  # fmt: skip
        created = json.loads(await self.api.create(CLAIMS.format(ns=namespace), body))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"pod-{name}", "namespace": namespace},
               "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}],
                        "resourceClaims": [{"name": "cd", "resourceClaimName": name}]}}  # fmt: skip
        made = await self.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
        pod_uid = json.loads(made)["metadata"]["uid"]
        config = {"source": "FromClaim", "requests": [request],
                  "opaque": {"driver": cd.CD_DRIVER, "parameters": params}}  # fmt: skip
        status = {"allocation": {"devices": {
                      "results": [{"request": request, "driver": cd.CD_DRIVER,
                                   "pool": NODE, "device": device}],
                      "config": [config]}},
                  "reservedFor": [{"resource": "pods", "name": f"pod-{name}",
                                   "uid": pod_uid}]}  # fmt: skip
        path = f"{CLAIMS.format(ns=namespace)}/{name}/status"
        await self.api.replace(path, {**created, "status": status})
        return Claim(created["metadata"]["uid"], namespace, name)

    async def prepare(self, claim: Claim, timeout: float = 45.0) -> tuple[str, list[str]]:
        result = (await self.kubelet.prepare([claim], timeout=timeout))[claim.uid]
        return result.error, [i for d in result.devices for i in d.cdi_device_ids]

    async def unprepare(self, claim: Claim) -> str:
        return (await self.kubelet.unprepare([claim]))[claim.uid]


def channel(domain_uid: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": cd.CHANNEL_CONFIG,
            "domainID": domain_uid, **extra}  # fmt: skip


def daemon(domain_uid: str) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": cd.DAEMON_CONFIG,
            "domainID": domain_uid}  # fmt: skip


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@contextlib.asynccontextmanager
async def running(
    apiserver: ControlPlane,
    root: Path,
    nats_server: NatsServer,
    bus: Bus,
    traced: bool,
    inventory: NodeInventory | None = None,
    gates: str = "",
) -> AsyncIterator[Setup]:
    """Discovery, the preparer and the front of one GB200 node, the fake kubelet registered
    on the compute-domain driver's socket. ``traced``: the processes export spans to an
    OTLP receiver in this test's loop (only where a test reads them: a process stopped
    while the loop is blocked would wait out its last export). ``inventory``: the node's
    inventory put on the bus instead of discovery's; ``gates``: the preparer's
    --feature-gates."""
    node = Node(root, nats_server, bus, name=NODE, fleet="gb200-nvl72")
    api = await http_api(str(apiserver.kubeconfig))
    traces = await OtlpReceiver().start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    env = env if traced else {}
    try:
        if inventory is None:
            await node.start_discovery()
        else:
            await put_inventory(bus, inventory)
        await node.start_preparer(
            claims="none",
            extra=["--kubeconfig", str(apiserver.kubeconfig), "--compute-domains",
                   *(["--feature-gates", gates] if gates else [])],
            env=env,
        )  # fmt: skip
        node.start_front("--compute-domains", env=env)
        registration = node.paths.registration_dir / f"{cd.CD_DRIVER}-reg.sock"
        async with FakeKubelet(node.paths.kubelet_root, driver=cd.CD_DRIVER) as kubelet:
            deadline = time.monotonic() + 20
            while not registration.is_socket() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await kubelet.register(registration)
            yield Setup(node, api, bus, kubelet, str(apiserver.kubeconfig), traces)
    finally:
        await node.stop_all()
        await traces.stop()
        await api.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {cd.DOMAIN_LABEL: None}}})
        await api.close()


@pytest.fixture
async def setup(
    apiserver: ControlPlane, short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[Setup]:
    async with running(apiserver, short_root, nats_server, bus, traced=False) as ready:
        yield ready


@pytest.fixture
async def traced(
    apiserver: ControlPlane, short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[Setup]:
    async with running(apiserver, short_root, nats_server, bus, traced=True) as ready:
        yield ready


async def wait_for(check: Any, what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------ the channel claim


async def test_a_channel_claim_waits_for_its_daemon_then_gets_the_imex_channel(
    setup: Setup,
) -> None:
    uid = await setup.domain("job")
    claim = await setup.claim("job-channel", "team-a", "channel-0", channel(uid))
    preparing = asyncio.create_task(setup.prepare(claim))
    # The node is labelled (the daemon comes here) while the prepare waits for readiness.
    assert await wait_for(lambda: _equals(setup.label(), uid), "the node label") == uid
    assert not preparing.done()
    assert setup.specs() == []  # no channel before the daemon is Ready
    await setup.member(uid, "NotReady", "peers missing")
    await setup.member(uid, "Ready")
    error, ids = await asyncio.wait_for(preparing, 45)
    assert error == ""
    assert ids == [f"k8s.compute-domain.nvidia.com/claim={claim.uid}-channel-0"]
    [spec_file] = setup.specs()
    spec = json.loads(spec_file.read_text())
    [device] = spec["devices"]
    [channel_node] = device["containerEdits"]["deviceNodes"]
    assert channel_node["path"] == "/dev/nvidia-caps-imex-channels/channel0"
    assert (channel_node["type"], channel_node["minor"]) == ("c", 0)
    entry = setup.entries()[claim.uid]
    assert entry.state == checkpoint.PREPARE_COMPLETED
    assert [d.name for d in entry.devices] == ["channel-0"]

    # Idempotent: the kubelet's retry gets the same answer, nothing is redone.
    assert await setup.prepare(claim) == ("", ids)

    # The claim's life is on the bus like every claim's.
    events = await _events(setup.bus, claim.uid, "prepared")
    assert events and events[-1].node == NODE and events[-1].outcome == "ok"

    # A restarted preparer keeps it prepared.
    preparer = next(p for p in setup.node.procs if p.name == "preparer")
    preparer.stop()
    setup.node.procs.remove(preparer)
    await setup.node.start_preparer(
        claims="none", extra=["--kubeconfig", setup.kubeconfig, "--compute-domains"]
    )
    assert await setup.prepare(claim) == ("", ids)

    # Unprepare leaves nothing: no label, no checkpoint entry, no CDI spec; twice is fine.
    assert await setup.unprepare(claim) == ""
    assert await setup.label() is None
    assert setup.entries() == {}
    assert setup.specs() == []
    assert await setup.unprepare(claim) == ""


async def test_a_claims_prepare_and_unprepare_are_spans_in_the_claims_own_trace(
    traced: Setup,
) -> None:
    setup = traced
    uid = await setup.domain(unique("traced"))
    await setup.member(uid, "Ready")
    claim = await setup.claim("traced", "team-a", "channel-0", channel(uid))
    assert (await setup.prepare(claim))[0] == ""
    assert await setup.unprepare(claim) == ""
    trace_id = tracing.claim_trace_hex(claim.uid)
    for op in ("prepare", "unprepare"):
        [send] = await setup.traces.wait_for(f"send dra.node.{{node}}.domain.{op}", 1)
        [hop] = await setup.traces.wait_for(f"process dra.node.{{node}}.domain.{op}", 1)
        assert send.trace_id == hop.trace_id == trace_id
        assert hop.parent_span_id == send.span_id  # the front's send, then the preparer
        assert hop.attributes[tracing.ATTR_UID] == claim.uid
        assert hop.attributes[tracing.ATTR_OUTCOME] == "ok"
    [hop] = await setup.traces.wait_for("process dra.node.{node}.domain.prepare", 1)
    assert hop.attributes[tracing.ATTR_DEVICES] == ["channel-0"]


async def test_the_label_stays_while_another_channel_claim_of_its_domain_is_prepared(
    setup: Setup,
) -> None:
    uid = await setup.domain("pair")
    await setup.member(uid, "Ready")
    first = await setup.claim("pair-1", "team-a", "channel-0", channel(uid))
    second = await setup.claim("pair-2", "team-a", "channel-0", channel(uid, allocationMode="All"))
    assert (await setup.prepare(first))[0] == ""
    assert (await setup.prepare(second))[0] == ""  # a second pod of the domain here (#309)
    all_spec = json.loads(next(p for p in setup.specs() if second.uid in p.name).read_text())
    assert len(all_spec["devices"][0]["containerEdits"]["deviceNodes"]) == cd.IMEX_CHANNELS
    assert await setup.unprepare(first) == ""
    assert await setup.label() == uid
    assert await setup.unprepare(second) == ""
    assert await setup.label() is None
    assert setup.entries() == {} and setup.specs() == []


async def test_refusals_name_their_reason_and_leave_nothing(setup: Setup) -> None:
    theirs = await setup.domain(unique("theirs"), "team-b")
    ours = await setup.domain(unique("ours"))
    other = await setup.domain(unique("other"))
    cases = [
        # A claim in another namespace than its domain (hostile: borrowing a domain).
        (await setup.claim("borrow", "team-a", "channel-0", channel(theirs)),
         "the ResourceClaim's namespace is different than the ComputeDomain's namespace"),
        # A domain that does not exist.
        (await setup.claim("ghost", "team-a", "channel-0", channel(str(uuid.uuid4()))),
         "ComputeDomain not found"),
        # Malformed configs: an unknown field, the wrong kind, no domain.
        (await setup.claim("typo", "team-a", "channel-0", channel(ours, allocationMod="All")),
         "allocationMod"),
        (await setup.claim("wrong-kind", "team-a", "channel-0", daemon(ours)),
         "cannot apply ComputeDomainDaemonConfig to request: channel"),
        (await setup.claim("no-domain", "team-a", "channel-0", channel("")),
         "domainID: must not be empty"),
        (await setup.claim("bad-mode", "team-a", "channel-0", channel(ours, allocationMode="Few")),
         "allocationMode"),
        # Hostile: a domainID that is a path (it never reaches one: no domain has it),
        # and a device of this driver that it never publishes.
        (await setup.claim("escape", "team-a", "channel-0", channel("../../../etc")),
         "ComputeDomain not found: ../../../etc"),
        (await setup.claim("stranger", "team-a", "gpu-0", channel(ours)),
         "'gpu-0' is not a compute-domain.nvidia.com device"),
    ]  # fmt: skip
    for claim, needle in cases:
        error, ids = await setup.prepare(claim)
        assert needle in error, error
        assert error.startswith(f"claim {claim.namespace}/{claim.name}"), error
        assert ids == []
        assert await setup.label() is None and setup.entries() == {} and setup.specs() == []

    # Two domains on one node: the second is refused while the first holds the label.
    await setup.member(ours, "Ready")
    held = await setup.claim("held", "team-a", "channel-0", channel(ours))
    assert (await setup.prepare(held))[0] == ""
    second = await setup.claim("second", "team-a", "channel-0", channel(other))
    error, _ = await setup.prepare(second, timeout=10)
    assert "label already exists for a different ComputeDomain" in error, error
    assert set(setup.entries()) == {held.uid}
    assert await setup.label() == ours
    assert await setup.unprepare(held) == ""
    assert await setup.label() is None and setup.entries() == {}

    # The service is still serving: the first claim of the other domain now goes in.
    await setup.member(other, "Ready")
    assert (await setup.prepare(second))[0] == ""
    assert await setup.unprepare(second) == ""


async def test_a_daemon_that_never_becomes_ready_fails_within_the_deadline(setup: Setup) -> None:
    uid = await setup.domain(unique("slow"))
    await setup.member(uid, "NotReady", "IMEX not READY: peers missing")
    claim = await setup.claim("slow", "team-a", "channel-0", channel(uid))
    started = time.monotonic()
    error, _ = await setup.prepare(claim, timeout=4)
    assert time.monotonic() - started < 4  # answered before the kubelet gave up
    assert "current node not ready in ComputeDomain" in error, error
    assert "NotReady: IMEX not READY: peers missing" in error
    assert await setup.label() == uid  # the daemon keeps coming; the retry finds it
    assert setup.specs() == []
    assert await setup.unprepare(claim) == ""  # the kubelet gives up: nothing stays
    assert await setup.label() is None and setup.entries() == {}


async def test_a_daemon_claim_gets_its_domain_identity_and_directory(setup: Setup) -> None:
    uid = await setup.domain(unique("imex"))
    claim = await setup.claim("daemon", "gpudra", "daemon-0", daemon(uid))
    error, ids = await setup.prepare(claim)
    assert error == ""
    assert ids == [f"k8s.compute-domain.nvidia.com/claim={claim.uid}-daemon-0"]
    [spec_file] = setup.specs()
    edits = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]
    env = dict(e.split("=", 1) for e in edits["env"])
    assert env["COMPUTE_DOMAIN_UUID"] == uid and env["COMPUTE_DOMAIN_NAMESPACE"] == "team-a"
    assert env["CLIQUE_ID"].endswith(".1")  # the GB200 tray's clique
    [mount] = edits["mounts"]
    assert mount["containerPath"] == "/imexd"
    assert mount["hostPath"] == str(setup.cd_root / "domains" / uid)
    assert is_dir(mount["hostPath"])
    [cap] = edits["deviceNodes"]
    assert cap["path"].startswith("/dev/nvidia-caps/nvidia-cap")
    assert await setup.label() is None  # a daemon claim never labels
    assert await setup.unprepare(claim) == ""
    assert setup.entries() == {} and setup.specs() == []
    assert not is_dir(mount["hostPath"])  # the domain's last daemon here: its folder goes


def _unregistered(inv: NodeInventory, index: int) -> NodeInventory:
    """GPU ``index``'s NVLink fabric registration still in progress (NVML state 2)."""
    gpus = list(inv.gpus)
    fabric = gpus[index].fabric
    assert fabric is not None
    fabric = msgspec.structs.replace(fabric, state=2)
    gpus[index] = msgspec.structs.replace(gpus[index], fabric=fabric)
    return msgspec.structs.replace(inv, gpus=gpus)


async def test_a_fabric_in_error_refuses_claims_unless_crash_on_fabric_errors_is_off(
    apiserver: ControlPlane, short_root: Path, nats_server: NatsServer, bus: Bus
) -> None:
    """CrashOnNVLinkFabricErrors (on by default): a GPU whose NVLink fabric did not
    register refuses every claim of the node, naming the GPU, before anything is done
    (the reference's plugin refuses to start there). Off: that GPU counts as outside the
    fabric, the others name the clique, and the channel is given."""
    sick = _unregistered(fleet_inventory("gb200-nvl72", NODE), 1)
    for each in ("on", "off"):
        (short_root / each).mkdir()
    async with running(apiserver, short_root / "on", nats_server, bus, False, sick) as setup:
        uid = await setup.domain(unique("sick"))
        await setup.member(uid, "Ready")
        for claim in (
            await setup.claim(unique("sick-channel"), "team-a", "channel-0", channel(uid)),
            await setup.claim(unique("sick-daemon"), "gpudra", "daemon-0", daemon(uid)),
        ):
            error, ids = await setup.prepare(claim, timeout=10)
            assert "the node's NVLink fabric (CrashOnNVLinkFabricErrors): GPU 1 (GPU-" in error
            assert "NVLink fabric state IN_PROGRESS" in error and ids == []
            assert await setup.label() is None and setup.entries() == {} and setup.specs() == []
    off = "CrashOnNVLinkFabricErrors=false"
    async with running(
        apiserver, short_root / "off", nats_server, bus, False, sick, gates=off
    ) as setup:
        uid = await setup.domain(unique("tolerant"))
        await setup.member(uid, "Ready")
        claim = await setup.claim(unique("tolerant"), "team-a", "channel-0", channel(uid))
        error, ids = await setup.prepare(claim)
        assert error == "" and ids == [f"k8s.compute-domain.nvidia.com/claim={claim.uid}-channel-0"]
        [spec_file] = setup.specs()
        [node] = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
        assert node["path"] == "/dev/nvidia-caps-imex-channels/channel0"
        assert await setup.unprepare(claim) == ""


async def _equals(value: Any, want: str) -> str | None:
    got = await value
    return got if got == want else None


async def _events(bus: Bus, uid: str, event: str) -> list[ClaimEvent]:
    async def found() -> list[ClaimEvent]:
        got = await stored_claim_events(bus)
        return [e for e in got if e.claim.uid == uid and e.event == event]

    result: list[ClaimEvent] = await wait_for(found, f"{event} event of {uid}")
    return result
