"""Every example in real containers: containerd, runc and the real kubelet on real nodes.

One stack for the module (``Stack(real_nodes=True)``, services/local/node.py):
NATS, the control plane, and two real nodes, ``gpu-node-h100`` (dgx-h100) and
``gpu-node-a100`` (dgx-a100, static MIG), each with containerd and the real
kubelet v1.35 in its own mount namespace over the simulated driver root, and
gpudra's discovery, preparer (in that namespace), kubeletplugin, publisher and
allocator. The path under test: our slices -> kube-scheduler -> our watcher ->
the kubelet's DRA manager -> our socket -> preparer -> CDI spec -> containerd's
CDI injection -> runc, with NVIDIA's own nvidia-cdi-hook -> the container.

The tests run in file order: every example (applied at once, with the local
busybox image), each container's own view checked from inside it against
the claim's allocation and the node's simulated hardware; the examples
deleted (unprepared, containers and cgroups gone); then the faults (containerd
killed while a prepare hangs, the kubelet restarted under running pods, a CDI
spec deleted under a running pod, an image that is not there), each ending in
a clear pod event and nothing left behind; last, the stack is stopped and the
host must be as it was (sysctls, iptables, mounts, cgroups, default paths).

What every container saw is written to ``<work dir>/logs/container-views.json``
(kept with ``GPUDRA_E2E_KEEP=1``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.local import demo, demoexamples, demoview, images, nodetools
from services.local import node as nodes
from services.local.stack import Stack
from services.local.stackprocs import StackError
from services.preparer import cdi
from tests.helpers import containerview
from tests.helpers.containerview import LIB_DIR, ContainerView
from tests.helpers.realnode import (
    HostState,
    claim_events,
    gpudra_checkpoint,
    kubelet_checkpoint,
    pod_containers,
    pod_traces,
)
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.realnode]

H100 = "gpu-node-h100"
A100 = "gpu-node-a100"
DRIVER = "gpu.nvidia.com"
NVIDIA_MAJOR = 195
WORKLOAD = "nvidia-smi -L; trap 'exit 0' TERM; sleep 3600 & wait"
#: Every example but those with a ComputeDomain, which `gpudra up` leaves out on real
#: nodes (none is in an NVLink fabric; docs/computedomains.md).
EXAMPLE_FILES = sorted(e.name for e in demoexamples.gpu_only(demoexamples.load_examples()))


@pytest.fixture(scope="module")
def host_before() -> HostState:
    """The host as it was before any real node ran."""
    return HostState.now()


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest, controlplane_binary: Path, host_before: HostState
) -> Iterator[Stack]:
    reason = nodes.unavailable()
    if reason:
        pytest.skip(f"real nodes cannot run here: {reason}")
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        try:
            tools = nodetools.NodeTools.find(controlplane_binary)
        except nodetools.NodeError as exc:
            pytest.skip(f"no Go toolchain and no cached containerd: {exc}")
    else:
        tools = nodetools.NodeTools.find(controlplane_binary)
    s = Stack(
        binary=controlplane_binary,
        real_nodes=True,
        node_tools=tools,
        pending_threshold=1.0,
        prepare_timeout=6.0,
    )
    with started_stack(request, s, "real-node stack"):
        yield s


# ---- the cluster and the nodes --------------------------------------------------


def pod_of(stack: Stack, namespace: str, name: str) -> Any:
    return stack.api_get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def claim_of(stack: Stack, namespace: str, name: str) -> Any:
    return stack.api_get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")


def claim_uids(stack: Stack, pod: Any) -> list[str]:
    namespace = pod["metadata"]["namespace"]
    names = demoview.pod_claims(pod).values()
    return [claim_of(stack, namespace, name)["metadata"]["uid"] for name in names]


def events_of(stack: Stack, namespace: str, pod: str) -> list[dict[str, Any]]:
    items = stack.api_get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == pod]


def event_with(stack: Stack, namespace: str, pod: str, reason: str, text: str = "") -> Any:
    """The pod's event of ``reason`` whose message holds ``text``, if any."""
    for e in events_of(stack, namespace, pod):
        if e["reason"] == reason and text in e.get("message", ""):
            return e
    return None


