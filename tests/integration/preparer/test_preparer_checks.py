"""Zero trust on the bus: the preparer checks every claim itself before any side effect.

Each attack goes through the kubelet's own socket (fake kubelet -> ``gpudra
kubeletplugin`` -> NATS -> ``gpudra preparer``) against a simulated node whose
API server (``services.local.apiserver``) holds the truth: the claims as the
scheduler allocated them and the pods bound to the node. After every refusal
nothing was done: no CDI spec, no checkpoint entry, no MIG device, no metadata
file, no simulated host change. What the preparer cannot decide (an unprepare
while the pod still looks alive) is done and logged, as docs/security.md says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from services.core.bus.client import Bus
from services.core.kube.resource import (
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from services.core.model import nvidia
from services.local.apiserver import Obj
from services.local.kubelet import Claim, FakeKubelet
from services.local.natsserver import NatsServer
from tests.helpers.preparer import Dev, Node, make_claim, pod_for, reserved

pytestmark = pytest.mark.integration

GATES = "TimeSlicingSettings=true,DynamicMIG=true"
MIG = nvidia.mig_device_name(1, "1g.10gb", 19, 0)  # created by a prepare under DynamicMIG


@dataclass
class Setup:
    node: Node
    kubelet: FakeKubelet
    files: list[str]
    migs: list[str]

    async def prepare(self, claim: ResourceClaim) -> tuple[str, list[str]]:
        """The kubelet's call: the error, and the devices the container would get."""
        result = (await self.kubelet.prepare([kclaim(claim)]))[uid(claim)]
        return result.error, [d.device_name for d in result.devices]

    async def assert_refused_and_untouched(self, claim: ResourceClaim, needle: str) -> str:
        """The prepare fails naming the claim and ``needle``, and did nothing; the error."""
        error, devices = await self.prepare(claim)
        assert needle in error, error
        assert error.startswith(f"claim default/{claim.metadata.name}: "), error
        assert devices == []
        assert self.node.cdi_files() == [], "a CDI spec was written"
        assert self.node.files() == self.files, "files were left behind"
        assert dict(self.node.checkpoint().claims) == {}, "a checkpoint entry was left"
        assert await self.node.mig_uuids() == self.migs, "a MIG device was created"
        assert self.node.sim_host() == {}, "the simulated host was changed"
        return error


def uid(claim: ResourceClaim) -> str:
    return claim.metadata.uid or ""


def kclaim(claim: ResourceClaim) -> Claim:
    return Claim(uid(claim), claim.metadata.namespace or "default", claim.metadata.name)


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
            yield Setup(node, kubelet, node.files(), await node.mig_uuids())
    finally:
        await node.close()


# ------------------------------------------------------------------ forged and rewritten


async def test_a_forged_bucket_entry_for_a_claim_the_api_server_lacks_is_refused(
    setup: Setup,
) -> None:
    node = setup.node
    # A real pod on this node, with its real claim, that the forged entry pretends to serve.
    real = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-1")], name="real"))
    victim_pod = node.api.pods[("default", f"pod-{uid(real)}")]
    forged = reserved(
        make_claim(node.name, [Dev("gpu", "gpu-4"), Dev("slice", MIG)], name="forged"),
        victim_pod,
    )
    await node.put_bucket(forged)
    await setup.assert_refused_and_untouched(
        forged, "claim default/forged: not found in the API server"
    )


async def test_a_rewritten_bucket_entry_gives_the_container_only_the_schedulers_device(
    setup: Setup,
) -> None:
    node = setup.node
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-5")], name="train"))
    pod = node.api.pods[("default", f"pod-{uid(claim)}")]
    two = [Dev("gpu", "gpu-5"), Dev("gpu", "gpu-7")]
    await node.put_bucket(reserved(make_claim(node.name, two, uid=uid(claim), name="train"), pod))
    error, devices = await setup.prepare(claim)
    assert (error, devices) == ("", ["gpu-5"])
    [spec] = node.cdi_files()
    assert "gpu-7" not in spec.read_text()
    entry = node.checkpoint().claims[uid(claim)]
    assert [d.name for d in entry.devices] == ["gpu-5"]
    assert await setup.kubelet.unprepare([kclaim(claim)]) == {uid(claim): ""}


# ------------------------------------------------------------------ allocated elsewhere


