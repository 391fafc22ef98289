"""What the cluster says about the demo's pods: their phase, claims, devices and the
CDI ids they got, checked against the CDI specs the preparer wrote.

A Running pod's CDI ids (kubelet-dra records them in ``gpudra.dev/cdi-devices``; on
real nodes they are worked out from its claims, as the kubelet hands them to
containerd) must each name a device of one of the pod's claims, defined in the
spec file of that claim under the allocating driver's CDI kind. A pending pod's
claims must carry the allocator watcher's explanation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.allocator.watcher.events import COMPONENT as ALLOCATOR_COMPONENT
from services.core.model import computedomain as cd
from services.core.model import nvidia
from services.local.demoexamples import PENDING, RUNNING, ExamplePod
from services.local.stack import Stack
from services.preparer import cdi
from services.preparer.computedomain import engine as cd_engine

CDI_DEVICES_ANNOTATION = "gpudra.dev/cdi-devices"
#: pod_claims' key for the claim of a pod's extended resources (no spec.resourceClaims entry)
EXTENDED_REF = "<extended resources>"


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None = None  # a consumable share of the device (KEP-5075)
    driver: str = nvidia.DRIVER_NAME


#: Each driver's CDI kind and the path of the spec its preparer writes for a claim.
CDI_KINDS: dict[str, tuple[str, Callable[[Path, str], Path]]] = {
    nvidia.DRIVER_NAME: (cdi.KIND, cdi.spec_path),
    cd.CD_DRIVER: (cd_engine.KIND, cd_engine.spec_path),
}


def device_id(claim_uid: str, device: AllocatedDevice) -> str:
    """The CDI id the kubelet hands the runtime for ``device`` of a claim."""
    kind = CDI_KINDS[device.driver][0]
    return f"{kind}={cdi.device_name(claim_uid, device.device, device.share_id)}"


@dataclass
class ClaimView:
    namespace: str
    name: str
    uid: str
    devices: list[AllocatedDevice] = field(default_factory=list)
    reserved_for: list[str] = field(default_factory=list)  # pod names
    explanation: str = ""  # our Warning Event's message, for a pending claim

    @classmethod
    def of(cls, claim: Mapping[str, Any]) -> ClaimView:
        meta, status = claim["metadata"], claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            devices=[
                AllocatedDevice(
                    r["request"],
                    r["pool"],
                    r["device"],
                    r.get("shareID"),
                    r.get("driver", nvidia.DRIVER_NAME),
                )
                for r in results
            ],
            reserved_for=[r.get("name", "") for r in status.get("reservedFor") or []],
        )


@dataclass
class PodView:
    pod: ExamplePod
    example: str
    phase: str = ""
    node: str = ""
    cdi_devices: dict[str, list[str]] = field(default_factory=dict)  # container -> ids
    claims: list[ClaimView] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what the CDI check found
    ready: bool = True  # every container ready (real nodes; kubelet-dra runs none)
    logs: dict[str, str] = field(default_factory=dict)  # container -> output (real nodes)

    @property
    def ok(self) -> bool:
        if self.pod.expect == RUNNING:
            return (
                self.phase == RUNNING
                and self.ready
                and bool(self.cdi_devices)
                and not self.problems
            )
        # No claim seen yet (a template's claim not made yet) explains nothing.
        explained = bool(self.claims) and all(c.explanation for c in self.claims)
        return self.phase != RUNNING and explained


@dataclass
class DemoResult:
    pods: list[PodView]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.pods)

    def counts(self) -> tuple[int, int]:
        """(pods as expected, pods)."""
        return sum(p.ok for p in self.pods), len(self.pods)


def observe(stack: Stack, wanted: Sequence[tuple[str, ExamplePod]]) -> list[PodView]:
    """One look at the pods of ``wanted``, their claims, events and CDI files."""
    pods = {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p
        for p in stack.api_get("/api/v1/pods")["items"]
    }
    claims = {
        (c["metadata"]["namespace"], c["metadata"]["name"]): c
        for c in stack.api_get("/apis/resource.k8s.io/v1/resourceclaims")["items"]
    }
    explanations: dict[str, dict[str, str]] = {}  # namespace -> claim uid -> message
    views = []
    for example, want in wanted:
        view = PodView(want, example)
        views.append(view)
        pod = pods.get((want.namespace, want.name))
        if pod is None:
            continue
        status = pod.get("status") or {}
        view.phase = status.get("phase", "")
        view.node = pod["spec"].get("nodeName", "")
        annotation = (pod["metadata"].get("annotations") or {}).get(CDI_DEVICES_ANNOTATION)
        view.cdi_devices = json.loads(annotation) if annotation else {}
        by_ref: dict[str, ClaimView] = {}
        for ref, name in pod_claims(pod).items():
            claim = claims.get((want.namespace, name))
            if claim is not None:
                by_ref[ref] = ClaimView.of(claim)
                view.claims.append(by_ref[ref])
        if stack.real_nodes and view.phase == RUNNING:
            view.cdi_devices = container_cdi_ids(pod, by_ref)
            statuses = status.get("containerStatuses") or []
            view.ready = bool(statuses) and all(c.get("ready") for c in statuses)
        if want.expect == PENDING:
            if want.namespace not in explanations:
                explanations[want.namespace] = our_explanations(stack, want.namespace)
            for c in view.claims:
                c.explanation = explanations[want.namespace].get(c.uid, "")
        elif view.cdi_devices and view.node in stack.nodes:
            view.problems = check_cdi(view, stack.nodes[view.node].paths.cdi_root)
    return views


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaim names a pod uses: named claims, and those generated
    from templates (reported in the pod's status)."""
    return list(pod_claims(pod).values())


