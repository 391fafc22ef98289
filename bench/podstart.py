"""Benchmark: the node's share of a pod start, through the real kubelet and containerd.

    python bench/podstart.py [--pods 30] [--concurrency 1,4] [--nodes 2] [--warmup 1]
                             [--idle 15]

Starts the stack ``gpudra up --real-nodes`` starts (services.local.stack, fresh, in a
temporary work directory removed after; every process stopped by PID): nats-server,
the control plane, the webhook, the publisher and the allocator, and 1 or 2 real nodes
(``gpu-node-h100`` as dgx-h100, ``gpu-node-a100`` as dgx-a100), each with containerd,
runc and the real kubelet in its own mount namespace over the simulated driver root,
and gpudra's discovery, preparer and kubelet plugin. Then, per phase, ``--pods`` pods
come and go, ``--concurrency`` at a time (each worker: create a pod, wait for Running,
delete it, wait until it and its claim are gone): one busybox container (the local
image, never pulled) with a ResourceClaim for one GPU from a ResourceClaimTemplate
(``gpu.nvidia.com``), as users write them. ``--warmup`` pods run first, not counted
(a node's first sandbox is slower).

Times are this process's ``time.monotonic()``: the create and delete calls from just
before the request; every other mark is the arrival of the watch event (pods, and
the namespace's ResourceClaims) that first showed it: the claim made from the
template, the claim allocated, the pod bound (``spec.nodeName``), Running, terminal
(phase Succeeded, after the delete), gone, the claim gone. The API's own timestamps
(``creationTimestamp``, conditions' ``lastTransitionTime``) have whole seconds only
and are not used.

The rest comes from /metrics pages: the kubelets' (HTTPS on 127.0.0.1, anonymous),
gpudra's node processes' and the API server's; histograms' ``_sum`` and ``_count``,
summed over the nodes. One pod at a time (concurrency 1) they are read before its
create, at Running and once its claim is gone, so the differences are that pod's own
figures:

- ``apiserver_admission_webhook_admission_duration_seconds{name="gpu.nvidia.com"}``:
  the API server's calls to gpudra's webhook, on the path to scheduled: the claim's
  create (by the claim controller, from the template) and its update (the scheduler's
  finalizer); counted in gpudra's share too;
- ``dra_operations_duration_seconds{operation_name="PrepareResources"}``: the kubelet's
  DRA manager preparing the pod's claims (it reads each claim from the API server,
  calls the driver, writes its checkpoint): gpudra's part of the start on the node as
  the kubelet sees it, the figure its share of create -> Running is computed from
  (alone, and with the webhook's). Inside it the
  gRPC call (``dra_grpc_operations_duration_seconds``, NodePrepareResources), in that
  the front's forwarding to the preparer (``gpudra_kubeletplugin_forward_seconds``), in
  that the preparer's work on the claim (``gpudra_preparer_claim_seconds``);
- ``kubelet_pod_start_duration_seconds``: the kubelet's first sight of the pod ->
  its status Running, on the kubelet's clock. The kubelet observes it twice per pod (at
  the first sync too, where it is the pod worker's start delay,
  ``kubelet_pod_worker_start_duration_seconds``, and microseconds more), so that delay
  is taken off. ``kubelet_runtime_operations_duration_seconds``: ``run_podsandbox``
  (containerd's sandbox: the pause container, the network namespace, CNI) and
  ``create_container`` + ``start_container``; the rest of first seen -> Running is the
  kubelet's own (admission, cgroups, volumes, status);
- on deletion, ``UnprepareResources`` (the kubelet runs it after the containers stopped
  and before the status that lets the API server remove the pod) with the same three
  inside, and ``stop_container`` + ``stop_podsandbox``.

With more than one pod at a time the node's figures are per phase only (sum over count:
means; the DRA histograms' buckets start at 0.1 s, too coarse for percentiles). Printed
per phase: p50/p99/max of every interval, gpudra's share of create -> Running, and per
node process (discovery, preparer, kubelet plugin, kubelet, containerd) its CPU per
pod, and net of its idle rate and of the /metrics reads it served (two per pod, one at
a time; both measured before the first phase: ``--idle`` seconds, then 20 reads; /proc
counts CPU in 10 ms ticks), its RSS and peak RSS. The runc shims come and go with the
pods and are not counted. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.domains import proc_usage  # noqa: E402
from bench.prepare import cpu_seconds, interrupt_on_sigterm, pct, peak_rss_mb  # noqa: E402
from services.core.kube.client import ApiError, KubeApi, http_api  # noqa: E402
from services.core.model.nvidia import DRIVER_NAME  # noqa: E402
from services.local import admission, images, nodetools  # noqa: E402
from services.local import node as nodes  # noqa: E402
from services.local.kubebinary import build_controlplane  # noqa: E402
from services.local.stack import Stack  # noqa: E402
from services.local.stacknodes import DEMO_NODES  # noqa: E402

NAMESPACE = "podstart"
TEMPLATE = "one-gpu"
LABEL = "bench=podstart"
WORKLOAD = "trap 'exit 0' TERM; sleep 3600 & wait"  # stops at once on SIGTERM
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
WAIT_S = 120.0  # for any one mark of a pod

# ---- the node's metrics ---------------------------------------------------------

#: The histograms read, by a short name: (metric, labels it must carry).
HISTOGRAMS: dict[str, tuple[str, Mapping[str, str]]] = {
    "webhook": ("apiserver_admission_webhook_admission_duration_seconds",
                {"name": admission.WEBHOOK}),
    "prepare": ("dra_operations_duration_seconds", {"operation_name": "PrepareResources"}),
    "prepare gRPC": ("dra_grpc_operations_duration_seconds",
                     {"driver_name": DRIVER_NAME, "method_name": "*/NodePrepareResources"}),
    "prepare front": ("gpudra_kubeletplugin_forward_seconds", {"op": "prepare"}),
    "prepare preparer": ("gpudra_preparer_claim_seconds", {"op": "prepare"}),
    "kubelet start": ("kubelet_pod_start_duration_seconds", {}),
    "kubelet worker start": ("kubelet_pod_worker_start_duration_seconds", {}),
    "sandbox": ("kubelet_runtime_operations_duration_seconds",
                {"operation_type": "run_podsandbox"}),
    "create container": ("kubelet_runtime_operations_duration_seconds",
                         {"operation_type": "create_container"}),
    "start container": ("kubelet_runtime_operations_duration_seconds",
                        {"operation_type": "start_container"}),
    "unprepare": ("dra_operations_duration_seconds", {"operation_name": "UnprepareResources"}),
    "unprepare gRPC": ("dra_grpc_operations_duration_seconds",
                       {"driver_name": DRIVER_NAME, "method_name": "*/NodeUnprepareResources"}),
    "unprepare front": ("gpudra_kubeletplugin_forward_seconds", {"op": "unprepare"}),
    "unprepare preparer": ("gpudra_preparer_claim_seconds", {"op": "unprepare"}),
    "stop container": ("kubelet_runtime_operations_duration_seconds",
                       {"operation_type": "stop_container"}),
    "stop sandbox": ("kubelet_runtime_operations_duration_seconds",
                     {"operation_type": "stop_podsandbox"}),
}  # fmt: skip
_FAMILIES = {metric for metric, _ in HISTOGRAMS.values()}

Sample = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


def parse(text: str) -> dict[Sample, float]:
    """The ``_sum`` and ``_count`` samples of :data:`HISTOGRAMS`' metrics in ``text``
    (the kubelet's page is large: the lines are picked before parsing)."""
    kept = []
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        base, _, suffix = name.rpartition("_")
        if suffix in ("sum", "count") and base in _FAMILIES:
            kept.append(line)
    found: dict[Sample, float] = {}
    for family in text_string_to_metric_families("\n".join(kept) + "\n"):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """``wanted`` labels present in ``labels`` (``*X``: a value ending in X)."""
    for key, value in wanted.items():
        have = labels.get(key)
        if have is None or not (have.endswith(value[1:]) if value[:1] == "*" else have == value):
            return False
    return True


@dataclass(frozen=True)
class Reading:
    """Every node's histograms at one moment, summed over the nodes."""

    samples: Mapping[Sample, float]

    def total(self, short: str, suffix: str) -> float:
        metric, wanted = HISTOGRAMS[short]
        name = f"{metric}_{suffix}"
        return sum(v for (n, labels), v in self.samples.items()
                   if n == name and matches(dict(labels), wanted))  # fmt: skip

    def since(self, before: Reading) -> dict[str, tuple[float, float]]:
        """Per histogram: (seconds, observations) added since ``before``."""
        return {
            short: (
                self.total(short, "sum") - before.total(short, "sum"),
                self.total(short, "count") - before.total(short, "count"),
            )
            for short in HISTOGRAMS
        }


class Metrics:
    """The /metrics pages of the kubelets (HTTPS, anonymous), of gpudra's node processes
    and of the API server (its calls to gpudra's webhook)."""

    def __init__(self, api: KubeApi, urls: Sequence[str]) -> None:
        self.api = api
        self.urls = list(urls)
        self.reads = 0  # so far: each costs the processes read some CPU
        self._session: aiohttp.ClientSession | None = None

    async def read(self) -> Reading:
        self.reads += 1
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=False)  # the kubelet's self-signed certificate
            self._session = aiohttp.ClientSession(connector=connector)
        pages = await asyncio.gather(self._apiserver(), *(self._get(url) for url in self.urls))
        samples: dict[Sample, float] = defaultdict(float)
        for page in pages:
            for key, value in parse(page).items():
                samples[key] += value
        return Reading(dict(samples))

    async def _apiserver(self) -> str:
        return (await self.api.get("/metrics")).decode()

    async def _get(self, url: str) -> str:
        assert self._session is not None
        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            resp.raise_for_status()
            return await resp.text()

    async def settled(self, before: Reading, counts: Mapping[str, float]) -> Reading:
        """A reading once each histogram in ``counts`` has that many more observations
        than ``before`` (at most 10 s: the kubelet may record a figure after the API
        shows its outcome)."""
        deadline = time.monotonic() + 10
        while True:
            now = await self.read()
            added = now.since(before)
            if all(added[s][1] >= c for s, c in counts.items()) or time.monotonic() > deadline:
                return now
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def metrics_urls(stack: Stack) -> list[str]:
    urls = []
    for name, real in stack.real.items():
        port = json.loads((real.root / "kubelet.yaml").read_text())["port"]
        urls.append(f"https://127.0.0.1:{port}/metrics")
        for service in ("kubeletplugin", "preparer"):
            urls.append(f"http://127.0.0.1:{stack.metrics_ports[f'{service}-{name}']}/metrics")
    return urls


