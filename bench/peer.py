"""gpudra's node path beside another DRA kubelet plugin's, like for like, in one run.

    python bench/peer.py --peer /path/to/dra-example-kubeletplugin
                         [--cycles 1000] [--concurrency 1 16] [--repeat 3]

The peer is any kubelet plugin binary with the flags of kubernetes-sigs'
dra-example-driver (``--kubeconfig``, ``--node-name``, ``--cdi-root``, the
kubelet's registrar and plugins folders, ``--num-devices``); build it yourself
from its source, nothing here fetches or builds it. gpudra runs as its node
DaemonSet does (discovery, preparer and front as separate processes, the
preparer checking claims against the API server) with nats-server beside it
(the chart runs NATS apart from the nodes), as bench/prepare.py starts them.

Like for like:

- **One real kube-apiserver** (the local control plane, services.local.cluster)
  serves both: every claim of a phase is created there, allocated to a device
  of the driver's node (each driver has a node of its own, so that gpudra's pod
  watch neither sees nor reads ahead the peer's pods) and reserved for a pod of
  its own, as the scheduler leaves them. gpudra's preparer reads claims and
  pods from it (``--kubeconfig``); the peer GETs each claim from it when the
  kubelet asks (its client's rate limit raised with ``--kube-api-qps``: at its
  default of 5 QPS each prepare waits about 200 ms for it). gpudra's claims
  also go into the claims bucket before the phase, as the allocator's watcher
  puts them there when the scheduler allocates (the preparer only compares
  them). With more workers than GPUs, gpudra's claims ask for adminAccess (in
  a namespace labelled for it) so that two may hold one GPU; the peer's share
  GPUs without it.
- **The timer starts when the pod is bound; the kubelet reads the claim before
  it calls the plugin, as the real one does.** The pods are created unscheduled
  (a schedulerName no scheduler serves); each cycle binds its pod to its node
  (``pods/binding``, as the scheduler does), and the prepare's timer starts when
  the binding returns. Then the bench's kubelet does what the kubelet's DRA
  manager does before NodePrepareResources (kubernetes v1.37.2,
  pkg/kubelet/cm/dra/manager.go, ``prepareResources``, line 250): it GETs each
  of the pod's claims from the API server with its own client (lines 296-303,
  ``m.kubeClient.ResourceV1().ResourceClaims(pod.Namespace).Get``), checks that
  the claim is reserved for the pod (lines 312-316,
  ``resourceclaim.IsReservedForPod``) and only then calls the plugin (line 425,
  ``plugin.NodePrepareResources``). Here: one GET per claim from the same
  kube-apiserver, through the bench's client, and the same check, for both
  drivers alike, inside the timer. Not done here, though the kubelet does it in
  between too: learning of the pod by its own watch and admitting it, and
  writing its claim info checkpoint (lines 382-384, ``m.cache.syncToCheckpoint()``,
  a file written with an fsync: ``tmpFile.Sync()``,
  pkg/kubelet/util/store/filestore.go line 139); on a node the plugin is called
  later still after the binding. The NodePrepareResources call alone is timed
  too and printed beside it ("prepare call"): bind -> prepared is what a pod
  waits for, the call is what the plugin costs the kubelet, and the GET hides
  nothing of the call. Chosen over moving gpudra's reads into the prepare
  because it measures gpudra as it runs (its pod watch learns of the pod as
  the kubelet does, and its read-ahead races the kubelet's GET; a prepare that
  finds no copy reads the claim itself), and it costs the peer nothing it
  would not pay on a node: both drivers' cycles bind, GET and delete alike.
- **Log levels as the charts ship them**: gpudra ``--log-level info`` (the
  chart's ``logLevel``), the peer without ``-v`` (its chart sets none: klog's
  0); both log to files, and the bytes logged per cycle are printed. Other
  settings are each binary's defaults (gpudra's claim device status: auto,
  which a claim unprepared at once never reaches; compute domains off).
- **CPU per cycle of the node's processes only**: gpudra's discovery, preparer
  and front; the peer's one process. Beside them, apart: nats-server (gpudra's;
  central in the chart, not on the node) and the API server's share during the
  phase (kube-apiserver, etcd; it includes the bench's bindings, GETs and pod
  deletions, the same for both). The bench process (kubelet, workload) is not
  counted. The API server's GETs of claims and pods per cycle come from its
  ``apiserver_request_total`` (the kubelet's GET of the claim included: 1 per
  cycle for both).
- **Footprint**: peak RSS (VmHWM) of the whole node DaemonSet (discovery +
  preparer + front) against the peer's process.
- **Durability** differs by design, and is printed with the figures, the sync
  calls per prepare or unprepare counted by strace (when installed) over ten
  untimed cycles: gpudra fsyncs nothing on the claim path
  (docs/operations.md#durability: a reboot voids prepared state, so a sync would
  only keep what is thrown away); the peer writes its whole checkpoint with an
  fsync on every prepare and unprepare under one global lock (``writeCheckpoint``
  calls ``tmp.Sync()``, cmd/dra-example-kubeletplugin/checkpoint.go;
  ``DeviceState.Prepare`` and ``Unprepare`` hold its mutex, state.go).

Both are driven by the same gRPC client (services.local.kubelet.FakeKubelet)
through their DRA sockets, one prepare then one unprepare per cycle, with the
same concurrency; their phases alternate (the order flipping each repeat), so
the machine's load weighs on both alike. Printed per phase and driver: p50/p99
of prepare (bind -> prepared, and the NodePrepareResources call alone) and
unprepare, cycles/s, CPU ms per cycle, GETs, log bytes; then the medians over
the repeats with gpudra/peer ratios, peak RSS and durability.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import prepare  # noqa: E402
from bench.prepare import Phase, Proc, cpu_seconds, pct, peak_rss_mb, report  # noqa: E402
from services.core.bus import subjects  # noqa: E402
from services.core.bus.client import Bus  # noqa: E402
from services.core.kube.client import KubeApi, http_api  # noqa: E402
from services.core.kube.resource import ResourceClaim  # noqa: E402
from services.core.kube.resourceapi import versioned  # noqa: E402
from services.core.model.nvidia import DRIVER_NAME  # noqa: E402
from services.local.cluster import ControlPlane  # noqa: E402
from services.local.kubebinary import build_controlplane  # noqa: E402
from services.local.kubelet import Claim, FakeKubelet  # noqa: E402

NODE = prepare.NODE  # gpudra's node
PEER_NODE = "bench-peer-node"  # the peer's: gpudra's pod watch does not see its pods
PEER_DRIVER = "gpu.example.com"
NO_SCHEDULER = "bench-none"  # no scheduler serves it: the bench binds the pods itself
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
SYNCS = "fsync,fdatasync,sync_file_range,syncfs,sync"  # what strace counts as syncs
_REQUESTS = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<n>[0-9.e+]+)$")


@dataclass
class Driver:
    """One driver on the bench node, its claims in the shared kube-apiserver."""

    name: str  # "gpudra" or "peer"
    kubelet: FakeKubelet
    driver: str  # its claims' device results
    node_name: str  # its node (and its pool's name)
    namespace: str
    gpus: list[str]
    procs: dict[str, int]  # its node DaemonSet's processes: CPU per cycle, peak RSS
    logs: list[Path]  # what its node processes log to
    central: dict[str, int] = field(default_factory=dict)  # off the node (nats-server)
    bus: Bus | None = None  # gpudra: the claims bucket, written as the allocator's watcher does
    admin_access: bool = False  # more workers than GPUs: claims share GPUs by adminAccess
    pods: dict[str, str] = field(default_factory=dict)  # claim uid -> uid of its pod


@dataclass
class Cluster:
    cp: ControlPlane
    api: KubeApi
    pids: dict[str, int]  # kube-apiserver, etcd


@dataclass
class Run:
    """One phase of one driver, with what it cost beside the node."""

    phase: Phase
    beside: dict[str, float]  # CPU ms per cycle: nats-server, kube-apiserver, etcd
    log_bytes: float  # what the node processes logged, per cycle


def _pod(namespace: str, name: str) -> dict[str, Any]:
    """An unscheduled pod using the claim of its own name (bound by the bench, per cycle)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulerName": NO_SCHEDULER,
                     "containers": [{"name": "main", "image": "bench",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}}  # fmt: skip


