"""resource.k8s.io version discovery and the conversion at the edge (v1 <-> v1beta2/v1beta1)."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import pytest

from services.core.kube import resourceapi
from services.core.kube.client import ApiError, Body, Listing, RawEvent
from services.core.kube.resource import ResourceClaim, ResourceSlice

SLICE_V1: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "n1-gpu.nvidia.com-0"},
    "spec": {
        "driver": "gpu.nvidia.com",
        "nodeName": "n1",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {"type": {"string": "gpu"}},
                "capacity": {"memory": {"value": "80Gi"}},
                "allowMultipleAllocations": True,
            }
        ],
    },
}
SLICE_V1BETA1 = {
    **SLICE_V1,
    "apiVersion": "resource.k8s.io/v1beta1",
    "spec": {
        **SLICE_V1["spec"],
        "devices": [
            {
                "name": "gpu-0",
                "basic": {
                    "attributes": {"type": {"string": "gpu"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                    "allowMultipleAllocations": True,
                },
            }
        ],
    },
}
CLAIM_V1: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                                            "capacity": {"requests": {"memory": "20Gi"}}}},
                {"name": "either", "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com"}]},
            ]
        }
    },
}  # fmt: skip
CLAIM_V1BETA1 = {
    **CLAIM_V1,
    "apiVersion": "resource.k8s.io/v1beta1",
    "spec": {
        "devices": {
            "requests": [
                {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2,
                 "capacity": {"requests": {"memory": "20Gi"}}},
                {"name": "either", "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com"}]},
            ]
        }
    },
}  # fmt: skip


def up(obj: dict[str, Any], resource: str) -> dict[str, Any]:
    return resourceapi.convert(copy.deepcopy(obj), resource, "v1beta1", to_v1=True)


@pytest.mark.parametrize(
    ("resource", "v1", "old"),
    [("resourceslices", SLICE_V1, SLICE_V1BETA1), ("resourceclaims", CLAIM_V1, CLAIM_V1BETA1)],
)
def test_v1beta1_round_trips(resource: str, v1: dict[str, Any], old: dict[str, Any]) -> None:
    down = resourceapi.convert(copy.deepcopy(v1), resource, "v1beta1", to_v1=False)
    assert down == old
    assert resourceapi.convert(copy.deepcopy(old), resource, "v1beta1", to_v1=True) == v1


def test_a_template_converts_its_claim_spec() -> None:
    template = {"apiVersion": "resource.k8s.io/v1beta1", "spec": {"spec": CLAIM_V1BETA1["spec"]}}
    got = resourceapi.convert(
        copy.deepcopy(template), "resourceclaimtemplates", "v1beta1", to_v1=True
    )
    assert got["spec"]["spec"] == CLAIM_V1["spec"]


def test_v1beta2_is_v1_under_another_name() -> None:
    got = resourceapi.convert(copy.deepcopy(SLICE_V1), "resourceslices", "v1beta2", to_v1=False)
    assert got == {**SLICE_V1, "apiVersion": "resource.k8s.io/v1beta2"}


class FakeApi:
    """Records the paths it is asked for; serves one slice in ``version``."""

    def __init__(self, versions: list[str], version: str = "v1") -> None:
        self.versions = versions
        self.version = version
        self.paths: list[str] = []
        self.bodies: list[Body] = []

    def _slice(self) -> bytes:
        obj = SLICE_V1BETA1 if self.version == "v1beta1" else SLICE_V1
        return json.dumps({**obj, "apiVersion": f"resource.k8s.io/{self.version}"}).encode()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        self.paths.append(path)
        if path == "/apis/resource.k8s.io":
            return json.dumps({"versions": [{"version": v} for v in self.versions]}).encode()
        return self._slice()

    async def list(self, path: str, params: Mapping[str, str]) -> Listing:
        self.paths.append(path)
        return Listing([msgspec.Raw(self._slice())], "7")

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[RawEvent]:
        self.paths.append(path)
        yield RawEvent("ADDED", msgspec.Raw(self._slice()))

    async def create(self, path: str, body: Body) -> bytes:
        self.paths.append(path)
        self.bodies.append(body)
        return self._slice()

    replace = patch = create

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        self.paths.append(path)
        return b'{"kind": "Status", "status": "Success"}'

    async def close(self) -> None:
        return None


@pytest.mark.parametrize(
    ("served", "chosen"),
    [(["v1", "v1beta2", "v1beta1"], "v1"), (["v1beta2", "v1beta1"], "v1beta2"),
     (["v1beta1"], "v1beta1")],
)  # fmt: skip
async def test_the_newest_served_version_is_spoken(served: list[str], chosen: str) -> None:
    fake = FakeApi(served, chosen)
    api = resourceapi.versioned(fake)
    path = "/apis/resource.k8s.io/v1/resourceslices"
    got = msgspec.json.decode(await api.get(f"{path}/x"), type=ResourceSlice)
    listing = await api.list(path, {})
    events = [e async for e in api.watch(path, {}, "1")]
    await api.create(path, msgspec.to_builtins(got))
    await api.get("/api/v1/nodes/n1")  # outside the group: untouched
    assert fake.paths == [
        "/apis/resource.k8s.io",  # asked once, on first use
        f"/apis/resource.k8s.io/{chosen}/resourceslices/x",
        f"/apis/resource.k8s.io/{chosen}/resourceslices",
        f"/apis/resource.k8s.io/{chosen}/resourceslices",
        f"/apis/resource.k8s.io/{chosen}/resourceslices",
        "/api/v1/nodes/n1",
    ]
    for body in [listing.items[0], events[0].object]:
        assert msgspec.json.decode(body, type=ResourceSlice) == got
    assert got.spec.devices and got.spec.devices[0].allow_multiple_allocations is True
    sent = msgspec.json.decode(msgspec.json.encode(fake.bodies[0]))  # as the wire has it
    assert (
        sent["spec"]["devices"][0]
        == (SLICE_V1BETA1 if chosen == "v1beta1" else SLICE_V1)["spec"]["devices"][0]
    )


async def test_a_server_without_a_version_we_speak_is_a_clear_error() -> None:
    api = resourceapi.versioned(FakeApi(["v1alpha3"]))
    with pytest.raises(ApiError, match=r"serves resource.k8s.io \['v1alpha3'\]; gpudra speaks"):
        await api.get("/apis/resource.k8s.io/v1/resourceclaims")


def test_claims_decode_into_the_one_model() -> None:
    claim = resourceapi.convert(
        copy.deepcopy(CLAIM_V1BETA1), "resourceclaims", "v1beta1", to_v1=True
    )
    decoded = msgspec.convert(claim, type=ResourceClaim)
    assert decoded.spec.devices and decoded.spec.devices.requests
    assert decoded.spec.devices.requests[0].exactly is not None