# ---- what the API shows, when -----------------------------------------------------


class Timeline:
    """When each pod (by name) reached each mark, on this process's monotonic clock at
    the arrival of the watch event that first showed it."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = defaultdict(dict)
        self.node: dict[str, str] = {}
        self.changed = asyncio.Condition()

    def mark(self, pod: str, what: str, at: float) -> None:
        self.marks[pod].setdefault(what, at)

    def on_pod(self, kind: str, pod: dict[str, Any], at: float) -> None:
        name = pod["metadata"]["name"]
        node = pod["spec"].get("nodeName")
        if node:
            self.node[name] = node
            self.mark(name, "scheduled", at)
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            self.mark(name, "running", at)
        if phase in ("Succeeded", "Failed"):
            self.mark(name, "terminal", at)
        if kind == "DELETED":
            self.mark(name, "gone", at)

    def on_claim(self, kind: str, claim: dict[str, Any], at: float) -> None:
        owners = [o["name"] for o in claim["metadata"].get("ownerReferences") or []
                  if o.get("kind") == "Pod"]  # fmt: skip
        for pod in owners:
            self.mark(pod, "claim", at)
            if (claim.get("status") or {}).get("allocation"):
                self.mark(pod, "allocated", at)
            if kind == "DELETED":
                self.mark(pod, "claim gone", at)

    async def until(self, pod: str, what: str, describe: Callable[[], Any]) -> float:
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: what in self.marks[pod]), WAIT_S
                )
            except TimeoutError:
                raise SystemExit(
                    f"pod {pod}: not {what} after {WAIT_S:.0f} s: {await describe()}"
                ) from None
        return self.marks[pod][what]


async def follow(
    api: KubeApi,
    path: str,
    params: Mapping[str, str],
    handle: Callable[[str, dict[str, Any], float], None],
    timeline: Timeline,
    listed: asyncio.Event,
) -> None:
    """Watch ``path`` from now on, each event handed to ``handle`` with its arrival time."""
    rv = (await api.list(path, params)).resource_version
    listed.set()
    while True:
        try:
            async for event in api.watch(path, params, rv):
                at = time.monotonic()
                obj = json.loads(bytes(event.object))
                rv = obj["metadata"].get("resourceVersion", rv)
                if event.type == "BOOKMARK":
                    continue
                async with timeline.changed:
                    handle(event.type, obj, at)
                    timeline.changed.notify_all()
        except ApiError as exc:
            if exc.gone:
                raise
            await asyncio.sleep(0.2)  # a broken watch resumes from the last version


@contextlib.asynccontextmanager
async def watching(api: KubeApi, timeline: Timeline) -> AsyncIterator[None]:
    listed = [asyncio.Event(), asyncio.Event()]
    tasks = [
        asyncio.create_task(follow(api, PODS, {"labelSelector": LABEL}, timeline.on_pod,
                                   timeline, listed[0])),
        asyncio.create_task(follow(api, CLAIMS, {}, timeline.on_claim, timeline, listed[1])),
    ]  # fmt: skip
    try:
        await asyncio.gather(*(e.wait() for e in listed))
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- the pods -----------------------------------------------------------------------


def objects() -> list[dict[str, Any]]:
    """The namespace and the claim template every pod's claim comes from."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
         "spec": {"spec": {"devices": {"requests": [request]}}}},
    ]  # fmt: skip