async def _claim(api: KubeApi, d: Driver, gpu: str) -> Claim:
    """A pod, and its claim allocated to ``gpu`` and reserved for it, as the scheduler leaves
    them just before it binds the pod (gpudra's also in the claims bucket)."""
    name = f"{d.name}-{uuid.uuid4().hex[:12]}"
    pods = f"/api/v1/namespaces/{d.namespace}/pods"
    claims = f"/apis/resource.k8s.io/v1/namespaces/{d.namespace}/resourceclaims"
    pod = msgspec.json.decode(await api.create(pods, _pod(d.namespace, name)))
    request: dict[str, Any] = {"deviceClassName": d.driver}
    result: dict[str, Any] = {"request": "gpu", "driver": d.driver, "pool": d.node_name,
                              "device": gpu}  # fmt: skip
    if d.admin_access:
        request["adminAccess"] = result["adminAccess"] = True
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": d.namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}  # fmt: skip
    await api.create(claims, body)
    named = {"key": "metadata.name", "operator": "In", "values": [d.node_name]}
    here = {"nodeSelectorTerms": [{"matchFields": [named]}]}
    user = {"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}
    status = {"status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": here},
                         "reservedFor": [user]}}  # fmt: skip
    answer = await api.patch(f"{claims}/{name}/status", status)
    made = msgspec.json.decode(answer, type=ResourceClaim)
    uid = made.metadata.uid or ""
    if d.bus is not None:
        await d.bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, uid), made)
    d.pods[uid] = pod["metadata"]["uid"]
    return Claim(uid, d.namespace, name)


