"""The claim watcher's parts without a cluster: lifecycle decisions, the informer
(list, watch, bookmarks, 410 relist, malformed objects), pending detection,
explanation messages and the Kubernetes Event recorder, against a scripted API."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import pytest

from services.allocator.structured.features import Features
from services.allocator.structured.features import parse as parse_gates
from services.allocator.watcher import lifecycle
from services.allocator.watcher.events import ClaimEventRecorder, event_name
from services.allocator.watcher.kubeobjects import NodeObject, Pod
from services.allocator.watcher.pending import (
    SHAPES_KEPT,
    ClusterAllocator,
    PodClock,
    concerns_driver,
    truncate,
    verdict,
    waiting_claims,
)
from services.allocator.watcher.watcher import consumer_batches
from services.core.bus import retention, subjects
from services.core.kube.client import ApiError, Body, Listing, RawEvent
from services.core.kube.informer import Informer
from services.core.kube.resource import DeviceClass, ResourceClaim, ResourceSlice
from services.core.model import deviceclasses
from services.core.model.schemas import ClaimEvent, ClaimRef, DeviceRef, PodRef, encode

DRIVER = "gpu.nvidia.com"


# ------------------------------------------------------------------ objects


def claim(
    name: str = "c",
    uid: str = "u1",
    rv: str = "1",
    devices: list[tuple[str, str, str]] | None = None,
    consumers: list[str] | None = None,
    driver: str = DRIVER,
    node: str | None = "n1",
    count: int = 1,
    class_name: str = "gpu",
) -> ResourceClaim:
    status: dict[str, Any] = {}
    if devices is not None:
        allocation: dict[str, Any] = {
            "devices": {
                "results": [
                    {"request": r, "driver": driver, "pool": p, "device": d} for r, p, d in devices
                ]
            }
        }
        if node:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        status["allocation"] = allocation
    if consumers:
        status["reservedFor"] = [{"resource": "pods", "name": c, "uid": c} for c in consumers]
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": class_name, "count": count}}
                    ]
                }
            },
            "status": status or None,
        },
        ResourceClaim,
    )


GPU0 = [("gpu", "n1", "gpu-0")]


def device_class(name: str = "gpu") -> DeviceClass:
    expression = f'device.driver == "{DRIVER}"'
    return msgspec.convert(
        {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}},
        DeviceClass,
    )


def slice_(node: str = "n1", devices: int = 1) -> ResourceSlice:
    return msgspec.convert(
        {
            "metadata": {"name": f"{node}-slice"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
            },
        },
        ResourceSlice,
    )


def pod(claims: list[str], created: str = "2020-01-01T00:00:00Z", node: str | None = None) -> Pod:
    return msgspec.convert(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "pod-1",
                "creationTimestamp": created,
            },
            "spec": {
                "nodeName": node,
                "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            },
        },
        Pod,
    )


# ------------------------------------------------------------------ lifecycle


def run(steps: list[ResourceClaim]) -> list[list[str]]:
    tracked: lifecycle.Tracked | None = None
    out = []
    for c in steps:
        step = lifecycle.observe(tracked, c)
        out.append(step.events)
        tracked = step.tracked if step.tracked is not None else (None if step.forget else tracked)
    return out


def test_allocation_then_reservation_then_release_and_deallocation() -> None:
    assert run(
        [
            claim(rv="1"),
            claim(rv="2", devices=GPU0),
            claim(rv="3", devices=GPU0, consumers=["pod-a"]),
            claim(rv="4", devices=GPU0, consumers=["pod-a", "pod-b"]),
            claim(rv="5", devices=GPU0, consumers=["pod-b"]),
            claim(rv="6", devices=GPU0),
            claim(rv="7"),
        ]
    ) == [[], ["allocated"], ["reserved"], ["reserved"], [], ["released"], []]


def test_allocated_and_reserved_in_one_update_and_replays_repeat_nothing() -> None:
    full = claim(rv="2", devices=GPU0, consumers=["pod-a"])
    assert run([full, full, claim(rv="2", devices=GPU0, consumers=["pod-a"])]) == [
        ["allocated", "reserved"],
        [],
        [],
    ]


def test_deallocation_of_a_reserved_claim_releases_once() -> None:
    assert run([claim(devices=GPU0, consumers=["a"]), claim(rv="2")]) == [
        ["allocated", "reserved"],
        ["released"],
    ]


def test_reallocation_to_other_devices_releases_then_allocates() -> None:
    other = [("gpu", "n2", "gpu-3")]
    assert run([claim(devices=GPU0, consumers=["a"]), claim(rv="2", devices=other)]) == [
        ["allocated", "reserved"],
        ["released", "allocated"],
    ]


def test_other_drivers_are_ignored() -> None:
    assert run([claim(devices=GPU0, consumers=["a"], driver="nic.example.com")]) == [[]]


def test_bucket_writes_follow_resource_versions() -> None:
    first = lifecycle.observe(None, claim(rv="1", devices=GPU0))
    assert first.store
    again = lifecycle.observe(first.tracked, claim(rv="1", devices=GPU0))
    assert not again.store and not again.events
    newer = lifecycle.observe(first.tracked, claim(rv="2", devices=GPU0, consumers=["a"]))
    assert newer.store and newer.events == ["reserved"]


def test_deleted_after_deallocation_is_still_reported() -> None:
    step = lifecycle.observe(None, claim(devices=GPU0))
    gone = lifecycle.observe(step.tracked, claim(rv="2"))
    assert gone.forget and gone.tracked is not None and not gone.tracked.devices
    assert lifecycle.deleted(gone.tracked).events == ["deleted"]
    assert lifecycle.deleted(None).events == []


def test_node_from_selector_else_pool() -> None:
    assert lifecycle.allocation_node(claim(devices=GPU0, node="n7")) == "n7"
    assert lifecycle.allocation_node(claim(devices=[("gpu", "pool-9", "gpu-0")], node=None)) == (
        "pool-9"
    )


# ------------------------------------------------------------------ informer


class ScriptedApi:
    """list() answers from ``listings``; each watch() replays one script of events/errors."""

    def __init__(self, listings: list[Listing], watches: list[list[RawEvent | ApiError]]) -> None:
        self.listings = listings
        self.watches = watches
        self.watch_versions: list[str] = []
        self.done = asyncio.Event()

    async def list(self, path: str, params: Mapping[str, str]) -> Listing:
        return self.listings.pop(0)

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[RawEvent]:
        self.watch_versions.append(resource_version)
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()
        for item in self.watches.pop(0):
            if isinstance(item, ApiError):
                raise item
            yield item

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        raise NotImplementedError

    async def create(self, path: str, body: Body) -> bytes:
        raise NotImplementedError

    async def patch(self, path: str, body: dict[str, Any]) -> bytes:
        raise NotImplementedError

    async def replace(self, path: str, body: Body) -> bytes:
        raise NotImplementedError

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def raw(obj: ResourceClaim | dict[str, Any]) -> msgspec.Raw:
    data = msgspec.json.encode(obj) if not isinstance(obj, dict) else json.dumps(obj).encode()
    return msgspec.Raw(data)


async def test_informer_lists_watches_skips_malformed_and_relists_after_410() -> None:
    a1, b1 = claim("a", "ua", "10"), claim("b", "ub", "11")
    a2 = claim("a", "ua", "20", devices=GPU0)
    bad = {"metadata": {"name": "x", "namespace": "ns", "resourceVersion": "21"}, "spec": 7}
    api = ScriptedApi(
        listings=[Listing([raw(a1), raw(b1)], "11"), Listing([raw(a2)], "30")],
        watches=[
            [
                RawEvent("MODIFIED", raw(a2)),
                RawEvent("ADDED", raw(bad)),  # malformed: skipped, its RV still counts
                RawEvent("BOOKMARK", raw({"metadata": {"resourceVersion": "25"}})),
            ],
            [ApiError(410, "too old resource version", "Expired")],
        ],
    )
    changes: list[tuple[str | None, str | None]] = []

    async def on_change(old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        changes.append(
            (
                old.metadata.resource_version if old else None,
                new.metadata.resource_version if new else None,
            )
        )

    informer = Informer(api, "resourceclaims", "/x", ResourceClaim, on_change=on_change)
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.done.wait(), 5)
    task.cancel()
    # Watch from the listing, resume after the bookmark, then list again after the 410.
    assert api.watch_versions == ["11", "25", "30"]
    assert changes == [(None, "10"), (None, "11"), ("10", "20"), ("11", None)]
    assert set(informer.items) == {"ns/a"}


async def test_informer_survives_a_failing_handler() -> None:
    api = ScriptedApi(
        listings=[Listing([raw(claim("a", "ua", "1")), raw(claim("b", "ub", "2"))], "2")],
        watches=[],
    )
    seen: list[str] = []

    async def on_change(old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        assert new is not None
        seen.append(new.metadata.name)
        if new.metadata.name == "a":
            raise RuntimeError("boom")

    informer = Informer(api, "resourceclaims", "/x", ResourceClaim, on_change=on_change)
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.done.wait(), 5)
    task.cancel()
    assert seen == ["a", "b"]


# ------------------------------------------------------------------ pending


def test_waiting_claims_need_an_unscheduled_pod_past_the_threshold() -> None:
    classes = {"gpu": device_class()}
    pending = claim("c", "uc")
    claims = {"ns/c": pending}
    now = 1577836800.0 + 100  # 100 s after the pod's creation
    found = waiting_claims([pod(["c"])], claims, classes, PodClock(), threshold=30, now=now)
    assert [w.claim.metadata.uid for w in found] == ["uc"]
    assert found[0].waited == pytest.approx(100)
    assert not waiting_claims([pod(["c"])], claims, classes, PodClock(), threshold=300, now=now)
    assert not waiting_claims([pod(["c"], node="n1")], claims, classes, PodClock(), 30, now)
    allocated = {"ns/c": claim("c", "uc", devices=GPU0)}
    assert not waiting_claims([pod(["c"])], allocated, classes, PodClock(), 30, now)
    other = {"gpu": msgspec.structs.replace(device_class(), spec=device_class().spec.__class__())}
    assert not waiting_claims([pod(["c"])], claims, other, PodClock(), 30, now)


def test_a_pod_created_in_our_future_waits_from_when_we_saw_it() -> None:
    clock = PodClock()
    future = pod(["c"], created="2100-01-01T00:00:00Z")
    assert clock.since(future, 1000.0) == 0
    assert clock.since(future, 1042.0) == 42


def _cluster(devices: int) -> ClusterAllocator:
    cluster = ClusterAllocator(Features())
    node = msgspec.convert({"metadata": {"name": "n1"}}, NodeObject)
    cluster.update(1, 1, 1, [device_class()], [slice_(devices=devices)], [], [node])
    return cluster


def test_the_engine_starts_over_past_so_many_claim_shapes() -> None:
    """What the kept engine learns grows with the claim shapes it sees: past
    SHAPES_KEPT of them the next update builds a fresh one (and answers the same)."""
    cluster = _cluster(devices=2)
    node = msgspec.convert({"metadata": {"name": "n1"}}, NodeObject)
    first = cluster._allocator
    for count in range(1, SHAPES_KEPT + 2):
        cluster.explain(claim(count=count))
    cluster.update(1, 1, 1, [device_class()], [slice_(devices=2)], [], [node])
    assert cluster._allocator is not first
    assert verdict(cluster.explain(claim(count=2))).reason == "AllocationExplained"
    kept = cluster._allocator
    cluster.explain(claim(count=3))
    cluster.update(1, 1, 1, [device_class()], [slice_(devices=2)], [], [node])
    assert cluster._allocator is kept  # two shapes: kept


def test_verdict_for_an_unsatisfiable_claim_names_the_shortfall() -> None:
    outcome = _cluster(devices=1).explain(claim(count=3))
    result = verdict(outcome)
    assert (result.reason, result.type, result.status) == (
        "Unschedulable",
        "Warning",
        "unschedulable",
    )
    assert "no node can allocate the claim (1 node(s) tried)" in result.message
    assert "request gpu: needs 3, 1 candidate device(s) on 1 node(s)" in result.message


@pytest.mark.parametrize("declared", [[], ["DRAOptionalNodeOperations"]])
def test_a_nodes_declared_features_reach_the_1_37_allocator(declared: list[str]) -> None:
    """A slice whose devices skip node operations serves only nodes that declare
    DRAOptionalNodeOperations (status.declaredFeatures), with that gate on."""
    features = parse_gates("DRAOptionalNodeOperations=true", 37)
    cluster = ClusterAllocator(features)
    node = msgspec.convert(
        {"metadata": {"name": "n1"}, "status": {"declaredFeatures": declared}}, NodeObject
    )
    skipping = slice_(devices=1)
    skipping.spec.skip_node_operations = ["*"]
    cluster.update(1, 1, 1, [device_class()], [skipping], [], [node])
    outcome = cluster.explain(claim(count=1))
    assert outcome.status == ("allocated" if declared else "unschedulable"), outcome


def test_verdict_for_a_claim_that_fits_says_so() -> None:
    result = verdict(_cluster(devices=2).explain(claim(count=2)))
    assert (result.reason, result.type) == ("AllocationExplained", "Normal")
    assert "fits on node n1 (n1/gpu-0, n1/gpu-1)" in result.message


def test_verdict_for_a_missing_class_is_unschedulable() -> None:
    """As kube-scheduler's PreFilter: the class may still be created."""
    result = verdict(_cluster(devices=1).explain(claim(class_name="nope")))
    assert result.reason == "Unschedulable" and result.status == "unschedulable"
    assert "device class nope does not exist" in result.message