def pod_body(name: str) -> dict[str, Any]:
    container = {
        "name": "c",
        "image": images.BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", WORKLOAD],
        "resources": {"claims": [{"name": "gpu"}]},
    }
    key, value = LABEL.split("=")
    claim = {"name": "gpu", "resourceClaimTemplateName": TEMPLATE}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {key: value}},
        "spec": {"containers": [container], "resourceClaims": [claim]},
    }


@dataclass
class PodRun:
    """One pod's life: its marks on the monotonic clock and, one pod at a time, the
    histograms' figures for it (seconds, :func:`per_pod`) from its create to Running
    (``start``) and from its delete to its claim gone (``stop``)."""

    name: str
    marks: Mapping[str, float] = field(default_factory=dict)  # the timeline's, by mark
    created: float = 0.0
    deleted: float = 0.0
    start: dict[str, float] = field(default_factory=dict)
    stop: dict[str, float] = field(default_factory=dict)


def per_pod(added: Mapping[str, tuple[float, float]], pods: float) -> dict[str, float]:
    """Seconds per pod of each histogram (their sum over ``pods``), and the kubelet's
    first seen -> Running: ``kubelet_pod_start_duration_seconds`` is observed twice per
    pod, at its first sync (first seen -> that sync's status) and at Running (first seen
    -> Running); the first is the pod worker's start delay
    (``kubelet_pod_worker_start_duration_seconds``) and a few microseconds more, so it
    is taken off."""
    out = {short: seconds / pods for short, (seconds, _) in added.items()}
    out["kubelet seen -> Running"] = out.pop("kubelet start") - out.pop("kubelet worker start")
    return out


