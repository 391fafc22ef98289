"""The preparer's claim checks (services/preparer/verify.py) and how ClaimSource applies them.

ClaimSource runs here against in-memory stand-ins for the API server and the
node's pod watch, which count their calls: the tests say how many API calls
each path costs. The same paths run through the real socket, NATS and an HTTP
API server in tests/integration/preparer/test_preparer_checks.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

import msgspec
import pytest

from services.core.bus.client import Bus
from services.core.kube.pods import Pod
from services.core.kube.resource import (
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
)
from services.local.apiserver import Obj, pod_object
from services.preparer import claims as claims_module
from services.preparer import verify
from services.preparer.claims import ClaimError, ClaimSource
from services.preparer.pods import NodePods, PodChange
from tests.helpers.preparer import Dev, make_claim, pod_for, ref, reserved

NODE = "n1"


def term(*reqs: tuple[str, str, list[str]], labels: bool = False) -> NodeSelectorTerm:
    made = [NodeSelectorRequirement(key=k, operator=op, values=v) for k, op, v in reqs]
    return (
        NodeSelectorTerm(match_expressions=made) if labels else NodeSelectorTerm(match_fields=made)
    )


NAME = "metadata.name"
SELECTORS = [
    ("In this node", [term((NAME, "In", ["n0", NODE]))], True),
    ("In another node", [term((NAME, "In", ["n2"]))], False),
    ("NotIn another node alone names no node", [term((NAME, "NotIn", ["n2"]))], False),
    ("In and NotIn this node", [term((NAME, "In", [NODE]), (NAME, "NotIn", [NODE]))], False),
    ("terms are ORed", [term((NAME, "In", ["n2"])), term((NAME, "In", [NODE]))], True),
    ("labels only", [term(("kubernetes.io/hostname", "In", [NODE]), labels=True)], False),
]


@pytest.mark.parametrize(("label", "terms", "expected"), SELECTORS, ids=[s[0] for s in SELECTORS])
def test_a_node_selector_must_name_this_node(
    label: str, terms: list[NodeSelectorTerm], expected: bool
) -> None:
    assert verify.selects(NodeSelector(node_selector_terms=terms), NODE) is expected


def test_other_drivers_results_are_ignored_but_one_of_ours_is_needed() -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")])
    assert claim.status and claim.status.allocation and claim.status.allocation.devices
    [ours] = claim.status.allocation.devices.results or []
    theirs = msgspec.structs.replace(ours, driver="net.example.com", pool="n9", device="nic-0")
    devices = msgspec.structs.replace(claim.status.allocation.devices, results=[ours, theirs])
    mixed = _with_devices(claim, devices)
    assert verify.allocation(mixed, NODE) is None
    assert verify.our_results(mixed) == [ours]
    only_theirs = _with_devices(claim, msgspec.structs.replace(devices, results=[theirs]))
    assert verify.allocation(only_theirs, NODE) == (
        "allocation has no devices of driver gpu.nvidia.com (empty request)"
    )


@pytest.mark.parametrize(
    ("ours", "theirs", "refused"),
    [
        ([None], ["*"], False),  # another driver's result skipping everything: not ours
        ([["*"], None], None, False),  # the kubelet calls us for the claim: prepared
        ([["NodeUnprepareResources"], None], None, False),
        ([["NodeUnprepareResources"]], None, True),  # never unprepared
        ([["*"]], None, True),  # only an older kubelet would ask, and it would unprepare
        ([["NodePrepareResources", "NodeUnprepareResources"], ["*"]], None, True),
        ([["NodePrepareResources"]], None, False),  # invalid in the API; undo still comes
    ],
)
def test_skip_node_operations_refuse_only_what_would_never_be_unprepared(
    ours: list[list[str] | None], theirs: list[str] | None, refused: bool
) -> None:
    """skipNodeOperations (1.37): gpudra's slices never set it, so a result of ours that
    carries it came from someone else's slice; a claim is refused only when the kubelet
    would skip NodeUnprepareResources for our driver (every result of ours says so)."""
    claim = make_claim(NODE, [Dev("gpu", f"gpu-{i}") for i in range(len(ours))])
    assert claim.status and claim.status.allocation and claim.status.allocation.devices
    results = [
        msgspec.structs.replace(r, skip_node_operations=skip)
        for r, skip in zip(claim.status.allocation.devices.results or [], ours, strict=True)
    ]
    if theirs is not None:
        other = msgspec.structs.replace(
            results[0], driver="net.example.com", device="nic-0", skip_node_operations=theirs
        )
        results.append(other)
    mixed = _with_devices(
        claim, msgspec.structs.replace(claim.status.allocation.devices, results=results)
    )
    problem = verify.allocation(mixed, NODE)
    if not refused:
        assert problem is None
        return
    assert problem is not None
    assert problem.startswith(
        "every device of driver gpu.nvidia.com in the allocation skips NodeUnprepareResources "
        "(skipNodeOperations: 'gpu-0' "
    )
    assert "the kubelet would never unprepare it" in problem
    assert "written or changed by someone else" in problem


def _with_devices(claim: ResourceClaim, devices: object) -> ResourceClaim:
    assert claim.status and claim.status.allocation
    allocation = msgspec.structs.replace(claim.status.allocation, devices=devices)
    return msgspec.structs.replace(
        claim, status=msgspec.structs.replace(claim.status, allocation=allocation)
    )


def test_a_pod_counts_only_on_this_node_with_the_reserved_uid_and_not_finished() -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")])
    pod = pod_for(claim, NODE)
    [consumer] = verify.reserving_pods(reserved(claim, pod))
    decoded = msgspec.convert(pod, Pod)
    assert verify.pod_mismatch(decoded, consumer, "default", NODE) is None
    assert verify.running_here(decoded, consumer)
    gone = msgspec.convert(
        {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2025-01-01T00:00:00Z"}}, Pod
    )
    assert not verify.running_here(gone, consumer)  # being deleted: the kubelet unprepares
    done = msgspec.convert({**pod, "status": {"phase": "Failed"}}, Pod)
    assert verify.pod_mismatch(done, consumer, "default", NODE) == (
        f"pod default/{consumer.name}: has finished (phase Failed)"
    )
    assert not verify.running_here(done, consumer)
    assert verify.pod_mismatch(None, consumer, "default", NODE) == (
        f"pod default/{consumer.name}: not found"
    )


# ------------------------------------------------------------------ ClaimSource


class Api:
    """The API server's claims and its watch cache (``cache``: what it answers a cached
    read with, when set; it may lag ``claims``); counts GETs, and the cached ones."""

    def __init__(self) -> None:
        self.claims: dict[str, ResourceClaim] = {}
        self.cache: dict[str, ResourceClaim] | None = None
        self.gets = 0
        self.cached_gets = 0

    def put(self, claim: ResourceClaim) -> ResourceClaim:
        self.claims[claim.metadata.name] = claim
        return claim

    async def get_claim(
        self, namespace: str, name: str, *, cached: bool = False
    ) -> ResourceClaim | None:
        self.gets += 1
        self.cached_gets += cached
        if cached and self.cache is not None:
            return self.cache.get(name)
        return self.claims.get(name)


class Pods:
    """The node's pod watch (``watched``) and the API server's pods (``all``); counts GETs."""

    def __init__(self) -> None:
        self.watched: dict[str, Pod] = {}
        self.all: dict[str, Pod] = {}
        self.gets = 0
        self.on_change: PodChange | None = None

    async def bind(self, pod: Obj, *, watched: bool = True) -> Pod:
        decoded = msgspec.convert(pod, Pod)
        self.all[decoded.metadata.name] = decoded
        if watched:
            self.watched[decoded.metadata.name] = decoded
            assert self.on_change is not None
            await self.on_change(None, decoded)
        return decoded

    def seen(self, namespace: str, name: str) -> Pod | None:
        return self.watched.get(name)

    async def get(self, namespace: str, name: str) -> Pod | None:
        self.gets += 1
        return self.all.get(name)


@pytest.fixture
def api() -> Api:
    return Api()


@pytest.fixture
def pods() -> Pods:
    return Pods()


@pytest.fixture
async def source(api: Api, pods: Pods) -> ClaimSource:
    return ClaimSource(cast(Bus, None), NODE, api, cast(NodePods, pods))


async def settle(source: ClaimSource) -> None:
    """Until the claims read ahead have arrived."""
    for task in list(source._fetching.values()):
        await task


async def test_the_copy_read_ahead_for_a_new_pod_is_used_without_a_call(
    source: ClaimSource, api: Api, pods: Pods
) -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    pod = pod_for(claim, NODE)
    api.put(reserved(claim, pod))
    await pods.bind(pod)
    await settle(source)
    assert api.gets == 1
    assert (await source.get(ref(claim))).metadata.uid == claim.metadata.uid
    assert (api.gets, pods.gets) == (1, 0)


async def test_a_copy_that_fails_is_read_once_more_before_a_refusal(
    source: ClaimSource, api: Api, pods: Pods
) -> None:
    claim = api.put(make_claim(NODE, [Dev("gpu", "gpu-0")], name="c"))  # not reserved yet
    pod = pod_for(claim, NODE)
    await pods.bind(pod)
    await settle(source)
    with pytest.raises(ClaimError, match="is not reserved for any pod"):
        await source.get(ref(claim))
    assert api.gets == 2  # read ahead, read once more
    api.put(reserved(claim, pod))  # the scheduler reserves it: the next read sees it
    await source.get(ref(claim))
    assert api.gets == 3


async def test_a_read_ahead_the_watch_cache_had_not_caught_up_with_is_read_again_fresh(
    source: ClaimSource, api: Api, pods: Pods
) -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    pod = pod_for(claim, NODE)
    api.cache = {"c": claim}  # the cache has the claim before the scheduler reserved it
    api.put(reserved(claim, pod))
    await pods.bind(pod)
    await settle(source)
    assert (api.gets, api.cached_gets) == (1, 1)
    assert (await source.get(ref(claim))).status == api.claims["c"].status
    assert (api.gets, api.cached_gets) == (2, 1)  # the second read went past the cache


async def test_a_pod_the_watch_has_not_seen_is_read_from_the_api_server(
    source: ClaimSource, api: Api, pods: Pods
) -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    pod = pod_for(claim, NODE)
    api.put(reserved(claim, pod))
    await pods.bind(pod, watched=False)  # bound a moment ago: the kubelet is faster
    await source.get(ref(claim))
    assert (api.gets, pods.gets) == (1, 1)


async def test_pod_lookups_per_claim_are_capped(source: ClaimSource, api: Api, pods: Pods) -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    elsewhere = [pod_object(f"p{i}", "default", "n2", ["c"], phase="Running") for i in range(10)]
    for pod in elsewhere:
        await pods.bind(pod, watched=False)
    api.put(reserved(claim, *elsewhere))
    with pytest.raises(ClaimError) as refused:
        await source.get(ref(claim))
    cap = claims_module.MAX_POD_LOOKUPS
    assert pods.gets == cap
    assert f"{10 - cap} more pod(s) not seen here, not looked up" in str(refused.value)
    # The pod being started was reserved last: it is looked up first.
    starting = pod_object("new", "default", NODE, ["c"])
    await pods.bind(starting, watched=False)
    api.put(reserved(claim, *elsewhere, starting))
    pods.gets = 0
    await source.get(ref(claim))
    assert pods.gets == 1


async def test_a_different_bucket_copy_is_counted_and_never_used(
    source: ClaimSource, api: Api, pods: Pods
) -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-5")], name="c")
    pod = pod_for(claim, NODE)
    truth = api.put(reserved(claim, pod))
    await pods.bind(pod)
    forged = make_claim(NODE, [Dev("gpu", "gpu-5"), Dev("gpu", "gpu-7")], uid=claim.metadata.uid)
    source._cache[claim.metadata.uid or ""] = reserved(forged, pod)  # the bucket's mirror
    before = claims_module.BUCKET_MISMATCHES._value.get()
    assert await source.get(ref(claim)) == truth
    assert claims_module.BUCKET_MISMATCHES._value.get() == before + 1


async def test_a_claim_no_pod_of_this_node_names_any_more_is_forgotten(
    source: ClaimSource, api: Api, pods: Pods
) -> None:
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    pod = pod_for(claim, NODE)
    api.put(reserved(claim, pod))
    decoded = await pods.bind(pod)
    await settle(source)
    assert source.alive_holders(ref(claim)) == [f"default/{decoded.metadata.name}"]
    assert pods.on_change is not None
    await pods.on_change(decoded, None)
    assert source._copies == {} and source.alive_holders(ref(claim)) == []


async def test_without_an_api_server_nothing_is_prepared_unless_the_bucket_is_trusted() -> None:
    blind = ClaimSource(cast(Bus, None), NODE)
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    with pytest.raises(ClaimError, match="cannot be checked: this preparer has no API server"):
        await blind.get(ref(claim))
    with pytest.raises(ValueError, match="go together"):
        ClaimSource(cast(Bus, None), NODE, Api())


class SlowApi(Api):
    """GETs that wait for ``answer`` (a read in flight while the pod watch catches up)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()

    async def get_claim(
        self, namespace: str, name: str, *, cached: bool = False
    ) -> ResourceClaim | None:
        self.gets += 1
        await self.answer.wait()
        return self.claims.get(name)


async def test_a_claim_read_for_a_prepare_is_not_read_ahead_again(pods: Pods) -> None:
    """The kubelet called before the pod watch saw the pod: the prepare reads the claim;
    the pod arriving meanwhile costs no second read, and the prepare's copy is kept."""
    api = SlowApi()
    source = ClaimSource(cast(Bus, None), NODE, api, cast(NodePods, pods))
    claim = make_claim(NODE, [Dev("gpu", "gpu-0")], name="c")
    pod = pod_for(claim, NODE)
    api.put(reserved(claim, pod))
    prepare = asyncio.create_task(source.get(ref(claim)))
    while api.gets == 0:
        await asyncio.sleep(0)
    await pods.bind(pod)  # the watch catches up while the prepare's read is in flight
    api.answer.set()
    assert (await prepare).metadata.uid == claim.metadata.uid
    await settle(source)
    assert (api.gets, pods.gets) == (1, 0)
    assert source.copy_of("default", "c", claim.metadata.uid or "") is not None
    await source.get(ref(claim))  # the kubelet asks again: the copy answers
    assert api.gets == 1
