"""The demo of ``gpudra up``: apply examples/, wait for the outcome, say what happened.

Every example file holds its namespace, claims or claim templates and pods.
A pod is expected to end Running unless it carries the annotation
``gpudra.dev/expect: Pending`` (the unsatisfiable example); for such a pod the
outcome is the allocator watcher's explanation Event on its claim.

For a Running pod the CDI device ids that kubelet-dra recorded (annotation
``gpudra.dev/cdi-devices``) are checked against the node's CDI root: each id
must name a claim of the pod and a device of the spec file the preparer wrote
for that claim, under the allocating driver's CDI kind (``gpu.nvidia.com`` or
``compute-domain.nvidia.com``: an IMEX channel claim of a ComputeDomain).

An example with a ComputeDomain needs nodes in an NVLink fabric and IMEX daemons:
``gpudra up`` adds :data:`~services.local.stack.GB200_DEMO_NODES` for it on
simulated nodes, and leaves it out on real nodes (none is in an NVLink fabric,
and their kubelet root is too long for the compute-domain driver's sockets,
docs/computedomains.md).

On real nodes (``gpudra up --real-nodes``) the pods run in real containers:
their images are replaced by the node's local image (never pulled, see
:mod:`services.local.images`), each container's ids are those of its claims'
devices (the kubelet passes them to containerd; it records none), every
container must be ready, and what it printed (the stand-in ``nvidia-smi -L``:
the GPUs it can see) is shown.

After the demo (``--exit-after-demo``) the examples are deleted and
``gpudra audit --verify`` checks that every claim's event trail is complete,
from ``allocated`` (or ``pending``) to ``deleted``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.allocator.watcher.events import COMPONENT as ALLOCATOR_COMPONENT
from services.core.bus.access import Role
from services.core.model import computedomain as cd
from services.core.model import nvidia
from services.core.telemetry import tracing
from services.local import REPO, images
from services.local.stack import DRIVER_NAMESPACE, Stack
from services.preparer import cdi
from services.preparer.computedomain import engine as cd_engine

EXAMPLES_DIR = REPO / "examples"
EXPECT_ANNOTATION = "gpudra.dev/expect"
CDI_DEVICES_ANNOTATION = "gpudra.dev/cdi-devices"
RUNNING = "Running"
PENDING = "Pending"
#: pod_claims' key for the claim of a pod's extended resources (no spec.resourceClaims entry)
EXTENDED_REF = "<extended resources>"


class ExampleError(ValueError):
    """An example file that cannot be used (names the file and what is wrong)."""


@dataclass(frozen=True)
class ExamplePod:
    namespace: str
    name: str
    expect: str  # RUNNING or PENDING


@dataclass(frozen=True)
class Example:
    path: Path
    title: str  # the header comment's first line
    text: str
    pods: tuple[ExamplePod, ...]
    domains: tuple[str, ...] = ()  # its ComputeDomains' names: it needs GB200 nodes

    @property
    def name(self) -> str:
        return self.path.name


def load_examples(directory: Path = EXAMPLES_DIR) -> list[Example]:
    """Every ``*.yaml`` in ``directory``, in name order."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise ExampleError(f"no *.yaml examples in {directory}")
    return [load_example(path) for path in files]


def gpu_only(examples: Sequence[Example]) -> list[Example]:
    """Those of ``examples`` without a ComputeDomain: what a stack of the GPU demo
    nodes (or of real nodes) runs; the others need the GB200 demo nodes."""
    return [e for e in examples if not e.domains]


def load_example(path: Path) -> Example:
    text = path.read_text()
    try:
        documents = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise ExampleError(f"{path}: not YAML: {exc}") from None
    pods: list[ExamplePod] = []
    domains: list[str] = []
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict) or "kind" not in doc:
            raise ExampleError(f"{path}: document {index + 1} is not a Kubernetes object")
        if doc["kind"] == cd.KIND:
            domains.append(str((doc.get("metadata") or {}).get("name")))
        if doc["kind"] != "Pod":
            continue
        meta = doc.get("metadata") or {}
        expect = (meta.get("annotations") or {}).get(EXPECT_ANNOTATION, RUNNING)
        if expect not in (RUNNING, PENDING):
            raise ExampleError(
                f"{path}: pod {meta.get('name')}: {EXPECT_ANNOTATION} must be "
                f"{RUNNING} or {PENDING}, got {expect!r}"
            )
        if not meta.get("namespace") or not meta.get("name"):
            raise ExampleError(f"{path}: document {index + 1}: a pod needs a namespace and name")
        pods.append(ExamplePod(meta["namespace"], meta["name"], expect))
    return Example(path, _title(text), text, tuple(pods), tuple(domains))