class Runner:
    def __init__(self, api: KubeApi, metrics: Metrics, timeline: Timeline) -> None:
        self.api = api
        self.metrics = metrics
        self.timeline = timeline
        self.last: Reading | None = None  # one at a time: the previous pod's after

    def _describe(self, name: str) -> Callable[[], Any]:
        async def describe() -> str:
            try:
                pod = json.loads(await self.api.get(f"{PODS}/{name}"))
            except ApiError as exc:
                return str(exc)
            return json.dumps(pod.get("status"))[:2000]

        return describe

    async def cycle(self, run: PodRun, measure: bool) -> None:
        """Create -> Running -> delete -> gone, and its claim gone; with ``measure``,
        the node's figures of this pod alone (nothing else may run meanwhile)."""
        until, describe = self.timeline.until, self._describe(run.name)
        before = (self.last or await self.metrics.read()) if measure else None
        run.created = time.monotonic()
        await self.api.create(PODS, pod_body(run.name))
        await until(run.name, "running", describe)
        if before is not None:
            running = await self.metrics.settled(before, {"kubelet start": 2})
            run.start = per_pod(running.since(before), 1)
        run.deleted = time.monotonic()
        await self.api.delete(f"{PODS}/{run.name}")
        await until(run.name, "gone", describe)
        await until(run.name, "claim gone", describe)
        if before is not None:
            self.last = await self.metrics.settled(running, {"unprepare": 1})
            run.stop = per_pod(self.last.since(running), 1)

    async def phase(self, names: Sequence[str], concurrency: int) -> list[PodRun]:
        runs = [PodRun(name, self.timeline.marks[name]) for name in names]
        queue: asyncio.Queue[PodRun] = asyncio.Queue()
        for run in runs:
            queue.put_nowait(run)

        async def worker() -> None:
            while not queue.empty():
                await self.cycle(queue.get_nowait(), measure=concurrency == 1)

        self.last = None
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return runs