async def _claims(api: KubeApi, d: Driver, count: int, concurrency: int) -> list[Claim]:
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> Claim:
        async with gate:
            return await _claim(api, d, d.gpus[(i % concurrency) % len(d.gpus)])

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def _remove(api: KubeApi, d: Driver, claims: list[Claim]) -> None:
    gate = asyncio.Semaphore(16)
    path = f"/apis/resource.k8s.io/v1/namespaces/{d.namespace}/resourceclaims"

    async def one(c: Claim) -> None:
        async with gate:
            await api.delete(f"{path}/{c.name}")
            d.pods.pop(c.uid, None)
            if d.bus is not None:
                await d.bus.kv_delete(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, c.uid))

    await asyncio.gather(*(one(c) for c in claims))


async def api_requests(api: KubeApi) -> dict[str, float]:
    """GETs the API server has answered so far, by resource (its apiserver_request_total)."""
    counts: dict[str, float] = {}
    for line in (await api.get("/metrics")).decode().splitlines():
        found = _REQUESTS.match(line)
        if found is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
        if labels.get("verb") == "GET" and labels.get("resource") and not labels.get("subresource"):
            counts[labels["resource"]] = counts.get(labels["resource"], 0) + float(found["n"])
    return counts


async def run_phase(cluster: Cluster, d: Driver, cycles: int, concurrency: int) -> Run:
    """One phase: the claims and their unscheduled pods made, then per cycle the pod bound,
    the claim read by the kubelet and prepared (timed from the binding's answer, the call
    alone too) and unprepared, the pod deleted."""
    api = cluster.api
    claims = await _claims(api, d, cycles, concurrency)
    plan = [claims[slot::concurrency] for slot in range(concurrency)]

    node = {"apiVersion": "v1", "kind": "Node", "name": d.node_name}

    async def bind(c: Claim) -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": c.name},
                   "target": node}  # fmt: skip
        await api.create(f"/api/v1/namespaces/{c.namespace}/pods/{c.name}/binding", binding)

    async def release(c: Claim) -> None:
        pod = f"/api/v1/namespaces/{c.namespace}/pods/{c.name}"
        await api.delete(pod, {"gracePeriodSeconds": 0})

    async def admit(c: Claim) -> None:
        """What the kubelet's DRA manager does before it calls the plugin: one GET of the
        claim, which must be reserved for the pod (see the module docstring)."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{c.namespace}/resourceclaims/{c.name}"
        claim = msgspec.json.decode(await api.get(path), type=ResourceClaim)
        users = (claim.status.reserved_for if claim.status else None) or []
        if claim.metadata.uid != c.uid or not any(u.uid == d.pods[c.uid] for u in users):
            raise RuntimeError(f"claim {c.namespace}/{c.name} is not reserved for its pod")

    gets = await api_requests(api)
    logged = sum(log.stat().st_size for log in d.logs)
    procs = {**d.procs, **d.central, **cluster.pids}
    before = {name: cpu_seconds(pid) for name, pid in procs.items()}
    phase = await prepare.timed_cycles(d.kubelet, plan, bind=bind, release=release, admit=admit)
    ms = {name: (cpu_seconds(pid) - before[name]) * 1000 / cycles for name, pid in procs.items()}
    logged = sum(log.stat().st_size for log in d.logs) - logged
    after = await api_requests(api)
    await _remove(api, d, claims)
    phase.cpu_ms_per_cycle = {name: ms[name] for name in d.procs}
    phase.api_gets = {kind: int(n - gets.get(kind, 0)) for kind, n in after.items()
                      if kind in ("resourceclaims", "pods") and n > gets.get(kind, 0)}  # fmt: skip
    return Run(phase, {name: ms[name] for name in (*d.central, *cluster.pids)}, logged / cycles)


def start_peer(binary: Path, cp: ControlPlane, root: Path, gpus: int, qps: float) -> Proc:
    """The peer's kubelet plugin for the bench node, its kubelet folders under ``root``;
    its log level its default (no -v: klog's 0, as its chart runs it)."""
    kubelet_root = root / "kubelet"
    for folder in ("plugins_registry", "plugins"):
        (kubelet_root / folder).mkdir(parents=True)
    (root / "cdi").mkdir()
    log = root / "peer.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [str(binary), "--kubeconfig", str(cp.kubeconfig), "--node-name", PEER_NODE,
             "--cdi-root", str(root / "cdi"), "--num-devices", str(gpus),
             "--kubelet-registrar-directory-path", str(kubelet_root / "plugins_registry"),
             "--kubelet-plugins-directory-path", str(kubelet_root / "plugins"),
             "--healthcheck-port", "-1", "--metrics-port", "-1",
             "--kube-api-qps", str(qps), "--kube-api-burst", str(int(qps))],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return Proc("peer", popen, log)