def test_messages_are_cut_at_1024_bytes() -> None:
    cut = truncate("é" * 1000)
    assert len(cut.encode()) <= 1024 and cut.endswith("...")
    assert truncate("short") == "short"


# ------------------------------------------------------------------ Kubernetes Events


class EventsApi(ScriptedApi):
    def __init__(self, existing: dict[str, int] | None = None) -> None:
        super().__init__([], [])
        self.events: dict[str, dict[str, Any]] = {
            k: {"count": v, "message": "old"} for k, v in (existing or {}).items()
        }
        self.calls: list[str] = []

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        self.calls.append("get")
        return json.dumps(self.events[path]).encode()

    async def create(self, path: str, body: Body) -> bytes:
        self.calls.append("create")
        assert isinstance(body, dict)  # the recorder sends plain data
        full = f"{path}/{body['metadata']['name']}"
        if full in self.events:
            raise ApiError(409, "exists", "AlreadyExists")
        self.events[full] = dict(body)
        return b"{}"

    async def patch(self, path: str, body: dict[str, Any]) -> bytes:
        self.calls.append("patch")
        if path not in self.events:
            raise ApiError(404, "not found", "NotFound")
        self.events[path].update(body)
        return b"{}"


def _event_path(c: ResourceClaim) -> str:
    return f"/api/v1/namespaces/ns/events/{event_name(c)}"