# ---- the node's processes -----------------------------------------------------------

GPUDRA_ON_NODE = ("discovery", "preparer", "kubeletplugin")


def node_processes(stack: Stack) -> dict[str, int]:
    """Every node process by its stack name -> PID."""
    found = {}
    for name in stack.nodes:
        for service in (*GPUDRA_ON_NODE, "kubelet", "containerd"):
            process = stack.processes.get(f"{service}-{name}")
            if process is not None:
                found[process.name] = process.pid
    return found


def cpu_now(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


@dataclass(frozen=True)
class Baseline:
    """CPU seconds of each node process per second idle, and per /metrics read."""

    idle: Mapping[str, float]
    read: Mapping[str, float]


async def baseline(pids: Mapping[str, int], metrics: Metrics, seconds: float) -> Baseline:
    """Measured while no pod comes or goes: ``seconds`` idle, then 20 reads."""
    before, started = cpu_now(pids), time.monotonic()
    await asyncio.sleep(seconds)
    after, wall = cpu_now(pids), time.monotonic() - started
    idle = {name: (after[name] - before[name]) / wall for name in pids}
    before, started = after, time.monotonic()
    for _ in range(20):
        await metrics.read()
    after, wall = cpu_now(pids), time.monotonic() - started
    read = {name: (after[name] - before[name] - idle[name] * wall) / 20 for name in pids}
    return Baseline(idle, read)


# ---- the report -----------------------------------------------------------------------

#: The histograms' figures, as printed: (label, the per-pod figures added together).
SCHEDULING_FIGURES = (("  webhook calls (gpudra)", ("webhook",)),)
START_FIGURES = (
    ("kubelet: first seen -> Running", ("kubelet seen -> Running",)),
    ("  PrepareResources (gpudra)", ("prepare",)),
    ("    NodePrepareResources gRPC", ("prepare gRPC",)),
    ("    front: forward to preparer", ("prepare front",)),
    ("    preparer: the claim", ("prepare preparer",)),
    ("  RunPodSandbox", ("sandbox",)),
    ("  CreateContainer + StartContainer", ("create container", "start container")),
)
STOP_FIGURES = (
    ("UnprepareResources (gpudra)", ("unprepare",)),
    ("  NodeUnprepareResources gRPC", ("unprepare gRPC",)),
    ("  front: forward to preparer", ("unprepare front",)),
    ("  preparer: the claim", ("unprepare preparer",)),
    ("StopContainer + StopPodSandbox", ("stop container", "stop sandbox")),
)


def ms(values: Sequence[float]) -> str:
    """p50 / p99 / max of seconds, in ms (one value: itself)."""
    v = sorted(values)
    if not v:
        return "-"
    p50, p99 = (v[0], v[0]) if len(v) == 1 else (pct(v, 50), pct(v, 99))
    return f"p50 {p50 * 1e3:7.1f}  p99 {p99 * 1e3:7.1f}  max {v[-1] * 1e3:7.1f} ms"


def interval(runs: Sequence[PodRun], first: str, last: str) -> list[float]:
    """Seconds from mark ``first`` (or the create/delete call) to mark ``last``."""
    out = []
    for run in runs:
        marks = {"created": run.created, "deleted": run.deleted, **run.marks}
        if first in marks and last in marks:
            out.append(marks[last] - marks[first])
    return out


def figure(runs: Sequence[PodRun], shorts: Sequence[str], stop: bool = False) -> list[float]:
    """Per pod, the figures ``shorts`` of its start (or ``stop``) added together (s)."""
    return [sum((run.stop if stop else run.start)[s] for s in shorts) for run in runs
            if run.start]  # fmt: skip


@dataclass
class Phase:
    runs: list[PodRun]
    concurrency: int
    wall: float  # seconds
    means: dict[str, float]  # the node's figures over the phase, seconds per pod
    cpu: dict[str, float]  # CPU seconds of each node process over the phase
    reads: int  # of the node's /metrics during the phase
    base: Baseline
    nodes: Mapping[str, str]  # pod -> the node it ran on


def report(phase: Phase, pids: Mapping[str, int]) -> None:
    runs, n = phase.runs, len(phase.runs)
    one_by_one = all(run.start for run in runs)
    on = Counter(phase.nodes[run.name] for run in runs)
    where = ", ".join(f"{count} on {node}" for node, count in sorted(on.items()))
    print(f"\n{n} pods, {phase.concurrency} at a time ({where}): {phase.wall:.1f} s, "
          f"{n / phase.wall:.2f} pods/s; load average {os.getloadavg()[0]:.1f}")  # fmt: skip

    def row(label: str, values: Sequence[float]) -> None:
        print(f"  {label:<44} {ms(values)}  (n={len(values)})")

    def figure_rows(figures: Sequence[tuple[str, Sequence[str]]], indent: str, stop: bool) -> None:
        for label, shorts in figures:
            if one_by_one:
                row(indent + label, figure(runs, shorts, stop))
            else:
                mean = sum(phase.means[s] for s in shorts)
                note = ", the deletes' too" if "webhook" in shorts else ""
                print(f"  {indent + label:<44} mean {mean * 1e3:7.1f} ms (the phase's histograms"
                      f"{note})")  # fmt: skip

    def minus(a: Sequence[float], b: Sequence[float]) -> list[float]:
        return [x - y for x, y in zip(a, b, strict=True)]

    running = interval(runs, "created", "running")
    row("create -> Running", running)
    row("  create -> scheduled (bound)", interval(runs, "created", "scheduled"))
    row("    create -> claim from the template", interval(runs, "created", "claim"))
    row("    claim -> allocated", interval(runs, "claim", "allocated"))
    row("    allocated -> bound", interval(runs, "allocated", "scheduled"))
    figure_rows(SCHEDULING_FIGURES, "  ", False)
    node = interval(runs, "scheduled", "running")
    row("  scheduled -> Running (the node)", node)
    figure_rows(START_FIGURES, "    ", False)
    if one_by_one:
        seen = figure(runs, ["kubelet seen -> Running"])
        parts = ["prepare", "sandbox", "create container", "start container"]
        row("      the kubelet's own (the rest)", minus(seen, figure(runs, parts)))
        row("    bound -> kubelet, Running -> watch", minus(node, seen))
    row("delete -> gone", interval(runs, "deleted", "gone"))
    row("  delete -> terminal (phase Succeeded)", interval(runs, "deleted", "terminal"))
    row("  terminal -> gone", interval(runs, "terminal", "gone"))
    row("  delete -> claim gone", interval(runs, "deleted", "claim gone"))
    figure_rows(STOP_FIGURES, "  ", True)
    if one_by_one:
        prepare, webhook = figure(runs, ["prepare"]), figure(runs, ["webhook"])
        for what, part in (
            ("PrepareResources", prepare),
            ("PrepareResources + webhook", [p + w for p, w in zip(prepare, webhook, strict=True)]),
        ):
            shares = [p / r for p, r in zip(part, running, strict=True)]
            print(f"  gpudra's share of create -> Running, {what}: p50 "
                  f"{pct(shares, 50) * 100:.1f}%, p99 {pct(shares, 99) * 100:.1f}%, "
                  f"all pods {sum(part) / sum(running) * 100:.1f}%")  # fmt: skip
    elif running:
        mean = statistics.mean(running)
        print(f"  gpudra's share of create -> Running, means: PrepareResources "
              f"{phase.means['prepare'] / mean * 100:.1f}%, + webhook "
              f"{(phase.means['prepare'] + phase.means['webhook']) / mean * 100:.1f}%")  # fmt: skip
    print(f"  {'node process':<32} {'CPU ms/pod':>10} {'net':>6} {'idle ms/s':>9} "
          f"{'ms/read':>7} {'RSS MiB':>8} {'peak MiB':>9}")  # fmt: skip
    for name, pid in pids.items():
        cpu, idle, read = phase.cpu[name], phase.base.idle[name], phase.base.read[name]
        net = cpu - idle * phase.wall - read * phase.reads
        _, rss = proc_usage(pid)
        print(f"  {name:<32} {cpu * 1e3 / n:>10.1f} {net * 1e3 / n:>6.1f} {idle * 1e3:>9.1f} "
              f"{read * 1e3:>7.1f} {rss / 1024:>8.1f} {peak_rss_mb(pid):>9.1f}")  # fmt: skip


async def measure(stack: Stack, args: argparse.Namespace) -> None:
    api = await http_api(str(stack.cp.kubeconfig))
    metrics = Metrics(api, metrics_urls(stack))
    pids = node_processes(stack)
    try:
        timeline = Timeline()
        async with watching(api, timeline):
            runner = Runner(api, metrics, timeline)
            if args.warmup:
                await runner.phase([f"warmup-{i}" for i in range(args.warmup)], 1)
            base = await baseline(pids, metrics, args.idle)
            for concurrency in args.concurrency:
                names = [f"c{concurrency}-{i:03d}" for i in range(args.pods)]
                cpu_before, reads, started = cpu_now(pids), metrics.reads, time.monotonic()
                before = await metrics.read()
                runs = await runner.phase(names, concurrency)
                cpu_after, wall = cpu_now(pids), time.monotonic() - started
                reads = metrics.reads - reads
                counts = {"kubelet start": 2 * len(names), "unprepare": len(names)}
                added = (await metrics.settled(before, counts)).since(before)
                cpu = {name: cpu_after[name] - cpu_before[name] for name in pids}
                means = per_pod(added, len(names))
                phase = Phase(runs, concurrency, wall, means, cpu, reads, base, timeline.node)
                report(phase, pids)
                dead = stack.dead()
                if dead:
                    raise SystemExit(f"stack processes died: {[p.name for p in dead]}")
    finally:
        await metrics.close()
        await api.close()


@contextlib.contextmanager
def real_stack(count: int) -> Iterator[Stack]:
    """The stack of ``gpudra up --real-nodes`` with its first ``count`` nodes; every
    process stopped by PID and the work directory removed after."""
    binary = build_controlplane()
    tools = nodetools.NodeTools.find(binary, hooks_from=binary)
    stack = Stack(DEMO_NODES[:count], binary=binary, real_nodes=True, node_tools=tools,
                  webhook=True)  # fmt: skip
    try:
        stack.start()
        stack.cp.apply(objects())
        yield stack
    finally:
        stack.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=30, help="pods per phase (default 30)")
    parser.add_argument(
        "--concurrency", default="1,4", help="comma-separated: a phase each (default 1,4)"
    )
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=2)
    parser.add_argument("--warmup", type=int, default=1, help="pods first, not counted")
    parser.add_argument(
        "--idle", type=float, default=15.0, help="seconds of idle CPU measured first (default 15)"
    )
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    reason = nodes.unavailable()
    if reason is not None:  # a benchmark of `make bench`: says why, fails nothing
        print(f"podstart: nothing measured: real nodes cannot run here: {reason}")
        return
    interrupt_on_sigterm()  # stopped: the stack too, by PID
    started = time.monotonic()
    try:
        with real_stack(args.nodes) as stack:
            print(f"stack up in {time.monotonic() - started:.1f} s: Kubernetes "
                  f"{stack.cp.kube_version}, real nodes {', '.join(stack.nodes)} (containerd, "
                  f"runc, the kubelet); times on this process's monotonic clock, at each "
                  f"watch event's arrival", flush=True)  # fmt: skip
            asyncio.run(measure(stack, args))
    except KeyboardInterrupt as stop:
        raise SystemExit(f"podstart: {stop or 'SIGINT'}: stopped, and the stack with it") from None


if __name__ == "__main__":
    main()
