"""The claim the scheduler would make for a pod's extended resources (to explain it)."""

from __future__ import annotations

from typing import Any

import msgspec

from services.allocator.watcher.extended import extended_claim
from services.allocator.watcher.pending import PodClock, waiting_extended
from services.core.kube.pods import Pod
from services.core.kube.resource import to_builtins
from services.core.model import deviceclasses

CLASSES = {c.metadata.name: c for c in deviceclasses.device_classes()}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
        **status: Any) -> Pod:  # fmt: skip
    raw = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                     "creationTimestamp": "2020-01-01T00:00:00Z"},
        "spec": {"containers": containers, "initContainers": init or []},
        "status": status,
    }  # fmt: skip
    return msgspec.convert(raw, type=Pod)


def wants(name: str, **requests: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests}}


def test_requests_are_named_and_counted_as_the_scheduler_does() -> None:
    claim = extended_claim(
        pod(
            [wants("a", **{"cpu": "1", "nvidia.com/gpu": "2"}), wants("b", **{"nvidia.com/gpu": 1})]
        ),
        CLASSES,
    )
    assert claim is not None
    assert claim.metadata.name == "p-extended-resources" and claim.metadata.uid == "u-1"
    assert claim.spec.devices is not None
    requests = to_builtins(claim.spec.devices)["requests"]
    assert requests == [
        {"name": "container-0-request-1", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                      "allocationMode": "ExactCount", "count": 2}},
        {"name": "container-1-request-0", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                      "allocationMode": "ExactCount", "count": 1}},
    ]  # fmt: skip


def test_init_containers_reuse_what_runs_before_and_classes_by_name() -> None:
    init = [wants("setup", **{"nvidia.com/gpu": 3}),
            {**wants("side", **{"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}),
             "restartPolicy": "Always"}]  # fmt: skip
    claim = extended_claim(pod([wants("main", **{"nvidia.com/gpu": 2})], init), CLASSES)
    assert claim is not None and claim.spec.devices is not None
    counts = {r.name: r.exactly.count for r in claim.spec.devices.requests or [] if r.exactly}
    # setup runs first, alone: all 3; the sidecar and main each their own.
    assert counts == {
        "container-0-request-0": 3,
        "container-1-request-0": 1,
        "container-2-request-0": 2,
    }


def test_no_claim_for_other_resources_or_zero() -> None:
    assert extended_claim(pod([wants("a", cpu="2", **{"example.com/fpga": 1})]), CLASSES) is None
    assert extended_claim(pod([wants("a", **{"nvidia.com/gpu": 0})]), CLASSES) is None


def test_only_unscheduled_pods_without_the_schedulers_claim_wait() -> None:
    clock = PodClock()
    waiting = pod([wants("a", **{"nvidia.com/gpu": 9})])
    made = pod([wants("a", **{"nvidia.com/gpu": 9})], extendedResourceClaimStatus={
        "resourceClaimName": "p-extended-resources-x", "requestMappings": []})  # fmt: skip
    found = waiting_extended([waiting, made], CLASSES, clock, threshold=1.0, now=2e9)
    assert [w.pod for w in found] == [waiting]