@contextlib.asynccontextmanager
async def cluster_stack() -> AsyncIterator[Cluster]:
    """The control plane both drivers use, with a namespace for each."""
    with ControlPlane(build_controlplane(), nodes=[NODE, PEER_NODE], verbosity=0) as cp:
        for namespace in ("bench-gpudra", "bench-peer"):
            cp.kubectl("create", "namespace", namespace)
        cp.kubectl("label", "namespace", "bench-gpudra", f"{ADMIN_ACCESS_LABEL}=true")
        api = versioned(await http_api(str(cp.kubeconfig)))
        pids = {p.name: p.proc.pid for p in cp.processes if p.name in ("kube-apiserver", "etcd")}
        try:
            yield Cluster(cp, api, pids)
        finally:
            await api.close()


async def warm_up(cluster: Cluster, d: Driver) -> None:
    warm = await run_phase(cluster, d, 20, 1)
    if warm.phase.errors:
        raise SystemExit(f"{d.name} warm-up failed: {warm.phase.errors[0]}")


@contextlib.asynccontextmanager
async def peer_stack(
    cluster: Cluster, binary: Path, gpus: int, qps: float
) -> AsyncIterator[Driver]:
    root = Path(tempfile.mkdtemp(prefix="gpudra-bench-peer-", dir="/tmp"))
    proc = start_peer(binary, cluster.cp, root, gpus, qps)
    try:
        async with FakeKubelet(root / "kubelet", driver=PEER_DRIVER) as kubelet:
            await kubelet.wait_for_registration_socket(timeout=60)
            await kubelet.register()
            names = [f"gpu-{i}" for i in range(gpus)]
            peer = Driver("peer", kubelet, PEER_DRIVER, PEER_NODE, "bench-peer", names,
                          {"plugin": proc.popen.pid}, [proc.log])  # fmt: skip
            await warm_up(cluster, peer)
            print(f"peer: {binary.name}, pid {proc.popen.pid}, {gpus} GPUs, log level: its "
                  f"default; client QPS {qps:g}")  # fmt: skip
            yield peer
    finally:
        proc.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def gpudra_stack(cluster: Cluster, fleet: str) -> AsyncIterator[Driver]:
    args = prepare.parse_args(["--fleet", fleet])
    async with prepare.node_stack(
        args, "", kubeconfig=cluster.cp.kubeconfig, log_level="info"
    ) as node:
        assert isinstance(node.caller, FakeKubelet)
        pids = node.pids
        logs = [node.front.log, node.preparer.log, node.front.log.parent / "discovery.log"]
        ours = Driver("gpudra", node.caller, DRIVER_NAME, NODE, "bench-gpudra", node.gpus,
                      {name: pids[name] for name in ("discovery", "preparer", "front")}, logs,
                      {"nats-server": pids["nats-server"]}, node.bus)  # fmt: skip
        await warm_up(cluster, ours)
        print("gpudra: log level info")
        yield ours