def _title(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


# ---- what the cluster says ------------------------------------------------------


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


def apply_examples(stack: Stack, examples: Sequence[Example]) -> None:
    """Create every example's objects; on real nodes with the local image."""
    for example in examples:
        if stack.real_nodes:
            documents = [d for d in yaml.safe_load_all(example.text) if d]
            stack.cp.apply(images.localize(documents))
        else:
            stack.cp.apply(example.text)


def delete_examples(stack: Stack, examples: Sequence[Example], timeout: float) -> None:
    """Delete the examples' namespaces and wait until their claims and pods are gone
    (each claim's trail then ends: unprepared, released, deleted); with a
    ComputeDomain among them, its IMEX daemons' pods and claims too."""
    namespaces = sorted({p.namespace for e in examples for p in e.pods})
    stack.cp.kubectl("delete", "namespace", *namespaces, "--wait=false", "--ignore-not-found")
    watched = namespaces + ([DRIVER_NAMESPACE] if any(e.domains for e in examples) else [])

    def gone() -> bool:
        for ns in watched:
            for kind in ("/api/v1/namespaces/{}/pods",
                         "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims"):  # fmt: skip
                listing = stack.api_get(kind.format(ns))
                if listing is not None and listing["items"]:
                    return False
        return True

    stack.wait_for(gone, "the examples' pods and claims to be deleted", timeout=timeout)


def audit_argv(stack: Stack, *args: str) -> list[str]:
    """``gpudra audit`` against the stack's bus, as the read-only auditor."""
    return ["gpudra", "audit", *stack.nats.client_argv(Role.AUDITOR), *args]


def verify_trail(stack: Stack, wait: float) -> tuple[bool, list[str]]:
    """``gpudra audit --verify`` (its own process): whether every claim's trail is
    complete, and what it said."""
    argv = [sys.executable, "-m", "services.cli", *audit_argv(stack, "--verify", "--wait",
                                                              str(wait))[1:]]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=wait + 60, cwd=REPO)
    return done.returncode == 0, done.stdout.splitlines() + done.stderr.splitlines()[-5:]


def wait_for_examples(stack: Stack, examples: Sequence[Example], timeout: float) -> DemoResult:
    """Poll until every pod is as expected or ``timeout`` passed; the last view."""
    started = time.monotonic()
    wanted = [(e.name, p) for e in examples for p in e.pods]
    while True:
        views = observe(stack, wanted)
        if all(v.ok for v in views) or time.monotonic() - started > timeout:
            result = DemoResult(views, time.monotonic() - started)
            if stack.real_nodes:
                for view in views:
                    view.logs = container_logs(stack, view)
            return result
        dead = stack.dead()
        if dead:
            names = ", ".join(f"{p.name} (exit {p.proc.returncode})" for p in dead)
            raise RuntimeError(f"stack processes exited during the demo: {names}")
        time.sleep(0.5)


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
            view.problems = check_cdi(view, stack.nodes[view.node].cdi_root)
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


# ---- what to print ---------------------------------------------------------------


def describe_slices(stack: Stack) -> list[str]:
    lines = ["ResourceSlices (driver gpu.nvidia.com):"]
    for name, node in stack.nodes.items():
        slices = stack.slices(name)
        kinds: dict[str, int] = {}
        for s in slices:
            for d in s["spec"].get("devices") or []:
                kind = (d.get("attributes") or {}).get("type", {}).get("string", "?")
                kinds[kind] = kinds.get(kind, 0) + 1
        detail = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        lines.append(
            f"  {name} ({node.spec.fleet}): {len(slices)} slice(s), "
            f"{sum(kinds.values())} devices ({detail})"
        )
    return lines


def describe_result(
    result: DemoResult,
    examples: Sequence[Example],
    trace_url: Callable[[str], str] | None = None,
) -> list[str]:
    """``trace_url``: where a trace id is shown (``gpudra up --jaeger``); each claim gets
    the URL of its trace."""
    lines: list[str] = []
    by_example: dict[str, list[PodView]] = {}
    for view in result.pods:
        by_example.setdefault(view.example, []).append(view)
    shown: set[str] = set()
    for example in examples:
        lines.append(f"{example.name}: {example.title}")
        for view in by_example.get(example.name, []):
            for claim in view.claims:
                key = f"{claim.namespace}/{claim.name}"
                if key in shown:
                    continue
                shown.add(key)
                lines.extend(_claim_lines(claim))
                if trace_url is not None:
                    lines.append(f"      trace: {trace_url(tracing.claim_trace_hex(claim.uid))}")
            lines.extend(_pod_lines(view))
    good, total = result.counts()
    running = sum(v.phase == RUNNING for v in result.pods)
    lines.append(f"{good}/{total} pods as expected ({running} Running) after {result.seconds:.1f}s")
    return lines


def _claim_lines(claim: ClaimView) -> list[str]:
    where = f"  claim {claim.namespace}/{claim.name}"
    if claim.devices:
        devices = ", ".join(f"{d.request}={d.pool}/{d.device}" for d in claim.devices)
        return [f"{where}: allocated {devices}"]
    if claim.explanation:
        text = claim.explanation.replace("\n", "\n      ")
        return [f"{where}: pending; gpudra explains:", f"      {text}"]
    return [f"{where}: not allocated"]


def _pod_lines(view: PodView) -> list[str]:
    pod = f"  pod {view.pod.namespace}/{view.pod.name}"
    if view.pod.expect == PENDING:
        verdict = "as expected" if view.ok else f"expected {PENDING} with an explanation"
        return [f"{pod}: {view.phase or 'absent'} ({verdict})"]
    if not view.ok:
        issue = "; ".join(view.problems) or "not prepared"
        return [f"{pod}: {view.phase or 'absent'} on {view.node or '-'} (FAILED: {issue})"]
    lines = [f"{pod}: Running on {view.node}"]
    for container, ids in sorted(view.cdi_devices.items()):
        lines.append(f"      {container}: {', '.join(ids) or '(no CDI devices)'}")
        for said in (view.logs.get(container) or "").splitlines():
            lines.append(f"        | {said}")
    return lines