def _elsewhere_by_selector(node: str) -> ResourceClaim:
    claim = make_claim(node, [Dev("gpu", "gpu-4")], name="elsewhere")
    selector = NodeSelector(
        node_selector_terms=[
            NodeSelectorTerm(
                match_fields=[
                    NodeSelectorRequirement(key="metadata.name", operator="In", values=["n2"])
                ]
            )
        ]
    )
    assert claim.status is not None and claim.status.allocation is not None
    allocation = msgspec.structs.replace(claim.status.allocation, node_selector=selector)
    status = msgspec.structs.replace(claim.status, allocation=allocation)
    return msgspec.structs.replace(claim, status=status)


ELSEWHERE: list[tuple[str, Callable[[str], ResourceClaim], str]] = [
    (
        "another node's pool",
        lambda node: make_claim(node, [Dev("gpu", "gpu-4", pool="n2")], name="elsewhere"),
        "device 'gpu-4' (request 'gpu') is in pool 'n2', not on this node 'n1'",
    ),
    (
        "a nodeSelector for another node",
        _elsewhere_by_selector,
        "the allocation's nodeSelector does not select this node 'n1' "
        "(it selects metadata.name In ['n2'])",
    ),
]


@pytest.mark.parametrize(("label", "claim", "needle"), ELSEWHERE, ids=[c[0] for c in ELSEWHERE])
async def test_a_claim_allocated_to_another_node_is_refused(
    setup: Setup, label: str, claim: Callable[[str], ResourceClaim], needle: str
) -> None:
    stored = await setup.node.put_claim(claim(setup.node.name))  # the API server's truth
    await setup.assert_refused_and_untouched(stored, needle)


# ------------------------------------------------------------------ reserved for whom


def _pod_elsewhere(claim: ResourceClaim, node: str) -> Obj:
    return pod_for(claim, "n2", phase="Running")


def _unscheduled_pod(claim: ResourceClaim, node: str) -> Obj:
    return pod_for(claim, "")


def _finished_pod(claim: ResourceClaim, node: str) -> Obj:
    return pod_for(claim, node, phase="Succeeded")


RESERVED: list[tuple[str, Callable[[ResourceClaim, str], Obj], str]] = [
    ("a pod on another node", _pod_elsewhere, "runs on node 'n2', not on this node 'n1'"),
    ("an unscheduled pod", _unscheduled_pod, "runs on no node (unscheduled), not on this node"),
    ("a finished pod", _finished_pod, "has finished (phase Succeeded)"),
]


@pytest.mark.parametrize(("label", "make_pod", "needle"), RESERVED, ids=[c[0] for c in RESERVED])
async def test_a_claim_reserved_for_no_pod_running_here_is_refused(
    setup: Setup, label: str, make_pod: Callable[[ResourceClaim, str], Obj], needle: str
) -> None:
    node = setup.node
    claim = make_claim(node.name, [Dev("gpu", "gpu-4"), Dev("slice", MIG)], name="other")
    pod = make_pod(claim, node.name)
    stored = await node.put_claim(reserved(claim, pod), pod=False)
    node.api.put_pod(pod)
    prefix = "the claim is reserved for no pod on this node 'n1': pod default/"
    error = await setup.assert_refused_and_untouched(stored, prefix + pod["metadata"]["name"])
    assert needle in error, error


async def test_a_reservation_naming_another_pods_uid_does_not_count(setup: Setup) -> None:
    node = setup.node
    claim = make_claim(node.name, [Dev("gpu", "gpu-4")], name="stolen")
    here = node.api.put_pod(pod_for(claim, node.name, phase="Running"))
    other_uid = "0" * 8 + here["metadata"]["uid"][8:]
    impostor = {**here, "metadata": {**here["metadata"], "uid": other_uid}}
    stored = await node.put_claim(reserved(claim, impostor), pod=False)
    await setup.assert_refused_and_untouched(
        stored,
        f"pod default/{here['metadata']['name']}: uid is {here['metadata']['uid']}, "
        f"the reservation names {impostor['metadata']['uid']}",
    )


async def test_a_claim_reserved_for_nobody_is_refused(setup: Setup) -> None:
    node = setup.node
    claim = await node.put_claim(
        make_claim(node.name, [Dev("gpu", "gpu-4"), Dev("slice", MIG)], name="nobody"), pod=False
    )
    await setup.assert_refused_and_untouched(
        claim, "the claim is not reserved for any pod (status.reservedFor is empty)"
    )