FIGURES: dict[str, Callable[[Run], float]] = {
    "bind->prepared p50": lambda r: pct(r.phase.prepare_ms, 50),
    "bind->prepared p99": lambda r: pct(r.phase.prepare_ms, 99),
    "prepare call p50": lambda r: pct(r.phase.call_ms, 50),
    "prepare call p99": lambda r: pct(r.phase.call_ms, 99),
    "kubelet GET p50": lambda r: pct(kubelet_get_ms(r), 50),
    "unprepare p50": lambda r: pct(r.phase.unprepare_ms, 50),
    "unprepare p99": lambda r: pct(r.phase.unprepare_ms, 99),
    "cycles/s": lambda r: r.phase.throughput,
    "node CPU ms/cyc": lambda r: sum(r.phase.cpu_ms_per_cycle.values()),
    "nats-server": lambda r: r.beside.get("nats-server", 0.0),
    "kube-apiserver": lambda r: r.beside["kube-apiserver"],
    "etcd": lambda r: r.beside["etcd"],
    "claim GETs/cyc": lambda r: r.phase.api_gets.get("resourceclaims", 0) / len(r.phase.prepare_ms),
    "pod GETs/cyc": lambda r: r.phase.api_gets.get("pods", 0) / len(r.phase.prepare_ms),
    "log bytes/cyc": lambda r: r.log_bytes,
}


def kubelet_get_ms(run: Run) -> list[float]:
    """Per cycle, the kubelet's read of the claim: bind -> prepared less the call."""
    pairs = zip(run.phase.prepare_ms, run.phase.call_ms, strict=True)
    return [whole - call for whole, call in pairs]


def print_run(run: Run, cycles: int) -> None:
    report(run.phase, cycles, shared=False)
    call = run.phase.call_ms
    print(f"  (prepare: bind -> prepared, the kubelet's claim GET included; the "
          f"NodePrepareResources call alone: p50 {pct(call, 50):6.2f} ms   p99 "
          f"{pct(call, 99):6.2f} ms   max {max(call):6.2f} ms; the kubelet's GET p50 "
          f"{pct(kubelet_get_ms(run), 50):.2f} ms)")  # fmt: skip
    beside = ", ".join(f"{name} {ms:.2f}" for name, ms in run.beside.items())
    print(f"  beside the node, CPU ms per cycle: {beside}")
    print(f"  logged by the node: {run.log_bytes:.0f} bytes per cycle")


def summary(
    ours: Mapping[int, Sequence[Run]], theirs: Mapping[int, Sequence[Run]], rss: str, sync: str
) -> None:
    print("\nmedians over the repeats; node CPU: gpudra discovery + preparer + front, the "
          "peer its process; nats-server, kube-apiserver, etcd: CPU ms per cycle beside the "
          "node")  # fmt: skip
    print(f"{'figure':<20}{'c':>4}{'gpudra':>10}{'peer':>10}{'gpudra/peer':>13}")
    for c in sorted(ours):
        for figure, value in FIGURES.items():
            a = statistics.median(value(r) for r in ours[c])
            b = statistics.median(value(r) for r in theirs[c])
            ratio = f"{a / b:>12.2f}x" if b else f"{'-':>13}"
            print(f"{figure:<20}{c:>4}{a:>10.2f}{b:>10.2f}{ratio}")
    print(rss)
    print(sync)


