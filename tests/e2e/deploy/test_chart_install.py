"""The product as users install it: the Helm chart, installed by real helm into a real
cluster, runs gpudra as pods, and a GPU pod runs through it.

The cluster is the local control plane (service accounts on, the workload
controllers) and one real node (services/local/node.py: containerd, runc and the
real kubelet in their own mount namespace, the simulated H100 node's driver
installation under /run/nvidia/driver). The gpudra image is the one
services/local/image.py builds from Debian packages, imported into the node's
containerd; NATS runs from the same image (its nats-server). Every gpudra
component is a pod of the chart: the node DaemonSet (discovery, preparer, kubelet
plugin, simulated fleet dgx-h100), the publisher and allocator Deployments, the NATS
StatefulSet and its auth callout, the keygen and provision hook Jobs. The node's
pods have only a loopback, so the chart puts them on the node's network
(``hostNetwork``) with free 127.0.0.1 ports, and points them at the API server
(``apiServer``) and NATS (``nats.url``) there; everything else is the chart's.

The kubelet finds the plugin through its plugin registry, over the hostPath sockets
the kubelet plugin container creates; the GPU pod (examples/01, with the local
busybox image) sees its one GPU. Then ``helm upgrade`` to a changed image rolls
the node pod with rolling-update sockets (surge: the new pod serves before the old
one goes): the running pod's claim stays prepared, a new pod runs through the new
plugin, and the old pod's claim is unprepared by it.

Needs root, cgroups, runc and mmdebstrap (``make e2e`` installs them); skipped
with the reason otherwise. 1 to 2.5 minutes on 2 cores with warm caches.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.local import REPO, image, images, node, nodetools
from services.local.cluster import WORKLOAD_CONTROLLERS, ControlPlane
from services.local.component import wait_until
from services.local.helm import CHART, Helm, build_helm, set_args
from services.local.kubebinary import build_controlplane
from services.local.ports import free_port
from services.preparer import cdi

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

NODE = "gpu-node-h100"
FLEET = "dgx-h100"
NS = "gpu-system"
RELEASE = "gpudra"
WAIT = 300.0  # give-up bound for anything the cluster does (2 busy cores)
EXAMPLE = REPO / "examples" / "01-single-gpu-template.yaml"
DRIVER = "gpu.nvidia.com"


@dataclass
class Installed:
    cp: ControlPlane
    node: node.RealNode
    helm: Helm
    values: dict[str, object]
    first: image.Image
    changed: image.Image


def _skip_reason() -> str | None:
    reason = node.unavailable()
    if reason:
        return reason
    if shutil.which("mmdebstrap") is None:
        return "the gpudra image needs mmdebstrap (make image installs it)"
    return None


def local_values(cp: ControlPlane, real: node.RealNode, built: image.Image) -> dict[str, object]:
    """The chart's values for this one-node cluster (see the module docstring)."""
    repository, tag = built.name.rsplit(":", 1)
    client, cluster, monitor = free_port(), free_port(), free_port()
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "simulatedFleet": FLEET,
        "kubeletRoot": str(real.paths.kubelet_root),
        "cdiRoot": str(real.paths.cdi_root),
        "nvidiaDriverRoot": str(real.driver_root),
        "hostNetwork": True,
        "apiServer": {"host": "127.0.0.1", "port": str(cp.ports["apiserver"])},
        "metrics.enabled": False,  # host ports: a surge node pod could not be scheduled
        "node.kubeletplugin.rollingUpdateSockets": True,
        # The compute-domain registration socket named with a pod UID fits the 107 bytes
        # of a socket path only under a kubelet root as short as /var/lib/kubelet; this
        # node's is under /tmp and longer (its own tests: test_computedomain_*.py).
        "computeDomains.enabled": False,
        "node.updateStrategy": {"type": "RollingUpdate",
                                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "nats.url": f"tls://127.0.0.1:{client}",
        "nats.listenAddress": "127.0.0.1",
        "nats.ports": {"client": client, "cluster": cluster, "monitor": monitor},
        "nats.replicas": 1,
        "nats.image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nats.command": ["nats-server"],
        "nats.persistence.enabled": False,
        "nats.auth.replicas": 1,
    }  # fmt: skip


def pods(cp: ControlPlane, namespace: str = NS) -> list[dict[str, Any]]:
    return list(cp.kubectl_json("get", "pods", "-n", namespace)["items"])


def describe(cp: ControlPlane, real: node.RealNode) -> str:
    """What went wrong, for a failed wait: every pod's phase and its containers' logs."""
    lines = []
    for namespace in (NS, "single-gpu"):
        for pod in pods(cp, namespace):
            status = pod.get("status", {})
            lines.append(f"{namespace}/{pod['metadata']['name']}: {status.get('phase')} "
                         f"{json.dumps(status.get('containerStatuses', []))[:600]}")  # fmt: skip
    logs = real.root / "var-log" / "pods"
    for log in sorted(logs.rglob("*.log")) if logs.is_dir() else []:
        lines.append(f"--- {log.relative_to(logs)}\n{log.read_text(errors='replace')[-1500:]}")
    return "\n".join(lines)