def running_ready(stack: Stack, namespace: str, name: str) -> Any:
    pod = pod_of(stack, namespace, name)
    if not pod or pod["status"].get("phase") != "Running":
        return None
    statuses = pod["status"].get("containerStatuses") or []
    return pod if statuses and all(c.get("ready") for c in statuses) else None


def wait_running(stack: Stack, namespace: str, name: str, timeout: float = 90) -> Any:
    return stack.wait_for(
        functools.partial(running_ready, stack, namespace, name),
        f"pod {namespace}/{name} Running with its containers ready",
        timeout=timeout,
    )


@dataclass(frozen=True)
class Traces:
    """Where to look for what a pod may leave: its node, uid, claims and containers."""

    node: str
    pod_uid: str
    claims: list[str]
    containers: list[str]

    @classmethod
    def of(cls, stack: Stack, pod: Any) -> Traces:
        node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
        return cls(node, uid, claim_uids(stack, pod), pod_containers(stack, node, uid))

    def left(self, stack: Stack) -> list[str]:
        return pod_traces(stack, self.node, self.pod_uid, self.claims, self.containers)


def wait_clean(stack: Stack, traces: Traces) -> None:
    """Wait until nothing of the pod and its claims is left on its node, then check."""
    with contextlib.suppress(StackError):
        stack.wait_for(
            lambda: not traces.left(stack),
            f"pod {traces.pod_uid} to leave nothing on {traces.node}",
            timeout=60,
        )
    assert traces.left(stack) == []


def delete(stack: Stack, *args: str) -> None:
    stack.cp.kubectl("delete", *args, "--wait=false")


