"""The ComputeDomain CRD (deploy/computedomains.yaml) on the real 1.35 API server.

Installed the way `gpudra up` installs it, then every rule is tried through the
API: defaults filled in, the immutable spec, enums, the minimum, required fields,
the status subresource (status written only there, its enums and the list-map
key on nodes) and the printer columns kubectl shows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.core.kube.client import ApiError, KubeApi, http_api
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.stack import COMPUTE_DOMAIN_CRD

pytestmark = [pytest.mark.e2e]
NS = "default"
PATH = f"/apis/resource.nvidia.com/v1beta1/namespaces/{NS}/computedomains"


@pytest.fixture
async def api(controlplane: ControlPlane) -> AsyncIterator[KubeApi]:
    install_crd(controlplane, COMPUTE_DOMAIN_CRD.read_text())
    client = await http_api(str(controlplane.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


def domain(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "t"}}}
    body.update(spec)
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


async def refused(call: Any, *fragments: str) -> str:
    with pytest.raises(ApiError) as info:
        await call
    assert info.value.status == 422, info.value
    for fragment in fragments:
        assert fragment in info.value.message, info.value.message
    return info.value.message


async def test_defaults_and_the_status_subresource(api: KubeApi) -> None:
    made = json.loads(
        await api.create(PATH, {**domain("cd-defaults"), "status": {"status": "Ready"}})
    )
    assert made["spec"]["channel"]["allocationMode"] == "Single"
    assert "status" not in made  # status is written only through /status
    made["status"] = {"status": "Ready", "nodes": [
        {"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "u.1", "index": 0}]}  # fmt: skip
    stored = json.loads(await api.replace(f"{PATH}/cd-defaults/status", made))
    assert stored["status"]["nodes"][0]["status"] == "NotReady"  # defaulted
    assert stored["status"]["status"] == "Ready"


async def test_num_nodes_is_optional_and_defaults_to_zero(api: KubeApi) -> None:
    """As the reference's CRD: ``numNodes`` optional, default 0, minimum 0."""
    body = domain("cd-no-count")
    del body["spec"]["numNodes"]
    made = json.loads(await api.create(PATH, body))
    assert made["spec"]["numNodes"] == 0
    zero = json.loads(await api.create(PATH, domain("cd-zero-count", numNodes=0)))
    assert zero["spec"]["numNodes"] == 0


async def test_the_spec_is_immutable(api: KubeApi) -> None:
    await api.create(PATH, domain("cd-immutable"))
    body = {"spec": {"numNodes": 3}}
    await refused(api.patch(f"{PATH}/cd-immutable", body), "A computeDomain.spec is immutable")
    same = json.loads(await api.patch(f"{PATH}/cd-immutable", {"metadata": {"labels": {"a": "b"}}}))
    assert same["metadata"]["labels"] == {"a": "b"}  # metadata stays writable


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ({"numNodes": -1}, ("spec.numNodes", "should be greater than or equal to 0")),
        ({"channel": {"resourceClaimTemplate": {"name": "t"}, "allocationMode": "Some"}},
         ("spec.channel.allocationMode", 'supported values: "All", "Single"')),
        ({"channel": {"allocationMode": "All"}},
         ("spec.channel.resourceClaimTemplate", "Required")),
        ({"channel": {"resourceClaimTemplate": {}}},
         ("spec.channel.resourceClaimTemplate.name", "Required")),
        ({"numNodes": "two"}, ("spec.numNodes", "integer")),
    ],
)  # fmt: skip
async def test_bad_specs_are_refused_by_field(
    api: KubeApi, spec: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    await refused(api.create(PATH, domain("cd-bad", **spec)), *fragments)


async def test_a_spec_without_channel_is_refused(api: KubeApi) -> None:
    body = domain("cd-nochannel")
    del body["spec"]["channel"]
    await refused(api.create(PATH, body), "spec.channel", "Required")


async def test_bad_statuses_are_refused(api: KubeApi) -> None:
    made = json.loads(await api.create(PATH, domain("cd-status")))
    node = {"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "u.1", "index": 0}
    path = f"{PATH}/cd-status/status"
    await refused(api.replace(path, {**made, "status": {"status": "Done"}}), "status.status")
    await refused(
        api.replace(path, {**made, "status": {"status": "Ready", "nodes": [node, node]}}),
        "status.nodes[1]",
        "Duplicate value",
    )
    partial = {"name": "n2", "ipAddress": "10.0.0.2"}
    await refused(
        api.replace(path, {**made, "status": {"status": "Ready", "nodes": [partial]}}),
        "status.nodes[0].cliqueID",
    )
    stored = json.loads(await api.replace(path, {**made, "status": {"nodes": [node]}}))
    assert stored["status"]["status"] == "NotReady"  # a missing status is defaulted, not Ready


async def test_kubectl_shows_the_printer_columns(api: KubeApi, controlplane: ControlPlane) -> None:
    await api.create(PATH, domain("cd-columns", numNodes=4))
    out = await asyncio.to_thread(
        controlplane.kubectl, "get", "computedomains", "cd-columns", "-n", NS, "-o", "wide"
    )
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "STATUS", "NUMNODES", "CHANNEL-TEMPLATE", "AGE"]
    assert row.split()[:3] == ["cd-columns", "4", "t"]  # STATUS blank until a status is written
