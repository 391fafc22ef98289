"""A pending claim like one explained before is told the same answer (pending.Reuse):
same namespace and spec, same devices, a "no node fits" at most ``ttl`` old. Anything
else runs the engine again: other devices (a slice, class, node or taint rule changed),
another namespace, an older answer, or an answer that fits. A Node rewritten by its
kubelet's status, what the allocator reads of it unchanged, is the same devices."""

from __future__ import annotations

from typing import Any, cast

import msgspec
from prometheus_client import REGISTRY

from services.allocator.watcher.kubeobjects import NodeObject
from services.allocator.watcher.pending import Reuse
from services.allocator.watcher.watcher import ClaimWatcher, WatcherConfig
from services.core.kube.resource import DeviceClass, ResourceClaim, ResourceSlice

DRIVER = "gpu.nvidia.com"


def device_class() -> DeviceClass:
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    return msgspec.convert(
        {"metadata": {"name": "gpu"}, "spec": {"selectors": [selector]}}, DeviceClass
    )


def slice_(devices: int) -> ResourceSlice:
    return msgspec.convert(
        {
            "metadata": {"name": "n1-slice"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
            },
        },
        ResourceSlice,
    )


def claim(name: str, count: int = 3, namespace: str = "ns") -> ResourceClaim:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [request]}},
        },
        ResourceClaim,
    )


def reused() -> float:
    return REGISTRY.get_sample_value("gpudra_allocator_explanations_reused_total") or 0.0


class Counting:
    """The watcher's cluster allocator, its engine runs counted."""

    def __init__(self, watcher: ClaimWatcher) -> None:
        self.runs = 0
        inner = watcher.cluster.explain

        def explain(c: ResourceClaim) -> Any:
            self.runs += 1
            return inner(c)

        watcher.cluster.explain = explain  # type: ignore[method-assign,assignment]


def watcher(devices: int = 1) -> tuple[ClaimWatcher, Counting]:
    w = ClaimWatcher(cast(Any, None), cast(Any, None), WatcherConfig(pending_threshold=60))
    w.classes.items = {"gpu": device_class()}
    w.slices.items = {"n1-slice": slice_(devices)}
    w.nodes.items = {"n1": msgspec.convert({"metadata": {"name": "n1"}}, NodeObject)}
    return w, Counting(w)


async def test_a_claim_like_one_that_fit_nowhere_is_told_the_same_without_the_engine() -> None:
    w, engine = watcher()
    before = reused()
    first = await w._outcome(claim("a"))
    second = await w._outcome(claim("b"))
    assert first.status == "unschedulable" and second is first
    assert engine.runs == 1 and reused() == before + 1


async def test_changed_devices_another_namespace_or_an_old_answer_run_the_engine() -> None:
    w, engine = watcher()
    await w._outcome(claim("a"))
    w.slices.version += 1  # a slice changed
    await w._outcome(claim("b"))
    await w._outcome(claim("c", namespace="other"))
    assert engine.runs == 3
    w.reuse = Reuse(ttl=0.0)
    await w._outcome(claim("d"))
    await w._outcome(claim("e"))
    assert engine.runs == 5


async def test_a_claim_that_fits_is_never_reused_for_the_next() -> None:
    w, engine = watcher(devices=4)
    first = await w._outcome(claim("a", count=1))
    await w._outcome(claim("b", count=1))
    assert first.status == "allocated" and engine.runs == 2


def node(rv: str, labels: dict[str, str] | None = None, declared: list[str] | None = None) -> Any:
    body: dict[str, Any] = {"metadata": {"name": "n1", "resourceVersion": rv, "labels": labels}}
    if declared is not None:
        body["status"] = {"declaredFeatures": declared}
    return msgspec.convert(body, NodeObject)


async def test_a_node_status_heartbeat_keeps_the_answer_a_label_does_not() -> None:
    w, engine = watcher()
    on_change = w.nodes.on_change
    assert on_change is not None
    await w._outcome(claim("a"))
    await on_change(node("1", {"zone": "a"}), node("2", {"zone": "a"}))  # status only
    await w._outcome(claim("b"))
    assert engine.runs == 1
    await on_change(node("2", {"zone": "a"}), node("3", {"zone": "b"}))
    await w._outcome(claim("c"))
    await on_change(
        node("3", {"zone": "b"}), node("4", {"zone": "b"}, ["DRAOptionalNodeOperations"])
    )
    await w._outcome(claim("d"))
    await on_change(None, node("5"))  # a node joins
    await w._outcome(claim("e"))
    assert engine.runs == 4
