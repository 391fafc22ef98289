"""How many pending claims wait for their explanation (``gpudra_allocator_explanations_due``,
the chart's GpudraExplanationBacklogStuck): set when a check finds them, down by one per
explanation written, 0 once the check is through; a check that fails midway leaves the
rest counted, and they stay due for the next one."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest
from prometheus_client import REGISTRY

from services.allocator.watcher.kubeobjects import Pod
from services.allocator.watcher.watcher import ClaimWatcher, WatcherConfig
from services.core.kube.resource import DeviceClass, ResourceClaim


def device_class() -> DeviceClass:
    selector = {"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}
    return msgspec.convert(
        {"metadata": {"name": "gpu"}, "spec": {"selectors": [selector]}}, DeviceClass
    )


def pending_claim(name: str) -> ResourceClaim:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 1}}
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [request]}},
        },
        ResourceClaim,
    )


def waiting_pod(claim: str) -> Pod:
    return msgspec.convert(
        {
            "metadata": {"name": f"pod-{claim}", "namespace": "ns", "uid": f"pod-{claim}",
                         "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"resourceClaims": [{"name": claim, "resourceClaimName": claim}]},
        },
        Pod,
    )  # fmt: skip


def due() -> float | None:
    return REGISTRY.get_sample_value("gpudra_allocator_explanations_due")


def watcher_with(names: list[str]) -> ClaimWatcher:
    """A watcher whose caches hold ``names``' pending claims and their waiting pods."""
    watcher = ClaimWatcher(cast(Any, None), cast(Any, None), WatcherConfig(pending_threshold=60))
    watcher.claims.items = {f"ns/{n}": pending_claim(n) for n in names}
    watcher.pods.items = {f"ns/pod-{n}": waiting_pod(n) for n in names}
    watcher.classes.items = {"gpu": device_class()}
    for informer in (watcher.pods, watcher.classes, watcher.slices, watcher.nodes):
        informer.synced.set()
    return watcher


async def test_each_explanation_written_takes_one_off_what_is_due() -> None:
    watcher = watcher_with(["a", "b", "c"])
    seen: list[tuple[str, float | None]] = []

    async def explain(claim: ResourceClaim, waited: float, pod: Pod | None = None) -> None:
        seen.append((claim.metadata.name, due()))

    watcher.explain = explain  # type: ignore[method-assign]
    await watcher.check_pending()
    assert seen == [("a", 3), ("b", 2), ("c", 1)]
    assert due() == 0
    await watcher.check_pending()  # explained within the threshold: nothing due
    assert len(seen) == 3 and due() == 0


async def test_a_check_that_fails_midway_leaves_the_rest_due() -> None:
    watcher = watcher_with(["a", "b", "c"])
    written: list[str] = []

    async def explain(claim: ResourceClaim, waited: float, pod: Pod | None = None) -> None:
        if written:
            raise RuntimeError("the bus does not answer")
        written.append(claim.metadata.name)

    watcher.explain = explain  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await watcher.check_pending()
    assert due() == 2  # the one that failed and the one after it

    async def works(claim: ResourceClaim, waited: float, pod: Pod | None = None) -> None:
        written.append(claim.metadata.name)

    watcher.explain = works  # type: ignore[method-assign]
    await watcher.check_pending()
    # The one never tried was still due; the one that failed counts as explained (as before
    # this gauge), so it is tried again a threshold later.
    assert written == ["a", "c"] and due() == 0