def wait(installed: Installed, check: Any, what: str) -> Any:
    try:
        return wait_until(check, WAIT, what, interval=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{describe(installed.cp, installed.node)}") from None


def node_pods(cp: ControlPlane) -> list[dict[str, Any]]:
    return [p for p in pods(cp) if p["metadata"]["labels"].get("app.kubernetes.io/component")
            == "node" and not p["metadata"].get("deletionTimestamp")]  # fmt: skip


def ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


@pytest.fixture(scope="module")
def installed(request: pytest.FixtureRequest) -> Iterator[Installed]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    binary = build_controlplane()
    tools = nodetools.NodeTools.find(binary)
    first = image.build_image()
    changed = image.build_image(tag=first.name.rsplit(":", 1)[1] + "-b",
                                labels={"gpudra.dev/build": "changed"})  # fmt: skip
    # Short: the plugin's sockets (with a pod UID in their names) must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="gdc-", dir="/tmp"))
    cp = ControlPlane(binary, workdir=root / "cp", controllers=WORKLOAD_CONTROLLERS,
                      service_accounts=True)  # fmt: skip
    real = node.RealNode(cp, NODE, FLEET, root / "n", tools, startup_timeout=WAIT)
    failed = True
    try:
        cp.start()
        sandbox, busybox = images.build(root / "images")
        real.start_host()
        real.start_runtime([sandbox, busybox])
        for built in (first, changed):
            real.import_image(built.archive)
        helm = Helm(build_helm(), root / "helm", kubeconfig=cp.kubeconfig)
        values = local_values(cp, real, first)
        failures = request.session.testsfailed
        yield Installed(cp, real, helm, values, first, changed)
        failed = request.session.testsfailed > failures
    finally:
        try:
            real.stop()
        finally:
            cp.stop()  # even when the node could not be stopped cleanly
        if failed or os.environ.get("GPUDRA_E2E_KEEP") == "1":
            print(f"chart e2e work dir kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def test_helm_installs_gpudra_as_pods_that_register_through_the_plugin_registry(
    installed: Installed,
) -> None:
    cp, real = installed.cp, installed.node
    installed.helm.run(
        "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace",
        "--wait", "--timeout", f"{int(WAIT)}s", *set_args(installed.values),
        timeout=WAIT + 60,
    )  # fmt: skip
    wanted = {"node", "publisher", "allocator", "nats", "nats-auth"}

    def all_ready() -> dict[str, dict[str, Any]] | None:
        # helm's --wait lets one node pod of a DaemonSet with maxUnavailable 1 be unready
        found = {p["metadata"]["labels"].get("app.kubernetes.io/component"): p
                 for p in pods(cp) if ready(p)}  # fmt: skip
        return found if set(found) >= wanted else None

    running = wait(installed, all_ready, f"a ready pod of each of {sorted(wanted)}")
    assert set(running) >= wanted, list(running)
    for pod in running.values():  # every one of them a pod of the gpudra image, on our node
        assert pod["spec"]["nodeName"] == NODE
        assert {c["image"] for c in pod["status"]["containerStatuses"]} == {installed.first.name}
    (pod,) = node_pods(cp)
    assert [c["name"] for c in pod["status"]["containerStatuses"]] == [
        "discovery", "kubeletplugin", "preparer"]  # fmt: skip
    # The plugin's sockets, under the kubelet's root through the hostPaths, named with
    # the pod's UID (rolling-update sockets); the kubelet registered it (the node's
    # slices exist only once the plugin is there: presence, then publish).
    uid = pod["metadata"]["uid"]
    registry = real.paths.registration_dir / f"{DRIVER}-{uid}-reg.sock"
    dra = real.paths.plugin_dir / f"dra-{uid}.sock"
    assert registry.is_socket() and dra.is_socket()  # the pod is Ready only then (its probe)
    slices = wait(installed, lambda: [
        s for s in cp.kubectl_json("get", "resourceslices")["items"]
        if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
    ] or None, "the publisher pod to publish the node's ResourceSlices")  # fmt: skip
    devices = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert {f"gpu-{i}" for i in range(8)} <= set(devices)


def _example(image_name: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return images.localize(docs, image_name)


def _claim_of(cp: ControlPlane, namespace: str, pod_name: str) -> dict[str, Any]:
    pod = cp.get("pod", pod_name, namespace)
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = cp.get("resourceclaim", status["resourceClaimName"], namespace)
    assert claim is not None
    return dict(claim)


def _gpu_uuid(cp: ControlPlane, device: str) -> str:
    for s in cp.kubectl_json("get", "resourceslices")["items"]:
        if s["spec"]["nodeName"] == NODE:
            for d in s["spec"]["devices"]:
                if d["name"] == device:
                    return str(d["attributes"]["uuid"]["string"])
    raise AssertionError(f"no device {device} in the slices of {NODE}")


def _run_gpu_pod(installed: Installed, name: str) -> tuple[str, dict[str, Any]]:
    """examples/01's pod (renamed ``name``), Running and having printed its GPUs: the
    output of ``nvidia-smi -L`` (the stand-in lists the GPUs the container sees)."""
    cp = installed.cp
    docs = _example(images.BUSYBOX_IMAGE)
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["metadata"]["name"] = name
    cp.apply(docs)
    wait(installed, lambda: (cp.get("pod", name, "single-gpu") or {}).get("status", {})
         .get("phase") == "Running", f"pod {name} Running")  # fmt: skip
    out = wait(installed, lambda: cp.kubectl("logs", "-n", "single-gpu", name) or None,
               f"pod {name}'s output")  # fmt: skip
    return out, _claim_of(cp, "single-gpu", name)


def _prepared(real: node.RealNode, uid: str) -> list[str]:
    """Where claim ``uid`` is prepared on the node: its CDI spec, gpudra's checkpoint."""
    found = []
    if cdi.spec_path(real.paths.cdi_root, uid).exists():
        found.append("cdi")
    checkpoint = real.paths.plugin_dir / "checkpoint.json"
    if checkpoint.exists() and uid in checkpoint.read_text():
        found.append("checkpoint")
    return found


def test_a_gpu_pod_runs_through_the_installed_driver_and_sees_its_gpu(
    installed: Installed,
) -> None:
    out, claim = _run_gpu_pod(installed, "cuda")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER
    uuid = _gpu_uuid(installed.cp, result["device"])
    (line,) = [ln for ln in out.splitlines() if ln.startswith("GPU ")]
    assert uuid in line, out  # its one GPU, and no other
    assert _prepared(installed.node, claim["metadata"]["uid"]) == ["cdi", "checkpoint"]


def test_helm_upgrade_to_a_changed_image_keeps_running_claims_prepared(
    installed: Installed,
) -> None:
    cp, real = installed.cp, installed.node
    before = cp.get("pod", "cuda", "single-gpu")
    claim = _claim_of(cp, "single-gpu", "cuda")
    (old,) = node_pods(cp)
    repository, tag = installed.changed.name.rsplit(":", 1)
    installed.helm.run(
        "upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values",
        "--wait", "--timeout", f"{int(WAIT)}s", *set_args({"image.tag": tag}),
        timeout=WAIT + 60,
    )  # fmt: skip

    def rolled() -> dict[str, Any] | None:
        current = node_pods(cp)
        if len(current) == 1 and current[0]["metadata"]["uid"] != old["metadata"]["uid"]:
            gone = cp.get("pod", old["metadata"]["name"], NS) is None
            return current[0] if gone and ready(current[0]) else None
        return None

    new = wait(installed, rolled, "the node pod of the changed image, the old one gone")
    assert {c["image"] for c in new["status"]["containerStatuses"]} == {f"{repository}:{tag}"}
    # The running pod was never touched; its claim is still prepared on the node.
    after = cp.get("pod", "cuda", "single-gpu")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["phase"] == "Running"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert _prepared(real, claim["metadata"]["uid"]) == ["cdi", "checkpoint"]
    # The sockets are the new pod's; the old pod's are gone. (The new pod's containers
    # may be restarting here: nats-server and the auth callout roll in the same upgrade,
    # and a bus client refused during their restart exits and is started again.)
    uid, old_uid = new["metadata"]["uid"], old["metadata"]["uid"]
    new_socket = real.paths.registration_dir / f"{DRIVER}-{uid}-reg.sock"
    wait(installed, new_socket.is_socket, "the new node pod's registration socket")
    assert not (real.paths.registration_dir / f"{DRIVER}-{old_uid}-reg.sock").exists()
    # A new pod runs through the new plugin; the old pod's claim is unprepared by it.
    out, second = _run_gpu_pod(installed, "cuda-after-upgrade")
    assert [ln for ln in out.splitlines() if ln.startswith("GPU ")], out
    cp.kubectl("delete", "pod", "-n", "single-gpu", "cuda", "--wait=false")
    wait(installed, lambda: not _prepared(real, claim["metadata"]["uid"]),
         "the old pod's claim unprepared (CDI spec and checkpoint entry gone)")  # fmt: skip
    assert _prepared(real, second["metadata"]["uid"]) == ["cdi", "checkpoint"]


def test_the_local_values_pass_helm_lint_strict(installed: Installed) -> None:
    """The values this test installs with are ones `helm lint --strict` accepts."""
    out = installed.helm.run("lint", "--strict", str(CHART), *set_args(installed.values))
    assert "0 chart(s) failed" in out and "[WARNING]" not in out