async def test_one_event_per_claim_counted_up() -> None:
    api = EventsApi()
    recorder = ClaimEventRecorder(api)
    c = claim()
    for message in ("first", "second", "third"):
        assert await recorder.record(c, "Unschedulable", "Warning", message)
    assert list(api.events) == [_event_path(c)]
    event = api.events[_event_path(c)]
    assert (event["count"], event["message"]) == (3, "third")
    assert event["involvedObject"]["kind"] == "ResourceClaim"
    assert event["involvedObject"]["uid"] == "u1"
    assert api.calls == ["create", "patch", "patch"]


async def test_an_event_from_before_a_restart_is_continued() -> None:
    c = claim()
    api = EventsApi(existing={_event_path(c): 4})
    assert await ClaimEventRecorder(api).record(c, "Unschedulable", "Warning", "again")
    assert api.events[_event_path(c)]["count"] == 5
    assert api.calls == ["create", "get", "patch"]


async def test_an_expired_event_is_created_again() -> None:
    api = EventsApi()
    recorder = ClaimEventRecorder(api)
    c = claim()
    await recorder.record(c, "Unschedulable", "Warning", "one")
    api.events.clear()
    assert await recorder.record(c, "Unschedulable", "Warning", "two")
    assert api.events[_event_path(c)]["count"] == 1