def pod_claims(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim references (``spec.resourceClaims[].name``) -> ResourceClaim name,
    plus, under :data:`EXTENDED_REF`, the claim the scheduler made for the pod's
    extended resources (``nvidia.com/gpu`` limits, gate DRAExtendedResource)."""
    status = pod.get("status") or {}
    generated = {
        s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    found = {}
    for ref in pod["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        if name:
            found[ref["name"]] = name
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        found[EXTENDED_REF] = extended
    return found


def container_cdi_ids(
    pod: Mapping[str, Any], claims: Mapping[str, ClaimView]
) -> dict[str, list[str]]:
    """What each container gets, as the kubelet hands it to the runtime: the CDI id
    of every device allocated for the requests it names (all of the claim's devices
    when it names none); ``claims`` by the pod's claim reference."""
    spec = pod["spec"]
    out: dict[str, list[str]] = {}
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        ids = []
        for use in (container.get("resources") or {}).get("claims") or []:
            claim = claims.get(use["name"])
            if claim is None:
                continue
            for d in claim.devices:
                if use.get("request") in (None, "", d.request.split("/")[0]):
                    ids.append(device_id(claim.uid, d))
        extended = claims.get(EXTENDED_REF)
        for mapping in ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
            "requestMappings"
        ) or []:
            if extended is not None and mapping.get("containerName") == container["name"]:
                ids += [
                    device_id(extended.uid, d)
                    for d in extended.devices
                    if d.request == mapping.get("requestName")
                ]
        out[container["name"]] = sorted(ids)
    return out


def container_logs(stack: Stack, view: PodView) -> dict[str, str]:
    """What each container of a running pod printed (``kubectl logs``)."""
    if view.phase != RUNNING:
        return {}
    logs = {}
    for container in view.cdi_devices:
        logs[container] = stack.cp.kubectl(
            "logs", "-n", view.pod.namespace, view.pod.name, "-c", container, check=False
        ).strip()
    return logs


def our_explanations(stack: Stack, namespace: str) -> dict[str, str]:
    """claim uid -> message of the allocator watcher's Event on it."""
    events = stack.api_get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return {
        e["involvedObject"].get("uid", ""): e.get("message", "")
        for e in events
        if e["involvedObject"].get("kind") == "ResourceClaim"
        and (e.get("source") or {}).get("component") == ALLOCATOR_COMPONENT
    }


def check_cdi(view: PodView, cdi_root: Path) -> list[str]:
    """Each recorded CDI id names a device of one of the pod's claims, and the
    preparer's spec file for that claim defines it."""
    expected = {
        device_id(c.uid, d): (c, d.driver) for c in view.claims for d in c.devices
    }  # id -> claim, driver
    problems = []
    for container, ids in sorted(view.cdi_devices.items()):
        for an_id in ids:
            found = expected.get(an_id)
            if found is None:
                problems.append(f"{container}: {an_id} is no device of the pod's claims")
                continue
            claim, driver = found
            path = CDI_KINDS[driver][1](cdi_root, claim.uid)
            try:
                spec = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                problems.append(f"{container}: {an_id}: no readable CDI spec {path}: {exc}")
                continue
            names = {d.get("name") for d in spec.get("devices") or []}
            vendor_class, _, device = an_id.partition("=")
            if spec.get("kind") != vendor_class or device not in names:
                problems.append(f"{container}: {an_id} is not defined in {path}")
    return problems