def gpu_claim(namespace: str, name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def gpu_pod(
    namespace: str, name: str, claim: str, node: str, image: str = images.BUSYBOX_IMAGE
) -> dict[str, Any]:
    """A pod on ``node`` whose container lists its GPUs, then waits (exits 0 on TERM)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "ctr",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", WORKLOAD],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


# ---- what a container must see ---------------------------------------------------


@dataclass
class Expected:
    """The node's hardware behind a container's CDI ids."""

    gpus: dict[str, int] = field(default_factory=dict)  # GPU uuid -> minor (MIG parents too)
    migs: dict[str, tuple[int, int]] = field(default_factory=dict)  # MIG uuid -> (gi, ci) caps
    vfio_groups: set[int] = field(default_factory=set)

    @property
    def nvidia(self) -> bool:
        return bool(self.gpus)


def device_of(cdi_id: str) -> tuple[str, str]:
    """``k8s.gpu.nvidia.com/claim=<uid>-<device>`` -> (uid, device)."""
    name = cdi_id.split("=", 1)[1]
    return name[:36], name[37:]


def expected(stack: Stack, node: str, ids: list[str]) -> Expected:
    facts = stack.real[node].host_facts["gpus"]
    by_uuid = {g["uuid"]: g for g in facts}
    by_bus = {g["pciBusId"]: g for g in facts}
    slices = {
        d["name"]: {k: next(iter(v.values())) for k, v in d["attributes"].items()}
        for s in stack.slices(node)
        for d in s["spec"].get("devices") or []
    }
    want = Expected()
    for cdi_id in ids:
        _, device = device_of(cdi_id)
        attrs = slices[device]
        if attrs["type"] == "gpu":
            want.gpus[attrs["uuid"]] = by_uuid[attrs["uuid"]]["minor"]
        elif attrs["type"] == "mig":
            parent = by_uuid[attrs["parentUUID"]]
            want.gpus[parent["uuid"]] = parent["minor"]
            mig = next(m for m in parent["migs"] if m["uuid"] == attrs["uuid"])
            want.migs[mig["uuid"]] = (mig["giCap"], mig["ciCap"])
        else:
            want.vfio_groups.add(by_bus[attrs["resource.kubernetes.io/pciBusID"]]["iommuGroup"])
    return want


def assert_sees(view: ContainerView, want: Expected, version: str, who: str) -> None:
    """The container has the devices of its allocation and no others, the driver's
    files, what NVIDIA's hooks make, and nvidia-smi lists exactly its GPUs."""
    gpu_nodes = {f"/dev/nvidia{m}": (NVIDIA_MAJOR, m) for m in want.gpus.values()}
    assert view.gpu_nodes() == gpu_nodes, (who, view.devices)
    caps = {f"/dev/nvidia-caps/nvidia-cap{n}" for pair in want.migs.values() for n in pair}
    assert set(view.caps_nodes()) == caps, (who, view.devices)
    assert {p: n[1] for p, n in view.caps_nodes().items()} == {
        p: int(p.rsplit("cap", 1)[1]) for p in caps
    }, who
    vfio = {f"/dev/vfio/{g}" for g in want.vfio_groups}
    assert set(view.vfio_nodes()) == (vfio | {"/dev/vfio/vfio"} if vfio else set()), who
    if not want.nvidia:
        assert not any(p.startswith("/dev/nvidia") for p in view.devices), (who, view.devices)
        # A GPU passed through to a VM gets no driver: no nvidia-smi, no driver mounts.
        assert view.smi_exit == 127, (who, view.smi)
        assert not [m for m in view.mounts if "/nvidia/driver/" in m.root], who
        return
    assert view.devices["/dev/nvidiactl"] == (NVIDIA_MAJOR, 255), who
    assert "/dev/nvidia-uvm" in view.devices and "/dev/nvidia-uvm-tools" in view.devices, who
    assert view.env.get("NVIDIA_VISIBLE_DEVICES") == "void", (who, view.env)
    assert set(view.smi_uuids()) == set(want.gpus) | set(want.migs), (who, view.smi)
    assert view.smi_exit == 0, who
    # The driver's files, bind-mounted from the node's driver root.
    libcuda = f"{LIB_DIR}/libcuda.so.{version}"
    for target in (libcuda, "/usr/bin/nvidia-smi", f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin"):
        mount = view.mounted_at(target)
        assert mount is not None and mount.root.startswith("/nvidia/driver/"), (who, target)
    # What nvidia-cdi-hook did in the container: the soname links, an ld.so.conf.d
    # entry for the driver's folder and an ld.so.cache that knows libcuda.so.1.
    assert view.links.get(f"{LIB_DIR}/libcuda.so.1") == f"libcuda.so.{version}", (who, view.links)
    assert view.links.get(f"{LIB_DIR}/libcuda.so") == "libcuda.so.1", (who, view.links)
    assert any(re.fullmatch(r"00-nvcr-\d+\.conf", f) for f in view.ldconf), (who, view.ldconf)
    assert view.ldcache_names_libcuda, who


# ---- every example -------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples(stack: Stack) -> list[demoexamples.Example]:
    return demoexamples.gpu_only(demoexamples.load_examples())


@pytest.fixture(scope="module")
def demo_result(stack: Stack, examples: list[demoexamples.Example]) -> demoview.DemoResult:
    demo.apply_examples(stack, examples)
    return demo.wait_for_examples(stack, examples, timeout=120)


@pytest.fixture(scope="module")
def seen(
    stack: Stack, demo_result: demoview.DemoResult
) -> dict[tuple[str, str, str], ContainerView]:
    """Every running example container's view, looked at once (and written down)."""
    views: dict[tuple[str, str, str], ContainerView] = {}
    report: dict[str, Any] = {}
    for pod in demo_result.pods:
        if pod.pod.expect != demoexamples.RUNNING or not pod.ok:
            continue
        for container, ids in sorted(pod.cdi_devices.items()):
            key = (pod.pod.namespace, pod.pod.name, container)
            views[key] = containerview.look(stack.cp, *key)
            report.setdefault(pod.example, {})[f"{pod.pod.name}/{container}"] = {
                "node": pod.node,
                "cdi devices": ids,
                **containerview.summary(views[key]),
            }
    (stack.logs_dir / "container-views.json").write_text(json.dumps(report, indent=2) + "\n")
    return views


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_example_runs_in_real_containers(
    stack: Stack,
    demo_result: demoview.DemoResult,
    seen: dict[tuple[str, str, str], ContainerView],
    example: str,
) -> None:
    """Each container of each Running pod sees the devices of its claims' allocation
    and no others, with the driver's files and what the hooks made."""
    pods = [v for v in demo_result.pods if v.example == example]
    assert pods, f"{example} has no pods"
    for view in pods:
        pod = pod_of(stack, view.pod.namespace, view.pod.name)
        if view.pod.expect == demoexamples.PENDING:
            assert pod["status"].get("phase") == "Pending" and not pod["spec"].get("nodeName")
            continue
        assert view.ok, (example, view.phase, view.problems, pod["status"])
        version = stack.real[view.node].host_facts["driverVersion"]
        for container, ids in view.cdi_devices.items():
            assert ids, (example, container)
            who = f"{example}: {view.pod.name}/{container}"
            want = expected(stack, view.node, ids)
            assert_sees(seen[(view.pod.namespace, view.pod.name, container)], want, version, who)


def test_a_shared_claim_is_the_same_gpu_in_both_pods(
    seen: dict[tuple[str, str, str], ContainerView],
) -> None:
    producer = seen[("shared-claim", "producer", "producer")]
    consumer = seen[("shared-claim", "consumer", "consumer")]
    assert producer.smi_uuids() == consumer.smi_uuids() and len(producer.smi_uuids()) == 1
    assert producer.gpu_nodes() == consumer.gpu_nodes()


def test_containers_of_one_claim_see_the_same_gpu(
    seen: dict[tuple[str, str, str], ContainerView],
) -> None:
    for ns, pod, a, b in (
        ("shared-containers", "app", "model", "sidecar"),
        ("time-slicing", "batch", "job-a", "job-b"),
        ("mps", "inference", "client-a", "client-b"),
    ):
        assert seen[(ns, pod, a)].smi_uuids() == seen[(ns, pod, b)].smi_uuids(), (ns, pod)
        assert seen[(ns, pod, a)].gpu_nodes() == seen[(ns, pod, b)].gpu_nodes(), (ns, pod)


def test_mig_containers_share_the_parent_but_not_the_caps(
    seen: dict[tuple[str, str, str], ContainerView],
) -> None:
    worker = seen[("mig-two-profiles", "pipeline", "worker")]
    helper = seen[("mig-two-profiles", "pipeline", "helper")]
    assert worker.gpu_nodes() == helper.gpu_nodes() and len(worker.gpu_nodes()) == 1
    assert worker.caps_nodes() and helper.caps_nodes()
    assert not set(worker.caps_nodes()) & set(helper.caps_nodes())
    assert len(seen[("mig-four-slices", "sweep", "sweep")].caps_nodes()) == 8  # 4 x (GI, CI)


def test_mps_clients_get_the_daemon_pipe(seen: dict[tuple[str, str, str], ContainerView]) -> None:
    for client in ("client-a", "client-b"):
        view = seen[("mps", "inference", client)]
        pipe = view.env.get("CUDA_MPS_PIPE_DIRECTORY", "")
        assert pipe, (client, view.env)
        mount = view.mounted_at(pipe)
        assert mount is not None and "/mps/" in mount.root, (client, pipe, view.mounts)


def test_deleting_the_examples_unprepares_and_removes_the_containers(
    stack: Stack, examples: list[demoexamples.Example], demo_result: demoview.DemoResult
) -> None:
    running = [v for v in demo_result.pods if v.pod.expect == demoexamples.RUNNING]
    traces = [Traces.of(stack, pod_of(stack, v.pod.namespace, v.pod.name)) for v in running]
    namespaces = sorted({p.namespace for e in examples for p in e.pods})
    delete(stack, "namespace", *namespaces)
    for trace in traces:
        wait_clean(stack, trace)
    for node in stack.nodes:
        assert list(stack.nodes[node].paths.cdi_root.glob("*.yaml")) == []
        assert gpudra_checkpoint(stack, node) == {}
        assert kubelet_checkpoint(stack, node) == set()


# ---- faults ------------------------------------------------------------------------


@pytest.fixture
def scratch(stack: Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace for one test; its pods are gone and nothing is left after it."""
    ns = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:63].strip("-")
    stack.cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield ns
    delete(stack, "namespace", ns)
    stack.wait_for(
        lambda: not stack.api_get(f"/api/v1/namespaces/{ns}/pods")["items"],
        f"the pods of {ns} gone",
        timeout=90,
    )
    for node in stack.nodes.values():
        stack.wait_for(
            functools.partial(no_specs, node.paths.cdi_root),
            f"{node.name}: no CDI specs",
            timeout=60,
        )


def no_specs(cdi_root: Path) -> bool:
    return not list(cdi_root.glob("*.yaml"))


def start_pod(stack: Stack, ns: str, name: str, node: str) -> tuple[Any, str]:
    stack.cp.apply([gpu_claim(ns, name), gpu_pod(ns, name, name, node)])
    pod = wait_running(stack, ns, name)
    return pod, claim_of(stack, ns, name)["metadata"]["uid"]


def container_id(pod: Any) -> str:
    return str(pod["status"]["containerStatuses"][0]["containerID"])


def test_containerd_killed_and_restarted_while_a_prepare_hangs(stack: Stack, scratch: str) -> None:
    """The preparer is held (SIGSTOP) so the kubelet's prepare cannot finish; containerd
    is killed and started again meanwhile; once the preparer goes on, the pod runs
    with its GPU, and a pod that was already running kept its container."""
    node, ns = A100, scratch
    before, _ = start_pod(stack, ns, "before", node)
    preparer = stack.processes[f"preparer-{node}"]
    os.kill(preparer.pid, signal.SIGSTOP)
    try:
        stack.cp.apply([gpu_claim(ns, "during"), gpu_pod(ns, "during", "during", node)])
        stack.wait_for(
            lambda: event_with(stack, ns, "during", "FailedPrepareDynamicResources"),
            "the kubelet's prepare to fail while the preparer is held",
            timeout=60,
        )
        old = stack.real[node].containerd
        stack.kill_containerd(node)
        assert old is not None and not old.running()
        stack.start_containerd(node)
    finally:
        os.kill(preparer.pid, signal.SIGCONT)
    during = wait_running(stack, ns, "during", timeout=120)
    event = event_with(stack, ns, "during", "FailedPrepareDynamicResources")
    assert "during" in event["message"], event  # names the claim
    assert event_with(stack, ns, "during", "Started") is not None
    view = containerview.look(stack.cp, ns, "during", "ctr")
    assert len(view.gpu_nodes()) == 1 and len(view.smi_uuids()) == 1, view.smi
    still = running_ready(stack, ns, "before")
    assert still is not None and container_id(still) == container_id(before)
    assert still["status"]["containerStatuses"][0]["restartCount"] == 0
    for name, pod in (("before", before), ("during", during)):
        traces = Traces.of(stack, pod)
        delete(stack, "pod", name, "-n", ns)
        wait_clean(stack, traces)


def test_kubelet_restarted_under_running_pods(stack: Stack, scratch: str) -> None:
    """The containers keep running untouched; the new kubelet takes the pod over
    from its checkpoint without preparing the claim again (a real kubelet prepares
    only when it makes a pod sandbox) and unprepares it when the pod goes."""
    node, ns = H100, scratch
    pod, uid = start_pod(stack, ns, "steady", node)
    traces = Traces.of(stack, pod)
    before = containerview.look(stack.cp, ns, "steady", "ctr")
    spec = cdi.spec_path(stack.nodes[node].paths.cdi_root, uid)
    assert spec.exists()
    stack.restart_kubelet(node)  # returns once the new kubelet wiped the node's slices
    stack.wait_for(
        functools.partial(serves, stack, ns, "steady"), "the new kubelet to serve the pod"
    )
    after_pod = wait_running(stack, ns, "steady")
    assert container_id(after_pod) == container_id(pod)
    assert after_pod["status"]["containerStatuses"][0]["restartCount"] == 0
    after = containerview.look(stack.cp, ns, "steady", "ctr")
    assert after.smi_uuids() == before.smi_uuids() and after.devices == before.devices
    assert [p.name for p in stack.nodes[node].paths.cdi_root.glob("*.yaml")] == [spec.name]
    assert claim_events(stack, uid).count("prepare.requested") == 1
    assert uid in kubelet_checkpoint(stack, node)
    warnings = [e for e in events_of(stack, ns, "steady") if e["type"] == "Warning"]
    assert warnings == [], warnings
    delete(stack, "pod", "steady", "-n", ns)
    wait_clean(stack, traces)
    events = claim_events(stack, uid)
    assert events.count("prepared") == 1 and events.count("unprepared") == 1, events


def serves(stack: Stack, namespace: str, pod: str) -> bool:
    """The node's kubelet knows the pod: ``kubectl exec`` reaches its container."""
    said = stack.cp.kubectl("exec", "-n", namespace, pod, "--", "echo", "ok", check=False)
    return said.strip() == "ok"


def test_cdi_spec_deleted_under_a_running_pod(stack: Stack, scratch: str) -> None:
    """The running container keeps the devices it was given; when it restarts,
    containerd cannot resolve its CDI device: a Failed event names it; deleting
    the pod unprepares the claim and leaves nothing."""
    node, ns = A100, scratch
    pod, uid = start_pod(stack, ns, "orphan", node)
    traces = Traces.of(stack, pod)
    spec = cdi.spec_path(stack.nodes[node].paths.cdi_root, uid)
    spec.unlink()
    view = containerview.look(stack.cp, ns, "orphan", "ctr")
    assert len(view.gpu_nodes()) == 1, view.devices  # injected at creation, still there
    kill_init(stack, ns, "orphan", "ctr")
    event = stack.wait_for(
        lambda: event_with(stack, ns, "orphan", "Failed", "CDI"),
        "the runtime's event about the missing CDI device",
        timeout=60,
    )
    assert cdi.device_id(uid, "") in event["message"] or uid in event["message"], event
    delete(stack, "pod", "orphan", "-n", ns)
    wait_clean(stack, traces)


def kill_init(stack: Stack, ns: str, pod: str, container: str) -> None:
    """End the container's PID 1 from inside. The exec session lives in the container
    it ends, so it may be killed with it (137 = SIGKILL) before it reports 0: both mean
    the kill was delivered; what follows waits for the container's end itself."""
    kubectl = [*stack.cp.command("kubectl"), "--kubeconfig", str(stack.cp.kubeconfig)]
    argv = [*kubectl, "exec", "-n", ns, pod, "-c", container, "--", "kill", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode in (0, 137), f"kill 1 failed ({out.returncode}): {out.stderr}"


def test_missing_image(stack: Stack, scratch: str) -> None:
    """An image that is not on the node (and may not be pulled): ErrImageNeverPull
    names it; the claim was prepared and is unprepared with the pod; nothing left."""
    node, ns = H100, scratch
    missing = "gpudra.local/not-imported:1"
    stack.cp.apply([gpu_claim(ns, "noimage"), gpu_pod(ns, "noimage", "noimage", node, missing)])
    event = stack.wait_for(
        lambda: event_with(stack, ns, "noimage", "ErrImageNeverPull"),
        "the kubelet's ErrImageNeverPull event",
        timeout=60,
    )
    assert missing in event["message"], event
    uid = claim_of(stack, ns, "noimage")["metadata"]["uid"]
    assert cdi.spec_path(
        stack.nodes[node].paths.cdi_root, uid
    ).exists()  # prepared before the image
    pod = pod_of(stack, ns, "noimage")
    assert pod["status"]["phase"] == "Pending"
    traces = Traces.of(stack, pod)
    assert traces.containers  # the sandbox ran; the container could not be made
    delete(stack, "pod", "noimage", "-n", ns)
    wait_clean(stack, traces)


# ---- the host -------------------------------------------------------------------------


def test_stopping_leaves_the_host_as_it_was(stack: Stack, host_before: HostState) -> None:
    """Last: every process of the nodes gone, their cgroups removed, and the host's
    sysctls, iptables, mounts, cgroup hierarchies and default paths unchanged."""
    reals = list(stack.real.values())
    assert all(r.holder is not None and r.holder.running() for r in reals)
    # While running, the kubelets set their sysctls inside the namespaces only.
    for real in reals:
        panic = real.inside("/proc/sys/kernel/panic").read_text().strip()
        assert panic == "10", panic  # what the kubelet writes (into the node's cover file)
    mine = [r.cgroups.root.lstrip("/") for r in reals]
    running = HostState.now().differences(host_before, mine)
    assert [d for d in running if not d.startswith("new cgroup ")] == []  # theirs, for now
    stack.stop()
    for real in reals:
        assert real.leftovers() == [], real.name
    assert HostState.now().differences(host_before, mine) == [], cgroup_members()


def cgroup_members() -> list[str]:
    """Processes in a gpudra-* cgroup, and every runc, shim, containerd or kubelet
    (what a failed host check lists)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                cgroups = (entry / "cgroup").read_text()
                if "/gpudra-" in cgroups or re.search(r"runc|containerd|kubelet", cmd):
                    found.append(f"{entry.name}: {cmd[:300]} [{cgroups.strip()}]")
    return found
