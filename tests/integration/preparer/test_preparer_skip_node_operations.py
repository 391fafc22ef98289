"""skipNodeOperations (Kubernetes 1.37, DRAOptionalNodeOperations) through the kubelet's
socket, ``gpudra kubeletplugin`` and the real preparer on a simulated dgx-h100.

gpudra's slices never set it (every device it prepares needs its CDI spec and its
unprepare: docs/architecture.md), so an allocation result that carries it came from
another driver's slice, or from someone else's edit of ours. The kubelet calls a
driver unless every result of that driver skips the call; what reaches gpudra then:

* another driver's results, skipping or not, are that driver's: ours are prepared;
* results of ours of which only some skip: prepared, all of them (the kubelet asked,
  and it will unprepare);
* every result of ours skipping NodeUnprepareResources: refused, nothing done (the
  kubelet would never unprepare, and the devices would stay held);
* an unprepare of a claim never prepared: a no-op success.

Also DRAListTypeAttributes in KEP-5304 metadata: the VFIO device's attributes as
published, numaNode a one-element list (the reference writes GetDevice().Attributes).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.local.kubelet import Claim, FakeKubelet
from services.local.natsserver import NatsServer
from tests.helpers.preparer import API, Dev, Node, make_claim, opaque, ref, validate_cdi_file

pytestmark = pytest.mark.integration

GATES = "PassthroughSupport=true,DeviceMetadata=true,DRAListTypeAttributes=true"


@pytest.fixture
async def h100(
    short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[tuple[Node, FakeKubelet]]:
    node = Node(short_root, nats_server, bus, fleet="dgx-h100")
    try:
        await node.start_discovery()
        await node.start_preparer(gates=GATES)
        node.start_front()
        async with FakeKubelet(node.paths.kubelet_root) as kubelet:
            await kubelet.wait_for_registration_socket(timeout=20)
            await kubelet.register()
            yield node, kubelet
    finally:
        await node.close()


def skipping(claim: ResourceClaim, skips: list[list[str] | None], theirs: bool = False):
    """``claim`` with each of its results' skipNodeOperations set (and, with ``theirs``,
    another driver's result in another pool that skips everything)."""
    assert claim.status and claim.status.allocation and claim.status.allocation.devices
    devices = claim.status.allocation.devices
    results = [
        msgspec.structs.replace(r, skip_node_operations=skip)
        for r, skip in zip(devices.results or [], skips, strict=True)
    ]
    if theirs:
        results.append(
            msgspec.structs.replace(
                results[0], driver="net.example.com", pool="fabric", device="nic-0",
                skip_node_operations=["*"],
            )
        )  # fmt: skip
    allocation = msgspec.structs.replace(
        claim.status.allocation, devices=msgspec.structs.replace(devices, results=results)
    )
    return msgspec.structs.replace(
        claim, status=msgspec.structs.replace(claim.status, allocation=allocation)
    )


def read_lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def wire(claim: ResourceClaim) -> Claim:
    r = ref(claim)
    return Claim(r.uid, r.namespace, r.name)


async def test_results_that_skip_some_operations_are_prepared_as_any_other(
    h100: tuple[Node, FakeKubelet],
) -> None:
    node, kubelet = h100
    mixed = skipping(
        make_claim(node.name, [Dev("a", "gpu-0"), Dev("b", "gpu-1")], name="mixed"),
        [["*"], None],
        theirs=True,
    )
    await node.put_claim(mixed)
    result = (await kubelet.prepare([wire(mixed)]))[ref(mixed).uid]
    assert result.error == ""
    assert sorted(d.device_name for d in result.devices) == ["gpu-0", "gpu-1"]  # not nic-0
    (spec_file,) = node.cdi_files()
    names = [d["name"] for d in validate_cdi_file(spec_file)["devices"]]
    assert names == [f"{ref(mixed).uid}-gpu-0", f"{ref(mixed).uid}-gpu-1"]
    assert await kubelet.unprepare([wire(mixed)]) == {ref(mixed).uid: ""}
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}


async def test_a_claim_the_kubelet_would_never_unprepare_is_refused_and_nothing_is_done(
    h100: tuple[Node, FakeKubelet],
) -> None:
    node, kubelet = h100
    never = skipping(
        make_claim(node.name, [Dev("a", "gpu-2")], name="never"), [["NodeUnprepareResources"]]
    )
    await node.put_claim(never)
    result = (await kubelet.prepare([wire(never)]))[ref(never).uid]
    assert "skips NodeUnprepareResources" in result.error
    assert "the kubelet would never unprepare it" in result.error and result.devices == []
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}
    # The device is free for a claim that will be unprepared.
    fine = make_claim(node.name, [Dev("a", "gpu-2")], name="fine")
    await node.put_claim(fine)
    assert (await kubelet.prepare([wire(fine)]))[ref(fine).uid].error == ""
    assert await kubelet.unprepare([wire(fine)]) == {ref(fine).uid: ""}


async def test_an_unprepare_of_a_claim_never_prepared_succeeds(
    h100: tuple[Node, FakeKubelet],
) -> None:
    """What a kubelet that skipped NodePrepareResources and not the unprepare (an older
    one, or one that changed its mind) would send."""
    node, kubelet = h100
    skipped = skipping(make_claim(node.name, [Dev("a", "gpu-3")], name="skipped"), [["*"]])
    await node.put_claim(skipped)
    assert await kubelet.unprepare([wire(skipped)]) == {ref(skipped).uid: ""}
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}


async def test_kep5304_metadata_carries_numa_node_as_published(
    h100: tuple[Node, FakeKubelet],
) -> None:
    node, kubelet = h100
    config = {"apiVersion": API, "kind": "VfioDeviceConfig"}
    claim = make_claim(node.name, [Dev("vm", "gpu-vfio-5")], name="vm", configs=[opaque(config)])
    await node.put_claim(claim)
    assert (await kubelet.prepare([wire(claim)]))[ref(claim).uid].error == ""
    spec = validate_cdi_file(node.cdi_files()[0])
    [mount] = spec["devices"][0]["containerEdits"]["mounts"]
    objects = [json.loads(line) for line in read_lines(mount["hostPath"])]
    attributes = objects[0]["requests"][0]["devices"][0]["attributes"]
    assert attributes["resource.kubernetes.io/numaNode"] == {"ints": [1]}  # GPUs 4-7: socket 1
    assert attributes["resource.kubernetes.io/pciBusID"]["string"]
    assert await kubelet.unprepare([wire(claim)]) == {ref(claim).uid: ""}
