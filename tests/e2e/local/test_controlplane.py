"""Smoke test of the e2e control plane: real scheduler allocation from a
ResourceSlice, and the kubelet's DRA manager (kubelet-dra) refusing to prepare
a claim whose driver has not registered a plugin on the node."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.local.cluster import (
    CDI_DEVICES_ANNOTATION,
    RESOURCES_PREPARED_CONDITION,
    ControlPlane,
)
from services.local.component import wait_until

pytestmark = pytest.mark.e2e

DRIVER = "gpu.nvidia.com"
NODE = "e2e-node-1"


def _objects(suffix: str, namespace: str) -> list[dict[str, Any]]:
    selector = (
        f'device.driver == "{DRIVER}" && '
        f'device.attributes["{DRIVER}"].type == "gpu" && '
        # Guarded: other tests' devices in the shared cluster lack the attribute, and an
        # unguarded lookup is a CEL runtime error that aborts the allocation.
        f'"smokeTest" in device.attributes["{DRIVER}"] && '
        f'device.attributes["{DRIVER}"].smokeTest == "{suffix}"'
    )
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"smoke-{suffix}"},
            "spec": {"selectors": [{"cel": {"expression": selector}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"smoke-{suffix}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {
                    "name": f"{NODE}-smoke-{suffix}",
                    "generation": 1,
                    "resourceSliceCount": 1,
                },
                "devices": [
                    {
                        "name": "gpu-0",
                        "attributes": {
                            "type": {"string": "gpu"},
                            "smokeTest": {"string": suffix},
                        },
                    }
                ],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": f"smoke-{suffix}"}}]
                }
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "workload", "namespace": namespace},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [
                    {
                        "name": "ctr",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "terminationGracePeriodSeconds": 5,
            },
        },
    ]


def test_scheduler_allocates_and_kubelet_dra_reports_missing_driver(
    controlplane: ControlPlane, tmp_path: Path
) -> None:
    cp = controlplane
    suffix = secrets.token_hex(4)
    ns = f"smoke-{suffix}"
    cp.kubectl("create", "namespace", ns)
    objects = _objects(suffix, ns)
    try:
        cp.apply(objects)

        # kube-scheduler (DynamicResources plugin) allocates the claim from the
        # slice, reserves it for the pod and binds the pod to the slice's node.
        def allocated() -> dict[str, Any] | None:
            claim = cp.get("resourceclaim", "gpu", ns)
            if claim and claim.get("status", {}).get("allocation"):
                return dict(claim)
            return None

        claim = wait_until(allocated, 60, "claim allocation")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 1
        assert results[0]["device"] == "gpu-0"
        assert results[0]["driver"] == DRIVER
        assert results[0]["pool"] == f"{NODE}-smoke-{suffix}"
        assert results[0]["request"] == "gpu"

        pod = wait_until(
            lambda: (p := cp.get("pod", "workload", ns)) and p["spec"].get("nodeName") and p,
            60,
            "pod binding",
        )
        assert pod["spec"]["nodeName"] == NODE
        claim = cp.get("resourceclaim", "gpu", ns)
        assert [r["name"] for r in claim["status"].get("reservedFor", [])] == ["workload"]

        # The kubelet's DRA manager for the node: it watches plugins_registry,
        # wipes the node's ResourceSlices at start-up, and cannot prepare the
        # claim because no gpu.nvidia.com plugin registered.
        root = tmp_path / "kubelet"
        kubelet = cp.start_kubelet_dra(NODE, root)
        assert kubelet.plugins_registry.is_dir()

        wait_until(
            lambda: cp.get("resourceslice", f"smoke-{suffix}") is None,
            60,
            "the kubelet's start-up wipe of the node's ResourceSlices",
        )

        not_registered = f"DRA driver {DRIVER} is not registered"

        def prepare_failed_event() -> dict[str, Any] | None:
            events = cp.kubectl_json(
                "get", "events", "-n", ns,
                "--field-selector",
                "involvedObject.kind=Pod,involvedObject.name=workload,"
                "reason=FailedPrepareDynamicResources",
            )  # fmt: skip
            for event in events["items"]:
                if not_registered in event.get("message", ""):
                    return dict(event)
            return None

        event = wait_until(prepare_failed_event, 60, "FailedPrepareDynamicResources event")
        assert event["type"] == "Warning"
        assert event["source"]["component"] == "kubelet"
        assert event["source"]["host"] == NODE

        pod = cp.get("pod", "workload", ns)
        conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
        prepared = conditions[RESOURCES_PREPARED_CONDITION]
        assert prepared["status"] == "False"
        assert not_registered in prepared["message"]
        assert pod["status"].get("phase") != "Running"
        assert CDI_DEVICES_ANNOTATION not in pod["metadata"].get("annotations", {})

        # Deletion: kubelet-dra unprepares (nothing was prepared) and removes
        # the pod; the resourceclaim controller drops the reservation.
        cp.kubectl("delete", "pod", "workload", "-n", ns, "--wait=false")
        wait_until(lambda: cp.get("pod", "workload", ns) is None, 60, "pod removal")
        wait_until(
            lambda: not cp.get("resourceclaim", "gpu", ns)["status"].get("reservedFor"),
            60,
            "claim reservation removal",
        )
        assert kubelet.running(), kubelet.log_tail()
        cp.stop_kubelet_dra(kubelet)
    finally:
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for obj in objects[:2]:
            cp.kubectl(
                "delete", obj["kind"].lower(), obj["metadata"]["name"],
                "--ignore-not-found", "--wait=false", check=False,
            )  # fmt: skip


def test_reference_allocator_cli(controlplane_binary: Path, tmp_path: Path) -> None:
    """The reference allocator answers offline, from files."""
    suffix = "offline"
    objects = _objects(suffix, "default")[:3]
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    link = controlplane_binary.parent / "reference-allocator"
    out = subprocess.run(
        [str(link), "-f", str(path), "-o", "json"], capture_output=True, text=True, check=True
    )
    claims = json.loads(out.stdout)["claims"]
    assert len(claims) == 1
    assert claims[0]["status"] == "allocated", claims[0]
    assert claims[0]["node"] == NODE
    assert claims[0]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
