"""DRAListTypeAttributes against the real kube-apiserver and allocator of Kubernetes 1.37.

With its own gate off (1.37's default) kube-apiserver drops ``ints`` on create and then
refuses the slice, the attribute left without a value; the publisher's reconciler then
writes the int, once, and a restart writes nothing. With the gate on the server stores
the list as rendered (a restart writes nothing), and a slice with a list attribute holds
at most 64 devices (ResourceSliceMaxDevicesWithAdvancedFeatures), as the renderer cuts it.

What users' selectors see (the upstream allocator, ``reference-allocator``, on what
``gpudra slices`` prints): ``numaNode == 0`` no longer matches the list, ``includes()``
matches both forms, and only with Kubernetes' gate on (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.core.kube.client import ApiError, http_api
from services.core.kube.resource import ResourceSlice
from services.core.model import featuregates
from services.local.cluster import ControlPlane
from services.offline import slicecheck
from services.offline.slices import fleet_inventory
from services.publisher.droppedfields import LIST_ATTRIBUTES, refuses_lists
from services.publisher.kubeapi import KubeSliceApi
from services.publisher.reconcile import Reconciler
from services.publisher.render import RenderOptions, build_slices, render_contents
from tests.helpers.inventories import h100, node

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

NODE = "lists-node"
NUMA = "resource.kubernetes.io/numaNode"
REPO = Path(__file__).resolve().parents[3]
ON = RenderOptions(featuregates.parse("PassthroughSupport=true,DRAListTypeAttributes=true"), 37)


@pytest.fixture(scope="module", params=[False, True], ids=["server-gate-off", "server-gate-on"])
def apiserver(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[ControlPlane]:
    gates = {"DRAListTypeAttributes": True} if request.param else {}
    with ControlPlane(controlplane_binary, nodes=[NODE], feature_gates=gates) as cp:
        cp.lists = request.param  # type: ignore[attr-defined]
        yield cp


def _forms(slices: list[ResourceSlice]) -> set[str]:
    return {
        "ints" if d.attributes[NUMA].is_list else "int"
        for s in slices
        for d in s.spec.devices or []
        if d.attributes and NUMA in d.attributes
    }


async def test_the_publisher_writes_what_the_server_can_store_and_never_rewrites_it(
    apiserver: ControlPlane,
) -> None:
    lists = apiserver.lists  # type: ignore[attr-defined]
    api = KubeSliceApi(await http_api(str(apiserver.kubeconfig)))
    try:
        assert await api.server_minor() == 37
        contents = render_contents(fleet_inventory("dgx-a100", NODE), ON)
        (sent,) = build_slices(NODE, contents, generation=0)
        if not lists:  # the server's own words, which refuses_lists reads
            with pytest.raises(ApiError) as refused:
                await api.create(sent)
            assert refused.value.status == 422
            assert f"spec.devices[0].attributes[{NUMA}]" in refused.value.message
            assert refuses_lists(sent, refused.value)
        reconciler = Reconciler(api)
        first = await reconciler.sync(NODE, contents)
        assert first.created == 1
        stored = (await api.list_slices(NODE)).items
        assert _forms(stored) == ({"ints"} if lists else {"int"})
        assert reconciler.dropped == (set() if lists else {LIST_ATTRIBUTES})
        assert not slicecheck.check_pool(stored, kube_minor=37)
        for again in (Reconciler(api), reconciler):
            again.forget(NODE)
            assert (await again.sync(NODE, contents)).writes == 0
        reconciler.retry_list_attributes()  # what a full resync does
        reconciler.forget(NODE)
        assert (await reconciler.sync(NODE, contents)).writes == 0
        assert (await Reconciler(api).sync(NODE, None)).deleted == 1
    finally:
        await api.close()


async def test_a_slice_with_a_list_attribute_holds_64_devices(apiserver: ControlPlane) -> None:
    if not apiserver.lists:  # type: ignore[attr-defined]
        pytest.skip("the server stores no lists")
    api = KubeSliceApi(await http_api(str(apiserver.kubeconfig)))
    try:
        many = node(NODE, [h100(i, mig_capable=False, mig_profiles=[]) for i in range(130)])
        lists = RenderOptions(featuregates.parse("DRAListTypeAttributes=true"), 37)
        contents = render_contents(many, lists)
        assert [len(c.devices or []) for c in contents] == [64, 64, 2]
        assert (await Reconciler(api).sync(NODE, contents)).created == 3
        assert _forms((await api.list_slices(NODE)).items) == {"ints"}
        assert (await Reconciler(api).sync(NODE, None)).deleted == 3
        first, second = contents[0].devices or [], contents[1].devices or []
        (too_big,) = build_slices(NODE, [type(contents[0])(devices=[*first, second[0]])])
        with pytest.raises(ApiError, match="must have at most 64 items"):
            await api.create(too_big)
        assert slicecheck.check_slice(too_big, kube_minor=37)
    finally:
        await api.close()


def _allocate(binary: Path, tmp: Path, expression: str, slices: str, gates: str) -> str:
    """``expression``: a CEL selector, or ``matchAttribute:N`` (N GPUs of one NUMA node)."""
    if expression.startswith("matchAttribute:"):
        count = int(expression.partition(":")[2])
        devices: dict[str, Any] = {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                     "count": count}}],
            "constraints": [{"matchAttribute": NUMA}],
        }  # fmt: skip
    else:
        devices = {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": expression}}],
        }}]}  # fmt: skip
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": devices},
    }
    (tmp / "claim.yaml").write_text(yaml.safe_dump(claim))
    args = [str(binary), "reference-allocator", "-f", str(REPO / "deploy/deviceclasses.yaml"),
            "-f", slices, "-f", str(tmp / "claim.yaml"), "-o", "json"]  # fmt: skip
    if gates:
        args += ["--feature-gates", gates]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode:
        return "refused: " + proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    [claim_out] = out["claims"]
    return f"{claim_out['status']}: {claim_out['error'] or ''}"


@pytest.mark.parametrize("listed", [False, True], ids=["int", "list"])
def test_what_selectors_on_numa_node_match_upstream(
    controlplane_binary: Path, tmp_path: Path, listed: bool
) -> None:
    """The reference's behaviour, which gpudra's slices have too."""
    from services.cli import main

    gates = "DRAListTypeAttributes=true" if listed else ""
    slices = tmp_path / "slices.yaml"
    argv = ["slices", "--fleet", "dgx-h100", "--node", "n1", "-o", "json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, *(["--feature-gates", gates] if gates else [])]) == 0
    items = json.loads(out.getvalue())["items"]
    assert {json.dumps(d["attributes"][NUMA]) for s in items for d in s["spec"]["devices"]} == (
        {'{"ints": [0]}', '{"ints": [1]}'} if listed else {'{"int": 0}', '{"int": 1}'}
    )
    slices.write_text(yaml.safe_dump_all(items))
    equal = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    includes = 'device.attributes["resource.kubernetes.io"].numaNode.includes(1)'
    element = '1 in device.attributes["resource.kubernetes.io"].numaNode'
    k8s_on = "DRAListTypeAttributes=true"
    outcome = {
        (e, g): _allocate(controlplane_binary, tmp_path, e, str(slices), g)
        for e in (equal, includes, element, "matchAttribute:4", "matchAttribute:5")
        for g in ("", k8s_on)
    }
    # Four GPUs share a NUMA node on a dgx-h100, five do not, in either form.
    assert outcome[("matchAttribute:4", k8s_on)].startswith("allocated")
    assert outcome[("matchAttribute:5", k8s_on)].startswith("unschedulable")
    if listed:
        assert "exactly one value must be specified" in outcome[(equal, "")]  # slice refused
        assert "unschedulable" in outcome[(equal, k8s_on)]  # a list is never == an int
        assert "allocated" in outcome[(includes, k8s_on)]
        assert outcome[(element, k8s_on)].startswith("allocated")
    else:
        assert "no such overload" in outcome[(element, k8s_on)]
        assert "allocated" in outcome[(equal, "")] and "allocated" in outcome[(equal, k8s_on)]
        assert "undeclared reference to 'includes'" in outcome[(includes, "")]
        assert "allocated" in outcome[(includes, k8s_on)]