async def test_a_pod_the_watch_has_not_seen_is_read_from_the_api_server(setup: Setup) -> None:
    """A pod on another node is not in the node's watch: one GET of it decides."""
    node = setup.node
    claim = make_claim(node.name, [Dev("gpu", "gpu-4")], name="far")
    pod = node.api.put_pod(pod_for(claim, "n2", phase="Running"))
    stored = await node.put_claim(reserved(claim, pod), pod=False)
    before = node.api.served["pod"]
    await setup.assert_refused_and_untouched(stored, "runs on node 'n2'")
    assert node.api.served["pod"] - before == 1


# ------------------------------------------------------------------ the API server's copy


async def test_a_stale_copy_costs_one_get_not_a_failed_pod(setup: Setup) -> None:
    """The claim is read ahead when its pod appears, before it is reserved (as from a
    watch cache not yet caught up); the prepare finds the copy stale (reserved for
    nobody), reads the claim once more, fresh, and goes on."""
    node = setup.node
    claim = make_claim(node.name, [Dev("gpu", "gpu-2")], name="early")
    node.api.put_claim(claim)
    pod = pod_for(claim, node.name)
    read, cached = node.api.served["claim"], node.api.served["claim from cache"]
    node.api.put_pod(pod)
    await node.api.wait_served("claim", read + 1)  # the pod watch's read ahead
    assert node.api.served["claim from cache"] - cached == 1  # asked of the watch cache
    stored = await node.put_claim(reserved(claim, pod), pod=False)  # the scheduler reserves
    read = node.api.served["claim"]
    error, devices = await setup.prepare(stored)
    assert (error, devices) == ("", ["gpu-2"])
    assert node.api.served["claim"] - read == 1
    assert node.api.served["claim from cache"] - cached == 1  # the second read was fresh
    assert await setup.kubelet.unprepare([kclaim(stored)]) == {uid(stored): ""}


# ------------------------------------------------------------------ unprepare


async def test_an_unprepare_while_the_pod_still_looks_running_is_done_and_logged(
    setup: Setup,
) -> None:
    """The kubelet unprepares after a pod's containers stopped but before it reports the
    pod finished, so the API server cannot tell this from a forged unprepare: it is done
    (refusing would stall evictions and finished Jobs), and logged for the audit."""
    node = setup.node
    read = node.api.served["claim"]
    claim = await node.put_claim(make_claim(node.name, [Dev("slice", MIG)], name="busy"))
    await node.api.wait_served("claim", read + 1)  # the pod watch has the pod
    pod = node.api.pods[("default", f"pod-{uid(claim)}")]
    node.api.put_pod({**pod, "status": {"phase": "Running"}})
    assert (await setup.prepare(claim))[0] == ""
    assert await node.mig_uuids() != setup.migs
    assert await setup.kubelet.unprepare([kclaim(claim)]) == {uid(claim): ""}
    preparer = node.procs[1]
    assert "unprepare of a claim whose pod still looks alive on this node" in preparer.output()
    assert node.cdi_files() == [] and await node.mig_uuids() == setup.migs


# ------------------------------------------------------------------ without an API server


async def test_without_an_api_server_every_prepare_is_refused(setup: Setup) -> None:
    node = setup.node
    node.procs[1].stop()  # the preparer: again, with no API server at all
    preparer = await node.start_preparer(gates=GATES, claims="none")
    assert "every prepare will be refused" in preparer.output()
    claim = await node.put_claim(make_claim(node.name, [Dev("slice", MIG)], name="blind"))
    await setup.assert_refused_and_untouched(
        claim, "cannot be checked: this preparer has no API server to read the claim"
    )


async def test_a_trusted_bucket_is_still_checked_for_this_node(setup: Setup) -> None:
    node = setup.node
    node.procs[1].stop()
    preparer = await node.start_preparer(gates=GATES, claims="bucket")
    assert "CLAIMS ARE NOT CHECKED AGAINST THE API SERVER" in preparer.output()
    elsewhere = await node.put_bucket(
        make_claim(node.name, [Dev("gpu", "gpu-4", pool="n2")], name="elsewhere")
    )
    await setup.assert_refused_and_untouched(elsewhere, "is in pool 'n2', not on this node 'n1'")
    trusted = await node.put_bucket(make_claim(node.name, [Dev("gpu", "gpu-4")], name="trusted"))
    assert await setup.prepare(trusted) == ("", ["gpu-4"])
