"""Feature gates reach the API server and the scheduler: with
DRAPartitionableDevices on, shared counters survive admission and the
scheduler's allocator enforces them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.local.cluster import ControlPlane
from services.local.component import wait_until

pytestmark = pytest.mark.e2e

DRIVER = "gpu.nvidia.com"
NODE = "gates-node"


def _slice(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    pool = {"name": NODE, "generation": 0, "resourceSliceCount": 2}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, **spec},
    }


def _claim_and_pod(name: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig"}}]}
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "ctr",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "mig"}]},
                    }
                ],
            },
        },
    ]


def test_partitionable_devices_gate(controlplane_binary: Path, tmp_path: Path) -> None:
    gates = {"DRAPartitionableDevices": True}
    with ControlPlane(
        controlplane_binary, workdir=tmp_path / "cp", nodes=[NODE], feature_gates=gates
    ) as cp:
        counters = {"memory-slice-0": {"value": "1"}, "memory-slice-1": {"value": "1"}}

        def consumes(*slices: int) -> list[dict[str, Any]]:
            wanted = {f"memory-slice-{i}": {"value": "1"} for i in slices}
            return [{"counterSet": "gpu-0-counters", "counters": wanted}]

        cp.apply(
            [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": "mig"},
                    "spec": {
                        "selectors": [
                            {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                            {"cel": {"expression": f'device.attributes["{DRIVER}"].type == "mig"'}},
                        ]
                    },
                },
                _slice(
                    "gates-counters",
                    {"sharedCounters": [{"name": "gpu-0-counters", "counters": counters}]},
                ),
                _slice(
                    "gates-devices",
                    {
                        "devices": [
                            {
                                "name": "mig-a",
                                "attributes": {"type": {"string": "mig"}},
                                "consumesCounters": consumes(0),
                            },
                            {
                                "name": "mig-ab",
                                "attributes": {"type": {"string": "mig"}},
                                "consumesCounters": consumes(0, 1),
                            },
                        ]
                    },
                ),
            ]
        )
        stored = cp.get("resourceslice", "gates-counters")
        assert stored["spec"]["sharedCounters"][0]["name"] == "gpu-0-counters"

        cp.apply(_claim_and_pod("first"))
        first = wait_until(
            lambda: (
                (c := cp.get("resourceclaim", "first", "default"))
                and c.get("status", {}).get("allocation")
                and c
            ),
            60,
            "allocation of the first claim",
        )
        device = first["status"]["allocation"]["devices"]["results"][0]["device"]
        assert device in ("mig-a", "mig-ab")

        # Both devices draw on memory-slice-0: the second claim cannot be
        # allocated while the first holds its device.
        cp.apply(_claim_and_pod("second"))

        def unschedulable() -> bool:
            pod = cp.get("pod", "second", "default")
            conditions = pod.get("status", {}).get("conditions", [])
            return any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in conditions
            )

        wait_until(unschedulable, 60, "the second pod to be unschedulable")
        claim = cp.get("resourceclaim", "second", "default")
        assert not claim.get("status", {}).get("allocation")