async def test_writes_are_rate_limited() -> None:
    api = EventsApi()
    recorder = ClaimEventRecorder(api, rate=0.001, burst=2)
    results = [await recorder.record(claim(uid=f"u{i}"), "R", "Warning", "m") for i in range(4)]
    assert results == [True, True, False, False]


def test_event_names_are_stable_dns_subdomains() -> None:
    long = claim(name="a" * 199 + "-b" * 20)
    name = event_name(long)
    assert len(name) <= 253 and ".-" not in name and "-." not in name
    assert event_name(long) == name
    assert event_name(claim(uid="other")) != event_name(claim())


@pytest.mark.parametrize("shipped", deviceclasses.device_classes(), ids=lambda c: c.metadata.name)
def test_claims_of_our_shipped_device_classes_concern_our_driver(shipped: DeviceClass) -> None:
    """The shipped classes quote the driver name with single quotes, as the reference chart."""
    name = shipped.metadata.name
    assert concerns_driver(claim(class_name=name), {name: shipped})
    other = msgspec.structs.replace(
        shipped,
        spec=msgspec.convert(
            {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]},
            type(shipped.spec),
        ),
    )
    assert not concerns_driver(
        claim(class_name=shipped.metadata.name), {shipped.metadata.name: other}
    )


def deep_claim(name: str, uid: str, rv: str, depth: int = 4000) -> msgspec.Raw:
    """A claim whose opaque parameters nest ``depth`` levels (the API server stores it)."""
    parameters = '{"x":' * depth + "1" + "}" * depth
    return msgspec.Raw(
        b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"'
        + name.encode()
        + b'","namespace":"ns","uid":"'
        + uid.encode()
        + b'","resourceVersion":"'
        + rv.encode()
        + b'"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":'
        + b'"gpu.nvidia.com"}}],"config":[{"opaque":{"driver":"gpu.nvidia.com","parameters":'
        + parameters.encode()
        + b"}}]}}}"
    )


