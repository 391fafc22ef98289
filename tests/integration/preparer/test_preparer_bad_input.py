"""Bad input through the kubelet's own socket: a per-claim error naming the field or reason.

The whole claim path runs: the fake kubelet (generated gRPC stubs) calls the
DRA socket of ``gpudra kubeletplugin``, which sends NATS requests to
``gpudra preparer``, which reads claims from the ``claims`` bucket (or a fake
API server) and drives the simulated node of ``gpudra discovery``. After every
bad claim nothing is left behind: no CDI spec, no checkpoint entry, no MIG
device, no metadata file, no simulated host change.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest
from nats.aio.msg import Msg

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.core.model import nvidia
from services.core.model.schemas import ClaimEventName
from services.local.apiserver import MemoryApiServer
from services.local.kubelet import Claim, FakeKubelet
from services.local.natsserver import NatsServer
from tests.helpers.events import stored_claim_subjects
from tests.helpers.preparer import (
    API,
    Dev,
    Node,
    gpu_config,
    make_claim,
    new_uid,
    opaque,
    ref,
    validate_cdi_file,
)
from tests.helpers.waiting import until

pytestmark = pytest.mark.integration

MIG = nvidia.mig_device_name(1, "1g.10gb", 19, 0)
# DeviceMetadata would need PassthroughSupport, which DynamicMIG excludes.
GATES = "TimeSlicingSettings=true,DynamicMIG=true"
MPS_GATES = "TimeSlicingSettings=true,MPSSupport=true"


# ------------------------------------------------------------------ fixtures


@dataclass
class Setup:
    node: Node
    kubelet: FakeKubelet

    @property
    def api(self) -> MemoryApiServer:
        return self.node.api


@pytest.fixture
async def setup(short_root: Path, nats_server: NatsServer, bus: Bus) -> AsyncIterator[Setup]:
    node = Node(short_root, nats_server, bus, fleet="dgx-h100")
    try:
        await node.start_discovery()
        await node.start_preparer(gates=GATES)
        node.start_front()
        async with FakeKubelet(node.paths.kubelet_root) as kubelet:
            await kubelet.wait_for_registration_socket(timeout=20)
            await kubelet.register()
            yield Setup(node, kubelet)
    finally:
        await node.close()


def kclaim(claim: ResourceClaim) -> Claim:
    r = ref(claim)
    return Claim(r.uid, r.namespace, r.name)


# ------------------------------------------------------------------ the cases


@dataclass
class Case:
    label: str
    claim: Callable[[str], ResourceClaim]  # node -> claim (put into the claims bucket)
    needle: str  # must appear in the per-claim error
    in_bucket: bool = True


def _cfg(
    params: dict[str, object], requests: tuple[str, ...] = ()
) -> Callable[[str], ResourceClaim]:
    return lambda node: make_claim(
        node, [Dev("gpu", "gpu-0")], name="bad", configs=[opaque(params, requests=requests)]
    )


CASES = [
    Case(
        "unknown config kind",
        _cfg({"apiVersion": API, "kind": "TpuConfig"}),
        "claim default/bad: config[0] (FromClaim): unknown kind 'TpuConfig'; expected one of "
        "GpuConfig, MigDeviceConfig, VfioDeviceConfig",
    ),
    Case(
        "unknown apiVersion",
        _cfg({"apiVersion": "resource.nvidia.com/v2", "kind": "GpuConfig"}),
        "config[0] (FromClaim): unsupported apiVersion 'resource.nvidia.com/v2'; "
        "expected resource.nvidia.com/v1beta1",
    ),
    Case(
        "unknown field",
        _cfg(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"intervall": "Long"})),
        "config[0] (FromClaim) GpuConfig.sharing.timeSlicingConfig.intervall: unknown field",
    ),
    Case(
        "TimeSlicing with mpsConfig",
        _cfg(gpu_config(strategy="TimeSlicing", mpsConfig={})),
        "config[0] (FromClaim) GpuConfig.sharing.mpsConfig: not allowed with strategy TimeSlicing",
    ),
    Case(
        "MPS with its gate off",
        _cfg(gpu_config(strategy="MPS")),
        'GpuConfig.sharing.strategy: "MPS" is selected as the GPU sharing strategy, '
        'but the "MPSSupport" feature gate is not enabled',
    ),
    Case(
        "GpuConfig on a MIG device",
        lambda node: make_claim(
            node,
            [Dev("slice", MIG)],
            name="bad",
            configs=[opaque(gpu_config(), requests=["slice"])],
        ),
        f"config[0] (FromClaim) GpuConfig: cannot apply to device '{MIG}' of type mig "
        "(request 'slice')",
    ),
    Case(
        "claim not allocated",
        lambda node: make_claim(node, [Dev("gpu", "gpu-0")], name="pending", allocated=False),
        "claim default/pending: the claim is not allocated (status.allocation is empty)",
    ),
    Case(
        "device not on this node (another pool)",
        lambda node: make_claim(node, [Dev("gpu", "gpu-0", pool="node-b")], name="bad"),
        "device 'gpu-0' (request 'gpu') is in pool 'node-b', not on this node 'n1'",
    ),
    Case(
        "device not on this node (no such GPU)",
        lambda node: make_claim(node, [Dev("gpu", "gpu-42")], name="bad"),
        "device 'gpu-42' is not on node n1: no GPU with minor 42",
    ),
    Case(
        "a VFIO device without its gate",
        lambda node: make_claim(node, [Dev("vm", "gpu-vfio-0")], name="bad"),
        "device 'gpu-vfio-0' of type vfio (request 'vm'): no config applies",
    ),
    Case(
        "an empty request (no devices of ours)",
        lambda node: make_claim(node, [], name="empty"),
        "claim default/empty: allocation has no devices of driver gpu.nvidia.com (empty request)",
    ),
]


async def test_each_bad_claim_gets_a_specific_error_and_leaves_nothing(setup: Setup) -> None:
    node, kubelet = setup.node, setup.kubelet
    before_files = node.files()
    before_migs = await node.mig_uuids()
    for case in CASES:
        claim = await node.put_claim(case.claim(node.name))
        results = await kubelet.prepare([kclaim(claim)])
        error = results[claim.metadata.uid or ""].error
        assert case.needle in error, f"{case.label}: {error!r}"
        assert results[claim.metadata.uid or ""].devices == [], case.label
        assert node.files() == before_files, f"{case.label} left files"
        assert dict(node.checkpoint().claims) == {}, f"{case.label} left a checkpoint entry"
        assert await node.mig_uuids() == before_migs, f"{case.label} left a MIG device"


async def test_limits_out_of_range_are_named(setup: Setup) -> None:
    node, kubelet = setup.node, setup.kubelet
    node.procs[1].stop()  # the preparer: again, with MPS on (DynamicMIG excludes it)
    await node.start_preparer(gates=MPS_GATES)
    cases = [
        (
            gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 150}),
            "claim default/bad: config[0] (FromClaim) "
            "GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: "
            "must be between 0 and 100, got 150",
        ),
        (
            gpu_config(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "-1Gi"}),
            "GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
            "must be greater than zero, got -1Gi",
        ),
        (
            gpu_config(
                strategy="MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}
            ),
            "GpuConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[3]: "
            "not a UUID or index of this config's devices",
        ),
    ]
    before = node.files()
    for params, needle in cases:
        claim = await node.put_claim(_cfg(params)(node.name))
        error = (await kubelet.prepare([kclaim(claim)]))[claim.metadata.uid or ""].error
        assert needle in error, error
        assert node.files() == before and node.sim_host().get("mps", {}) == {}
        assert dict(node.checkpoint().claims) == {}


async def test_replaced_and_unknown_claims_via_the_api_server(setup: Setup) -> None:
    node, kubelet = setup.node, setup.kubelet
    # The API server has a newer claim of that name: the kubelet's uid is refused.
    stale = make_claim(node.name, [Dev("gpu", "gpu-1")], name="job")
    current = await node.put_claim(
        make_claim(node.name, [Dev("gpu", "gpu-1")], name="job"), bucket=False
    )
    results = await kubelet.prepare([kclaim(stale)])
    error = results[stale.metadata.uid or ""].error
    assert error == (
        f"claim default/job: claim was replaced (the kubelet asked for uid {stale.metadata.uid}, "
        f"the claim now has uid {current.metadata.uid})"
    )
    gone = make_claim(node.name, [Dev("gpu", "gpu-1")], name="gone")
    results = await kubelet.prepare([kclaim(gone)])
    assert results[gone.metadata.uid or ""].error == (
        "claim default/gone: not found in the API server"
    )
    # The API server's claim prepares with nothing in the bucket.
    results = await kubelet.prepare([kclaim(current)])
    assert results[current.metadata.uid or ""].error == ""
    validate_cdi_file(node.cdi_files()[0])
    assert await kubelet.unprepare([kclaim(current)]) == {current.metadata.uid: ""}
    assert node.cdi_files() == []


async def test_two_claims_on_one_exclusive_device(setup: Setup) -> None:
    node, kubelet = setup.node, setup.kubelet
    first = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-5")], name="first"))
    second = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-5")], name="second"))
    assert (await kubelet.prepare([kclaim(first)]))[first.metadata.uid or ""].error == ""
    files = node.files()
    error = (await kubelet.prepare([kclaim(second)]))[second.metadata.uid or ""].error
    assert error.startswith("claim default/second: device 'gpu-5' is held by claim default/first (")
    assert node.files() == files
    assert set(node.checkpoint().claims) == {first.metadata.uid}
    assert await kubelet.unprepare([kclaim(first)]) == {first.metadata.uid: ""}


HOSTILE = [
    (
        "../../etc/passwd",
        "default",
        "c",
        "uid '../../etc/passwd' is not an RFC 4122 UUID or a DNS label",
    ),
    ("a/b", "default", "c", "uid 'a/b' is not an RFC 4122 UUID"),
    ("..", "default", "c", "uid '..' is not an RFC 4122 UUID"),
    ("*", "default", "c", "uid '*' is not an RFC 4122 UUID"),
    ("a.b", "default", "c", "uid 'a.b' is not an RFC 4122 UUID"),
    ("", "default", "c", "empty uid"),  # the front refuses it before the bus
    (None, "default", "../../x", "name '../../x' is not a DNS subdomain"),
    (None, "default", ".", "name '.' is not a DNS subdomain"),
    (None, "default", "a*", "name 'a*' is not a DNS subdomain"),
    (None, "default", "", "empty name"),  # the front refuses it before the bus
    (None, "kube.system", "c", "namespace 'kube.system' is not a DNS label"),
    (None, "a>b", "c", "namespace 'a>b' is not a DNS label"),
]


async def test_hostile_claim_identities_never_reach_a_path_or_subject(
    setup: Setup, bus: Bus
) -> None:
    node, kubelet = setup.node, setup.kubelet
    before = node.files()
    allowed = {subjects.node_prepare(node.name), subjects.node_unprepare(node.name)}
    asked: list[list[str]] = []  # events are sent after the reply: one may come a bit later
    for given_uid, namespace, name, needle in HOSTILE:
        uid = new_uid() if given_uid is None else given_uid
        asked.append([namespace, name, uid])
        seen: list[str] = []

        async def record(msg: Msg, seen: list[str] = seen) -> None:
            seen.append(msg.subject)

        sub = await bus.nc.subscribe(">", cb=record)
        await bus.nc.flush()  # the server knows the subscription before the front publishes
        results = await kubelet.prepare([Claim(uid, namespace, name)])
        assert needle in results[uid].error, (uid, name, results[uid].error)
        assert (await kubelet.unprepare([Claim(uid, namespace, name)]))[uid] != ""
        await bus.nc.flush()
        await sub.unsubscribe()
        assert node.files() == before, (uid, name)
        assert dict(node.checkpoint().claims) == {}
        # The identity travelled in payloads, and escaped in claim event subjects: every
        # other subject used is a fixed one, and each event subject holds the names whole.
        used = {s for s in seen if not s.startswith(("_I.", "$JS.", "_R_."))}
        events = {s for s in used if s.startswith(subjects.CLAIM_ROOT + ".")}
        assert used - events <= allowed, used - events - allowed
        for subject in events:
            tokens = subject.split(".")
            assert [subjects.unescape_token(t) for t in tokens[2:5]] in asked, subject
            assert subjects.unescape_token(tokens[5]) == node.name
            assert ".".join(tokens[6:]) in get_args(ClaimEventName), subject
    # Every identity the front let through reached the preparer, which refused it and
    # recorded the refusal under a subject holding the names escaped (read from the
    # stream, which keeps them: a live subscription may see the events late).
    reached = [a for a, (_, _, _, needle) in zip(asked, HOSTILE, strict=True)
               if not needle.startswith("empty")]  # fmt: skip

    async def refusals() -> dict[tuple[str, str, str], str]:
        found = {}
        for subject, event in await stored_claim_subjects(bus):
            if event.event == "prepare.failed":
                found[(event.claim.namespace, event.claim.name, event.claim.uid)] = subject
        return found if all(tuple(a) in found for a in reached) else {}

    stored = await until(refusals, "a prepare.failed event of every identity that got through")
    for namespace, name, uid in reached:
        subject = stored[(namespace, name, uid)]
        tokens = subject.split(".")
        assert [subjects.unescape_token(t) for t in tokens[2:5]] == [namespace, name, uid]


async def test_the_preparer_itself_refuses_an_empty_claim_reference(setup: Setup) -> None:
    """Past the front (e.g. another client on the bus), the preparer checks identities too."""
    from services.core.model.schemas import ClaimRef

    reply = await setup.node.request("prepare", [ClaimRef(uid="", namespace="", name="")])
    assert reply.claims[""].error == "claim ''/'': uid is empty"
    reply = await setup.node.request("unprepare", [ClaimRef(uid="x/y", namespace="ns", name="n")])
    assert "uid 'x/y' is not an RFC 4122 UUID" in reply.claims["x/y"].error


async def test_an_empty_kubelet_call_is_answered(setup: Setup) -> None:
    assert await setup.kubelet.prepare([]) == {}
    assert await setup.kubelet.unprepare([]) == {}


async def test_a_malformed_bus_request_does_not_hurt_the_preparer(setup: Setup, bus: Bus) -> None:
    await bus.nc.publish(subjects.node_prepare(setup.node.name), b"\x93garbage")
    claim = await setup.node.put_claim(
        make_claim(setup.node.name, [Dev("gpu", "gpu-2")], name="ok")
    )
    results = await setup.kubelet.prepare([kclaim(claim)])
    assert results[claim.metadata.uid or ""].error == ""
    assert setup.node.procs[1].alive()
