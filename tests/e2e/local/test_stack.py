"""The whole gpudra stack against real Kubernetes: every example, then the hard cases.

One stack for the module (services.local.stack): embedded NATS, etcd +
kube-apiserver + kube-scheduler + kube-controller-manager, and two simulated
nodes, ``gpu-node-h100`` (dgx-h100) and ``gpu-node-a100`` (dgx-a100, static
MIG), each with gpudra discovery, preparer, kubeletplugin and the kubelet's
own DRA manager (kubelet-dra), plus the publisher and the allocator's claim
watcher. The path under test: our slices -> kube-scheduler -> our watcher ->
kubelet-dra -> our socket -> preparer -> CDI ids on the pod.

The tests run in file order and share the stack: first every example of
examples/ (applied once, checked one by one, then deleted: nothing may be left
on the nodes), then a shared claim's lifecycle, a preparer killed in the middle
of a prepare, and a kubelet restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.model.schemas import ClaimEvent, PluginPresence, decode
from services.local import demo, demoexamples, demoview
from services.local.stack import Stack, complete_pool
from services.local.stackprocs import StackError
from services.preparer import checkpoint, checkpointfile, faults
from services.preparer.devices.simulated import STATE_FILE, SimHost
from tests.helpers.bus import connect
from tests.helpers.cdi import inject
from tests.helpers.preparer import validate_cdi_file
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

H100 = "gpu-node-h100"
A100 = "gpu-node-a100"
DRIVER = "gpu.nvidia.com"
CDI_KIND = "k8s.gpu.nvidia.com/claim"
#: Every example of the two GPU demo nodes. Those with a ComputeDomain need two GB200
#: nodes and IMEX daemons: tests/e2e/local/test_stack_up.py runs them through `gpudra up`,
#: tests/e2e/domains/test_computedomain_two_nodes.py checks that path in depth.
EXAMPLE_FILES = sorted(e.name for e in demoexamples.gpu_only(demoexamples.load_examples()))
#: Devices per node when nothing is prepared (gpudra slices --fleet ... with the demo gates):
#: the A100s' static MIG devices and, as the reference publishes them, each MIG-mode GPU's
#: VFIO twin (4 GPUs: 24 + 4).
FULL_POOLS = {H100: 16, A100: 28}
IMAGE = "registry.k8s.io/pause:3.10"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    s = Stack(binary=controlplane_binary, pending_threshold=1.0, prepare_timeout=6.0)
    with started_stack(request, s):
        yield s


# ---- looking at the cluster and the nodes -------------------------------------


def get(stack: Stack, path: str) -> Any:
    return stack.api_get(path)


def pod_of(stack: Stack, namespace: str, name: str) -> Any:
    return get(stack, f"/api/v1/namespaces/{namespace}/pods/{name}")


def claim_of(stack: Stack, namespace: str, name: str) -> Any:
    return get(stack, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")


def claims_by_pod_name(stack: Stack, pod: Any) -> dict[str, Any]:
    """The pod's claims by their name in ``spec.resourceClaims``."""
    generated = {
        s["name"]: s.get("resourceClaimName")
        for s in pod.get("status", {}).get("resourceClaimStatuses") or []
    }
    out = {}
    for ref in pod["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        assert name, f"claim {ref['name']} of pod {pod['metadata']['name']} has no ResourceClaim"
        out[ref["name"]] = claim_of(stack, pod["metadata"]["namespace"], name)
    extended = (pod.get("status", {}).get("extendedResourceClaimStatus") or {}).get(
        "resourceClaimName"
    )
    if extended:  # the scheduler's claim for nvidia.com/gpu limits (DRAExtendedResource)
        out[demoview.EXTENDED_REF] = claim_of(stack, pod["metadata"]["namespace"], extended)
    return out


def results(claim: Any) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list(allocation.get("devices", {}).get("results") or [])


def expected_cdi_ids(stack: Stack, pod: Any) -> dict[str, list[str]]:
    """What each container must get: the CDI id of every device allocated for the
    requests it names (all of the claim's devices when it names none)."""
    claims = claims_by_pod_name(stack, pod)
    expected: dict[str, list[str]] = {}
    for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        ids = []
        for use in container.get("resources", {}).get("claims") or []:
            claim = claims[use["name"]]
            uid = claim["metadata"]["uid"]
            for r in results(claim):
                if use.get("request") in (None, "", r["request"].split("/")[0]):
                    ids.append(f"{CDI_KIND}={uid}-{r['device']}")
        mappings = (pod["status"].get("extendedResourceClaimStatus") or {}).get("requestMappings")
        for mapping in mappings or []:
            if mapping["containerName"] == container["name"]:
                claim = claims[demoview.EXTENDED_REF]
                uid = claim["metadata"]["uid"]
                ids += [
                    f"{CDI_KIND}={uid}-{r['device']}"
                    for r in results(claim)
                    if r["request"] == mapping["requestName"]
                ]
        expected[container["name"]] = sorted(ids)
    return expected


def recorded_cdi_ids(pod: Any) -> dict[str, list[str]]:
    text = (pod["metadata"].get("annotations") or {}).get(demoview.CDI_DEVICES_ANNOTATION)
    return {k: sorted(v) for k, v in json.loads(text).items()} if text else {}


def running(stack: Stack, namespace: str, name: str) -> Any:
    pod = pod_of(stack, namespace, name)
    if pod and pod["status"].get("phase") == "Running" and recorded_cdi_ids(pod):
        return pod
    return None


def wait_running(stack: Stack, namespace: str, *names: str, timeout: float = 60) -> list[Any]:
    return [
        stack.wait_for(
            functools.partial(running, stack, namespace, n),
            f"pod {namespace}/{n} Running",
            timeout=timeout,
        )
        for n in names
    ]


def wait_gone(stack: Stack, path: str, timeout: float = 60) -> None:
    stack.wait_for(lambda: get(stack, path) is None, f"{path} to be deleted", timeout=timeout)


def full_pool(stack: Stack, node: str) -> bool:
    return len(slice_devices(stack, node)) == FULL_POOLS[node]


def no_cdi_files(stack: Stack, node: str) -> bool:
    return not cdi_files(stack, node)


def slice_devices(stack: Stack, node: str) -> dict[str, dict[str, Any]]:
    pool = complete_pool(stack.slices(node))
    return {d["name"]: d for s in pool for d in s["spec"].get("devices") or []}


def attribute(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"][name]
    return next(iter(value.values()))


def cdi_files(stack: Stack, node: str) -> list[Path]:
    return sorted(stack.nodes[node].paths.cdi_root.glob("*.yaml"))


def cdi_spec(stack: Stack, node: str, uid: str) -> dict[str, Any]:
    """The claim's CDI spec, validated against the official CDI JSON schema."""
    path = stack.nodes[node].paths.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    assert path.exists(), f"no CDI spec for claim {uid} in {path.parent}"
    return validate_cdi_file(path)


def prepared_claims(stack: Stack, node: str) -> dict[str, str]:
    """claim uid -> checkpoint state on ``node``."""
    path = stack.nodes[node].paths.plugin_dir / "checkpoint.json"
    if not path.exists():
        return {}
    return {uid: c.state for uid, c in checkpointfile.decode(path.read_bytes()).claims.items()}


def sim_host(stack: Stack, node: str) -> SimHost:
    """What the simulated node keeps outside NVML: compute modes, time slices,
    MPS daemons, PCI driver bindings."""
    path = stack.nodes[node].paths.plugin_dir / STATE_FILE
    return msgspec.json.decode(path.read_bytes(), type=SimHost) if path.exists() else SimHost()


def claim_events(stack: Stack, uid: str) -> list[str]:
    """Names of the CLAIMS stream's events about claim ``uid``, in order."""

    async def read() -> list[str]:
        bus = await connect(stack.nats, Role.AUDITOR, name="e2e-stack")
        try:
            sub = await bus.js.subscribe(
                subjects.claim_events_all(), stream=subjects.CLAIMS_STREAM, ordered_consumer=True
            )
            names: list[str] = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    return names
                event = decode(msg.data, ClaimEvent)
                if event.claim.uid == uid:
                    names.append(event.event)
        finally:
            await bus.close()

    return asyncio.run(read())


def presence(stack: Stack, node: str) -> float | None:
    async def read() -> float | None:
        bus = await connect(stack.nats, Role.AUDITOR, name="e2e-stack")
        try:
            key = subjects.presence_key(node, DRIVER)
            found = await bus.kv_get(subjects.PRESENCE_BUCKET, key, PluginPresence)
            return found[0].registered_at if found else None
        finally:
            await bus.close()

    return asyncio.run(read())


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def gpu_claim(namespace: str, name: str) -> dict[str, Any]:
    """A ResourceClaim for one full GPU."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def pod_using(namespace: str, name: str, claim: str, node: str) -> dict[str, Any]:
    """A pod on ``node`` whose one container uses ResourceClaim ``claim``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "ctr", "image": IMAGE, "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def delete(stack: Stack, *args: str) -> None:
    stack.cp.kubectl("delete", *args, "--wait=false")


def leftovers(stack: Stack, node: str) -> list[str]:
    """What prepared claims left on ``node``: CDI specs, checkpointed claims,
    sharing or VFIO state on the simulated host."""
    host = sim_host(stack, node)
    found = [f"CDI spec {p.name}" for p in cdi_files(stack, node)]
    found += [f"checkpointed claim {uid}" for uid in prepared_claims(stack, node)]
    found += [f"MPS daemon {d}" for d in host.mps]
    found += [f"{bus} bound to {driver}" for bus, driver in host.pci_driver.items()]
    found += [f"compute mode {u}={m}" for u, m in host.compute_mode.items()]
    found += [f"time slice {u}={t}" for u, t in host.time_slice.items() if t != "Default"]
    return found


def assert_node_clean(stack: Stack, node: str, timeout: float = 30) -> None:
    """Nothing prepared is left on ``node`` (waiting for unprepares in flight)."""
    with contextlib.suppress(StackError):
        stack.wait_for(lambda: not leftovers(stack, node), f"{node} to be clean", timeout=timeout)
    assert leftovers(stack, node) == []


# ---- every example ----------------------------------------------------------------


@pytest.fixture(scope="module")
def examples(stack: Stack) -> list[demoexamples.Example]:
    return demoexamples.gpu_only(demoexamples.load_examples())


@pytest.fixture(scope="module")
def demo_result(stack: Stack, examples: list[demoexamples.Example]) -> demoview.DemoResult:
    """All examples applied at once, as `gpudra up` does, and waited for."""
    demo.apply_examples(stack, examples)
    return demo.wait_for_examples(stack, examples, timeout=60)


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example(stack: Stack, demo_result: demoview.DemoResult, example: str) -> None:
    """Running pods carry exactly the CDI ids of their containers' devices, each
    defined by the preparer's CDI spec (passing the runtimes' CDI checks) on the
    pod's node, from a claim allocated from that node's pool; the official CDI
    library injects each container's ids into an OCI spec with its GPUs and no others."""
    views = [v for v in demo_result.pods if v.example == example]
    assert views, f"{example} has no pods"
    for view in views:
        want = view.pod
        pod = pod_of(stack, want.namespace, want.name)
        assert pod is not None, f"pod {want} was not created"
        if want.expect == demoexamples.PENDING:
            assert pod["status"].get("phase") == "Pending", pod["status"]
            assert not pod["spec"].get("nodeName")
            continue
        assert pod["status"].get("phase") == "Running", (example, pod["status"])
        node = pod["spec"]["nodeName"]
        recorded = recorded_cdi_ids(pod)
        assert recorded == expected_cdi_ids(stack, pod), example
        for claim in claims_by_pod_name(stack, pod).values():
            uid = claim["metadata"]["uid"]
            assert {r["pool"] for r in results(claim)} == {node}
            assert {r["driver"] for r in results(claim)} == {DRIVER}
            spec = cdi_spec(stack, node, uid)
            assert spec["kind"] == CDI_KIND
            defined = {f"{CDI_KIND}={d['name']}" for d in spec["devices"]}
            mine = {i for ids in recorded.values() for i in ids if f"={uid}-" in i}
            assert mine and mine <= defined, (mine, defined)
            assert prepared_claims(stack, node)[uid] == checkpoint.PREPARE_COMPLETED
        for container, ids in recorded.items():
            assert_injects(stack, node, ids, f"{example}: {want.name}/{container}")


def assert_injects(stack: Stack, node: str, ids: list[str], who: str) -> None:
    """What a runtime gives the container for ``ids``: the GPUs named by them, and no others."""
    assert stack.cp.binary is not None
    injected = inject(stack.cp.binary, stack.nodes[node].paths.cdi_root, ids)
    devices = [i.split("=", 1)[1].split("-", 5)[5] for i in ids]  # "<uid>-<device>" -> device
    gpus = {int(d.split("-")[1]) for d in devices if not d.startswith("gpu-vfio")}
    assert injected.gpu_minors == gpus, (who, injected.device_paths)
    assert "NVIDIA_VISIBLE_DEVICES=void" in injected.env, who
    for path, (kind, major, minor) in injected.device_numbers().items():
        assert (kind, major, minor) in injected.allowed_devices, (who, path)
    if any(d.startswith("gpu-vfio") for d in devices):
        assert any(p.startswith("/dev/vfio/") for p in injected.device_paths), who
    else:
        assert "/dev/nvidiactl" in injected.device_paths, who


def _only_claim(stack: Stack, namespace: str, pod_name: str) -> tuple[Any, str]:
    pod = pod_of(stack, namespace, pod_name)
    (claim,) = claims_by_pod_name(stack, pod).values()
    return claim, pod["spec"]["nodeName"]


def test_cel_memory_selector_gets_40gi_or_more(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "gpu-memory", "training")
    (result,) = results(claim)
    memory = slice_devices(stack, node)[result["device"]]["capacity"]["memory"]["value"]
    assert _bytes(memory) >= 40 * 2**30, memory


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * factor
    return int(quantity)


def test_product_name_selector_gets_that_product(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "product-name", "inference")
    (result,) = results(claim)
    device = slice_devices(stack, node)[result["device"]]
    assert attribute(device, "productName") == "NVIDIA A100-SXM4-40GB"
    assert node == A100


def test_named_claim_is_shared_by_both_pods(stack: Stack, demo_result: Any) -> None:
    producer = pod_of(stack, "shared-claim", "producer")
    consumer = pod_of(stack, "shared-claim", "consumer")
    assert producer["spec"]["nodeName"] == consumer["spec"]["nodeName"]
    assert recorded_cdi_ids(producer)["producer"] == recorded_cdi_ids(consumer)["consumer"]
    claim = claim_of(stack, "shared-claim", "shared-gpu")
    reserved = sorted(r["name"] for r in claim["status"]["reservedFor"])
    assert reserved == ["consumer", "producer"]
    events = claim_events(stack, claim["metadata"]["uid"])
    # Prepared for the first pod; the kubelet's pod workers may also ask for the second
    # before the first call returned (then answered from the checkpoint): once or twice.
    assert 1 <= events.count("prepare.requested") == events.count("prepared") <= 2, events


def test_two_containers_get_the_same_gpu(stack: Stack, demo_result: Any) -> None:
    ids = recorded_cdi_ids(pod_of(stack, "shared-containers", "app"))
    assert ids["model"] == ids["sidecar"] and len(ids["model"]) == 1


def test_mig_profiles_from_one_parent(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "mig-two-profiles", "pipeline")
    devices = slice_devices(stack, node)
    by_request = {r["request"]: devices[r["device"]] for r in results(claim)}
    assert attribute(by_request["worker"], "profile") == "2g.10gb"
    assert attribute(by_request["helper"], "profile") == "1g.5gb"
    parents = {attribute(d, "parentUUID") for d in by_request.values()}
    assert len(parents) == 1
    ids = recorded_cdi_ids(pod_of(stack, "mig-two-profiles", "pipeline"))
    assert len(ids["worker"]) == len(ids["helper"]) == 1 and ids["worker"] != ids["helper"]


def test_four_mig_slices_of_one_gpu(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "mig-four-slices", "sweep")
    devices = slice_devices(stack, node)
    allocated = [devices[r["device"]] for r in results(claim)]
    assert len(allocated) == 4
    assert {attribute(d, "type") for d in allocated} == {"mig"}
    assert {attribute(d, "profile") for d in allocated} == {"1g.5gb"}
    assert len({attribute(d, "parentUUID") for d in allocated}) == 1
    uid = claim["metadata"]["uid"]
    spec = cdi_spec(stack, node, uid)
    caps = [n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    assert any("nvidia-caps" in p for p in caps), caps  # MIG devices get their caps nodes


def test_vfio_passthrough_binds_vfio_and_withdraws_the_twin(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "vfio-vm", "virt-launcher-vm1")
    (result,) = results(claim)
    assert result["device"].startswith("gpu-vfio-")
    devices = slice_devices(stack, node)
    bus_id = attribute(devices[result["device"]], "resource.kubernetes.io/pciBusID")
    assert sim_host(stack, node).pci_driver == {bus_id: "vfio-pci"}
    spec = cdi_spec(stack, node, claim["metadata"]["uid"])
    paths = {
        n["path"]
        for d in [*spec["devices"], {"containerEdits": spec.get("containerEdits", {})}]
        for n in d["containerEdits"].get("deviceNodes", [])
    }
    assert "/dev/vfio/vfio" in paths, paths  # enableAPIDevice
    assert any(p.startswith("/dev/vfio/") and p != "/dev/vfio/vfio" for p in paths), paths

    # The GPU that went to vfio-pci is no longer offered as a GPU (it comes back
    # when the claim goes: test_deleting_the_examples_leaves_nothing_behind).
    def twin_withdrawn() -> bool:
        return not [
            d
            for d in slice_devices(stack, node).values()
            if attribute(d, "type") == "gpu"
            and attribute(d, "resource.kubernetes.io/pciBusID") == bus_id
        ]

    stack.wait_for(twin_withdrawn, "the VFIO device's GPU twin to be withdrawn", timeout=20)


def _gpu_uuid(stack: Stack, node: str, device: str) -> str:
    return str(attribute(slice_devices(stack, node)[device], "uuid"))


def test_time_slicing_sets_long_slices(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "time-slicing", "batch")
    (result,) = results(claim)
    uuid = _gpu_uuid(stack, node, result["device"])
    assert sim_host(stack, node).time_slice[uuid] == "Long"
    ids = recorded_cdi_ids(pod_of(stack, "time-slicing", "batch"))
    assert ids["job-a"] == ids["job-b"]


def test_mps_daemon_with_limits(stack: Stack, demo_result: Any) -> None:
    claim, node = _only_claim(stack, "mps", "inference")
    (result,) = results(claim)
    uuid = _gpu_uuid(stack, node, result["device"])
    host = sim_host(stack, node)
    (daemon,) = host.mps.values()
    assert daemon.active_thread_percentage == 50
    assert daemon.pinned_memory_limits_mib == {uuid: 16 * 1024}  # index 0 overrides 10Gi
    assert host.compute_mode[uuid] == "EXCLUSIVE_PROCESS"
    spec = cdi_spec(stack, node, claim["metadata"]["uid"])
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    env += spec.get("containerEdits", {}).get("env", [])
    assert any(e.startswith("CUDA_MPS_PIPE_DIRECTORY=") for e in env), env


def test_unsatisfiable_claim_stays_pending_with_our_explanation(
    stack: Stack, demo_result: Any
) -> None:
    claim = claim_of(stack, "unsatisfiable", "two-big-gpus")
    assert not results(claim)
    uid = claim["metadata"]["uid"]
    events = get(stack, "/api/v1/namespaces/unsatisfiable/events")["items"]
    ours = [
        e
        for e in events
        if e["involvedObject"].get("uid") == uid
        and e.get("source", {}).get("component") == "gpudra-allocator"
    ]
    assert len(ours) == 1, events
    assert ours[0]["type"] == "Warning"
    assert "request gpus: needs 2, 0 candidate device(s)" in ours[0]["message"]
    assert 'quantity("256Gi")' in ours[0]["message"]  # which selector ruled the GPUs out
    pending = pod_of(stack, "unsatisfiable", "too-big")
    assert pending["status"].get("phase") == "Pending"


def test_deleting_the_examples_leaves_nothing_behind(
    stack: Stack, examples: list[demoexamples.Example], demo_result: Any
) -> None:
    namespaces = sorted({p.namespace for e in examples for p in e.pods})
    delete(stack, "namespace", *namespaces)
    for e in examples:
        for p in e.pods:
            wait_gone(stack, f"/api/v1/namespaces/{p.namespace}/pods/{p.name}")
    for node in stack.nodes:
        assert_node_clean(stack, node)
        # Twins withdrawn while their GPU was prepared are offered again.
        stack.wait_for(
            functools.partial(full_pool, stack, node), f"{node}: all published", timeout=30
        )


# ---- the hard cases ------------------------------------------------------------


@pytest.fixture
def scratch(stack: Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for one test, deleted afterwards; teardown waits until its
    pods are gone and no CDI spec is left, so the next test starts on clean nodes."""
    ns = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:63].strip("-")
    stack.cp.apply(namespace(ns))
    yield ns
    delete(stack, "namespace", ns)
    stack.wait_for(
        lambda: not get(stack, f"/api/v1/namespaces/{ns}/pods")["items"], f"the pods of {ns} gone"
    )
    for node in stack.nodes:
        stack.wait_for(functools.partial(no_cdi_files, stack, node), f"{node}: no CDI specs")


def test_shared_claim_is_unprepared_after_its_last_pod(stack: Stack, scratch: str) -> None:
    ns = scratch
    stack.cp.apply(
        [
            gpu_claim(ns, "shared"),
            pod_using(ns, "first", "shared", H100),
            pod_using(ns, "second", "shared", H100),
        ]
    )
    wait_running(stack, ns, "first", "second")
    uid = claim_of(stack, ns, "shared")["metadata"]["uid"]
    spec_file = stack.nodes[H100].paths.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    assert spec_file.exists()

    delete(stack, "pod", "first", "-n", ns)
    wait_gone(stack, f"/api/v1/namespaces/{ns}/pods/first")
    assert running(stack, ns, "second")
    assert spec_file.exists(), "unprepared while a pod still uses the claim"
    assert "unprepared" not in claim_events(stack, uid)

    delete(stack, "pod", "second", "-n", ns)
    wait_gone(stack, f"/api/v1/namespaces/{ns}/pods/second")
    stack.wait_for(lambda: not spec_file.exists(), "the claim's CDI spec to be removed")
    events = claim_events(stack, uid)
    # The kubelet may prepare the claim for both pods side by side (its pod workers run
    # in parallel and check "prepared" before the call): each request is answered, the
    # second from the checkpoint. It is unprepared once, after the last pod.
    prepared = events.count("prepared")
    assert 1 <= prepared == events.count("prepare.requested") <= 2, events
    assert events.count("unprepared") == 1, events
    assert_node_clean(stack, H100)


@pytest.mark.parametrize("step", ["after-prepare-started", "after-cdi-write"])
def test_preparer_killed_during_prepare_recovers(stack: Stack, scratch: str, step: str) -> None:
    """The kubelet's call fails while the preparer is down; once it is back the
    kubelet's retry prepares the claim: the pod runs and nothing is left over."""
    node, ns, name = A100, scratch, f"preparer-{A100}"
    stack.restart_service(name, env={faults.ENV: step}, ready='"preparer ready"')
    stack.expect_exit(name)
    crashed = stack.processes[name]
    try:
        stack.cp.apply([gpu_claim(ns, "victim"), pod_using(ns, "victim", "victim", node)])
        stack.wait_for(lambda: not crashed.running(), f"the preparer to crash {step}", timeout=60)
    finally:
        crashed.stop()
        stack.start_service(name, ready='"preparer ready"')
    assert crashed.proc.returncode == faults.EXIT_STATUS
    assert f"crashing at {step}" in crashed.log_tail()

    (victim,) = wait_running(stack, ns, "victim", timeout=90)
    uid = claim_of(stack, ns, "victim")["metadata"]["uid"]
    assert recorded_cdi_ids(victim) == expected_cdi_ids(stack, victim)
    assert [p.name for p in cdi_files(stack, node)] == [f"k8s.gpu.nvidia.com-claim_{uid}.yaml"]
    assert prepared_claims(stack, node) == {uid: checkpoint.PREPARE_COMPLETED}
    stack.wait_for(
        lambda: any(
            e["reason"] == "FailedPrepareDynamicResources"
            for e in get(stack, f"/api/v1/namespaces/{ns}/events")["items"]
        ),
        "the kubelet's FailedPrepareDynamicResources event",
        timeout=10,
    )

    delete(stack, "pod", "victim", "-n", ns)
    wait_gone(stack, f"/api/v1/namespaces/{ns}/pods/victim")
    assert_node_clean(stack, node)


def test_kubelet_restart_reregisters_and_slices_converge(stack: Stack, scratch: str) -> None:
    node, ns = H100, scratch
    stack.cp.apply([gpu_claim(ns, "before"), pod_using(ns, "before", "before", node)])
    (before,) = wait_running(stack, ns, "before")
    # Its GPU's VFIO twin is withdrawn while it is prepared.
    held = FULL_POOLS[node] - 1
    stack.wait_for(lambda: len(slice_devices(stack, node)) == held, "the twin withdrawn")
    registered = presence(stack, node)
    assert registered is not None

    stack.restart_kubelet(node)  # returns once the new kubelet wiped the node's slices
    stack.wait_for(
        lambda: (presence(stack, node) or 0) > registered, "the plugin to register again"
    )
    pool = stack.wait_slices(node)
    assert sum(len(s["spec"].get("devices") or []) for s in pool) == held

    # A new pod goes through the re-registered plugin.
    stack.cp.apply([gpu_claim(ns, "after"), pod_using(ns, "after", "after", node)])
    (after,) = wait_running(stack, ns, "after")
    assert recorded_cdi_ids(after) == expected_cdi_ids(stack, after)
    # The restarted kubelet prepares the running pod's claim again (its
    # "prepared" flag is not checkpointed); we answer with the same devices and
    # keep one spec. Kubelet 1.35.8 appends that answer to the devices it
    # restored, so ids may repeat (kubernetes/kubernetes#140471, fixed by #140274).
    uid = claim_of(stack, ns, "before")["metadata"]["uid"]
    events = stack.wait_for(
        lambda: (e := claim_events(stack, uid)).count("prepared") == 2 and e,
        "the kubelet's second prepare of the running pod's claim",
        timeout=30,
    )
    assert events.count("prepare.requested") == 2, events
    again = recorded_cdi_ids(pod_of(stack, ns, "before"))
    assert {k: sorted(set(v)) for k, v in again.items()} == recorded_cdi_ids(before)
    assert len([p for p in cdi_files(stack, node) if uid in p.name]) == 1

    delete(stack, "pod", "before", "after", "-n", ns)
    for name in ("before", "after"):
        wait_gone(stack, f"/api/v1/namespaces/{ns}/pods/{name}")
    assert_node_clean(stack, node)
    stack.wait_for(functools.partial(full_pool, stack, node), "the twins back")