async def test_a_claim_nested_4000_deep_is_reported_and_the_watch_goes_on() -> None:
    api = ScriptedApi(
        listings=[Listing([deep_claim("deep", "ud", "5"), raw(claim("a", "ua", "6"))], "6")],
        watches=[
            [
                RawEvent("ADDED", deep_claim("deeper", "ue", "7")),
                RawEvent("ADDED", raw(claim("b", "ub", "8"))),
            ]
        ],
    )
    unreadable: list[tuple[str, str]] = []

    async def on_unreadable(readable: ResourceClaim, reason: str) -> None:
        unreadable.append((readable.metadata.name, reason))

    informer = Informer(api, "resourceclaims", "/x", ResourceClaim, on_unreadable=on_unreadable)
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.done.wait(), 5)
    task.cancel()
    assert set(informer.items) == {"ns/a", "ns/b"}  # the rest is read, the watch went on
    assert [name for name, _ in unreadable] == ["deep", "deeper"]
    assert "nested too deeply" in unreadable[0][1]
    assert api.watch_versions[-1] == "8"


def test_cap_depth_keeps_the_shallow_part_and_strings_intact() -> None:
    from services.core.kit.limits import cap_depth

    text = b'{"a":{"b":{"c":[1,{"d":"}]{["}]}},"s":"x\\"{"}'
    assert json.loads(cap_depth(text, 2)) == {"a": {"b": None}, "s": 'x"{'}
    assert json.loads(cap_depth(text, 10)) == json.loads(text)
    deep = b"[" * 5000 + b"]" * 5000
    assert cap_depth(deep, 3) == b"[[[null]]]"


def test_a_claim_reserved_for_256_long_named_pods_fits_the_stream_in_batches() -> None:
    """The API's limits at their worst (256 consumers, 253-character names, a
    63-character resource; 32 devices with long names): one event was 81 KB, over
    CLAIMS' message limit, and the bus refused it. Every batch fits, in order."""
    pods = [PodRef(resource="r" * 63, name=f"{i:03}" + "p" * 250, uid=str(uuid.uuid4()))
            for i in range(256)]  # fmt: skip
    cdi = ["k8s.gpu.nvidia.com/claim=" + "x" * 200]
    devices = [
        DeviceRef(request="r" * 63, pool="p" * 253, device="d" * 63, gpu_uuid="GPU-" + "0" * 36,
                  pci_bus_id="0000:00:00.0", cdi_device_ids=cdi)
        for _ in range(32)
    ]  # fmt: skip
    claim_ref = ClaimRef(uid=str(uuid.uuid4()), namespace="n" * 63, name="c" * 253)
    batches = consumer_batches(pods)
    assert [p for batch in batches for p in batch] == pods
    limit = retention.DEFAULTS[subjects.CLAIMS_STREAM].max_msg_size
    for batch in batches:
        event = ClaimEvent(event="reserved", claim=claim_ref, node="n" * 253, actor="allocator",
                           instance="i" * 253, seq=10**6, devices=devices, pods=batch,
                           traceparent="00-" + "0" * 32 + "-" + "0" * 16 + "-01")  # fmt: skip
        assert len(encode(event)) < limit * 0.75
    assert consumer_batches([]) == [[]]