async def syncs_per_call(cluster: Cluster, d: Driver, cycles: int = 10) -> float | None:
    """fsync and its kin per prepare or unprepare, as strace counts them on the driver's
    node processes over ``cycles`` untimed cycles (None: no strace, or it could not attach)."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="gpudra-bench-strace-", dir="/tmp"))
    tracers = []
    for name, pid in d.procs.items():
        out = folder / f"{name}.txt"
        argv = ["-f", "-c", "-e", f"trace={SYNCS}", "-o", str(out), "-p", str(pid)]
        tracer = await asyncio.create_subprocess_exec(strace, *argv, stderr=subprocess.DEVNULL)
        tracers.append((tracer, out))
    try:
        await asyncio.sleep(1)  # attached to every thread
        if any(tracer.returncode is not None for tracer, _ in tracers):
            return None
        run = await run_phase(cluster, d, cycles, 1)
    finally:
        for tracer, _ in tracers:
            if tracer.returncode is None:
                tracer.send_signal(signal.SIGINT)
            await tracer.wait()
    calls = 0
    for _, out in tracers:  # "% time seconds usecs/call calls [errors] syscall" rows
        for row in out.read_text().splitlines() if out.exists() else []:
            fields = row.split()
            if len(fields) >= 5 and fields[-1] in SYNCS.split(",") and fields[3].isdigit():
                calls += int(fields[3])
    shutil.rmtree(folder, ignore_errors=True)
    return None if run.phase.errors else calls / (2 * cycles)


def durability(ours: float | None, theirs: float | None) -> str:
    def measured(n: float | None) -> str:
        return "not measured: no strace" if n is None else f"{n:.2f} per call, strace"

    return (
        f"durability: gpudra no fsync ({measured(ours)}; a reboot voids prepared state by "
        f"design, docs/operations.md#durability) / peer fsync per call ({measured(theirs)}; "
        "its whole checkpoint under one global lock: tmp.Sync() in writeCheckpoint, "
        "dra-example-driver cmd/dra-example-kubeletplugin/checkpoint.go)"
    )


def footprint(ours: Driver, theirs: Driver) -> str:
    sizes = {name: peak_rss_mb(pid) for name, pid in ours.procs.items()}
    node = sum(sizes.values())
    parts = " + ".join(f"{name} {mb:.1f}" for name, mb in sizes.items())
    peer = peak_rss_mb(theirs.procs["plugin"])
    central = peak_rss_mb(ours.central["nats-server"])
    return (f"peak RSS: gpudra node DaemonSet {node:.1f} MB ({parts}); peer {peer:.1f} MB; "
            f"ratio {node / peer:.2f}x (nats-server, central: {central:.1f} MB)")  # fmt: skip


async def run(args: argparse.Namespace) -> int:
    ours: dict[int, list[Run]] = {c: [] for c in args.concurrency}
    theirs: dict[int, list[Run]] = {c: [] for c in args.concurrency}
    async with cluster_stack() as cluster:
        async with gpudra_stack(cluster, args.fleet) as gpudra:
            gpus = len(gpudra.gpus)
            async with peer_stack(cluster, args.peer, gpus, args.peer_qps) as peer:
                print(f"API server: kube-apiserver pid {cluster.pids['kube-apiserver']}, "
                      f"etcd pid {cluster.pids['etcd']}")  # fmt: skip
                sync = durability(*[await syncs_per_call(cluster, d) for d in (gpudra, peer)])
                print(sync)
                for repeat in range(args.repeat):
                    for c in args.concurrency:
                        order = (gpudra, peer) if repeat % 2 == 0 else (peer, gpudra)
                        for d in order:
                            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
                            print(f"\n[{d.name}, repeat {repeat + 1}, load average {load}]")
                            d.admin_access = d is gpudra and c > gpus
                            result = await run_phase(cluster, d, args.cycles, c)
                            (ours if d is gpudra else theirs)[c].append(result)
                            print_run(result, args.cycles)
                rss = footprint(gpudra, peer)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    summary(ours, theirs, rss, sync)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", type=Path, required=True, help="the peer's kubelet plugin binary")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fleet", default="dgx-h100", help="gpudra's simulated node")
    parser.add_argument(
        "--peer-qps",
        type=float,
        default=1000.0,
        help="the peer's client QPS and burst (its default, 5, caps it at 5 prepares/s: the "
        "claim GET waits for the rate limiter; raised, its own path is measured)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(run(parse_args())))
