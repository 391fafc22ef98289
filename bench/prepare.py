"""Claim-path benchmark: kubelet socket -> front -> NATS -> preparer, and back.

    python bench/prepare.py [--cycles 2000] [--concurrency 1 16] [--repeat 3] [--fleet dgx-h100]
    python bench/prepare.py --sink --pairs 10 --cycles 500   # tracing overhead, on/off
    python bench/prepare.py --compare main --pairs 6 --cycles 500  # this tree against main
    python bench/prepare.py --shares --cycles 500            # a 10Gi share vs a whole GPU
    python bench/prepare.py --status-pairs 6 --cycles 500    # claim device status, on/off


Starts a nats-server, ``gpudra discovery --fleet`` (simulated GPUs),
``gpudra preparer`` (checkpoint and CDI writes as in production) and
``gpudra kubeletplugin`` as separate processes, registers like the kubelet,
then runs prepare+unprepare cycles of single-GPU claims through the real DRA
socket. Prints per phase: p50/p99 latency of NodePrepareResources and
NodeUnprepareResources as the kubelet sees it, prepares/s, and the peak RSS
(VmHWM) of the front and the preparer. With ``--repeat N`` each phase runs N
times and the median of each figure is printed too (the machine is shared:
one run says little). CPU milliseconds per cycle of the front, the preparer,
nats-server and discovery are printed per phase: they move much less with the
load of other processes than latencies do.

Claims are put into the ``claims`` bucket before timing starts, as the
allocator's watcher would, and into an in-memory API server
(``services.local.apiserver``, in this process), each reserved for a pod bound
to the node: the preparer checks every claim and its pod against it, as in a
cluster. Timing starts once the preparer has read the claims of the new pods
ahead (its pod watch), as it would while the kubelet starts a pod; with
``--trust-claims-bucket`` it reads the bucket alone (no checks against the API).
Tracing is off unless ``--otlp-endpoint`` or ``--jaeger`` gives a sink; with
``--pairs N`` two nodes run side by side, one with tracing off and one with it
on (each its own nats-server and processes), and every pair is one phase on each,
back to back (the order alternating), so that the machine's load, which swings
over minutes on a shared machine, weighs on both halves of a pair alike. It
prints the on/off ratio of each figure per pair and the median over the pairs:
the figure to judge tracing's cost by.

``--compare REV`` does the same for two commits: REV is checked out in a
temporary ``git worktree`` and its processes run from there (with this tree's
virtual environment), this tree's beside them, tracing off on both; each pair
runs the same seeded workload (``--seed``: claim UIDs and GPUs) on both nodes,
and the ratios printed are this tree's figures over REV's. The load average is
printed with each pair: on a shared machine, trust the ratios and the CPU
milliseconds per cycle more than absolute latencies.

With ``--shares`` the preparer runs with ``ConsumableShares`` and
``--consumable-shares memory``, and every phase runs twice, with whole-GPU
claims and with claims for a 10Gi share of a GPU (a ``shareID`` and its
``consumedCapacity``, as the scheduler allocates them): the share's figures
include its checks, its GPU's MPS daemon (started by the first share, stopped
by the last) and its MPS limits in the CDI spec.

``--status-pairs N`` runs two nodes of this tree the same way: one whose in-memory
API server answers ``/version`` (1.37) and takes claim status patches, so its
preparer writes every prepared claim's ``status.devices`` in the background and
removes them at unprepare (services/preparer/devicestatus.py), and one without,
whose preparer writes nothing; the ratios are on/off. The API server runs in the
bench process, beside the kubelet's client: its share of the status writes' cost
lands in the bench's CPU column, not the preparer's.

A node has as many GPUs as its fleet (8 for dgx-h100); when more workers than
GPUs run at once, claims carry adminAccess so that two in-flight claims may
hold the same GPU (the preparer does the same work either way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the fake kubelet lives in tests/helpers

from services.core.bus import subjects  # noqa: E402
from services.core.bus.access import Identity, Role  # noqa: E402
from services.core.bus.client import Bus  # noqa: E402
from services.core.kube.resource import (  # noqa: E402
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimConsumerReference,
    ResourceClaimSpec,
    ResourceClaimStatus,
)
from services.core.model.nvidia import DRIVER_NAME, gpu_device_name  # noqa: E402
from services.core.model.schemas import ClaimRef, NodeInventory, NodeReply, NodeRequest  # noqa: E402
from services.local.apiserver import MemoryApiServer, Obj, pod_object  # noqa: E402
from services.local.jaeger import Jaeger  # noqa: E402
from services.local.kubelet import Claim, FakeKubelet  # noqa: E402
from services.local.natsserver import NatsServer  # noqa: E402

NODE = "bench-node"
STATUS_VERSION = "v1.37.2"  # --status-pairs: a release whose claims take status.devices


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.popen.pid)

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise SystemExit(f"{self.name} exited {self.popen.returncode}:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def interrupt_on_sigterm() -> None:
    """SIGTERM (``timeout``, a CI's stop) as Ctrl-C: the bench's ``finally`` blocks run
    and stop what it started, by PID, instead of leaving it behind."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(
    root: Path, name: str, *args: str, otlp: str = "", repo: Path = REPO, log_level: str = "warning"
) -> Proc:
    """``otlp``: tracing on, spans exported there (tracing off without it); ``repo``:
    the tree whose code runs (another commit's worktree for ``--compare``); ``log_level``:
    its ``--log-level`` (the chart's default is info; warning here keeps logs out of the
    figures, bench/peer.py runs info)."""
    log = root / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if otlp:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "services.cli", name, "--node-name", NODE,
             "--log-level", log_level, *args],
            cwd=repo, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    return Proc(name, popen, log)


SHARE_MEMORY = "10Gi"


def claim(uid: str, gpu: str, admin: bool, pod: Obj, share: bool = False) -> ResourceClaim:
    result = DeviceRequestAllocationResult(
        request="gpu",
        driver=DRIVER_NAME,
        pool=NODE,
        device=gpu,
        admin_access=(admin and not share) or None,
        share_id=str(uuid.uuid4()) if share else None,
        consumed_capacity={"memory": SHARE_MEMORY} if share else None,
    )
    user = ResourceClaimConsumerReference(
        resource="pods", name=pod["metadata"]["name"], uid=pod["metadata"]["uid"]
    )
    return ResourceClaim(
        metadata=ObjectMeta(name=f"bench-{uid[:8]}", namespace="bench", uid=uid),
        spec=ResourceClaimSpec(),
        status=ResourceClaimStatus(
            allocation=AllocationResult(devices=DeviceAllocationResult(results=[result])),
            reserved_for=[user],
        ),
    )


async def wait_for_inventory(bus: Bus, proc: Proc) -> NodeInventory:
    for _ in range(300):
        proc.check_alive()
        found = await bus.kv_get(
            subjects.INVENTORY_BUCKET, subjects.inventory_key(NODE), NodeInventory
        )
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise SystemExit("discovery published no inventory within 30 s")


async def wait_for_preparer(kubelet: FakeKubelet, proc: Proc) -> None:
    """Ready once an unprepare of an unknown claim succeeds through the whole path."""
    probe = Claim(str(uuid.uuid4()), "bench", "probe")
    for _ in range(300):
        proc.check_alive()
        if (await kubelet.unprepare([probe], timeout=2))[probe.uid] == "":
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"the preparer did not answer within 30 s:\n{proc.log.read_text()}")


class Caller(Protocol):
    async def prepare(self, claims: Sequence[Claim]) -> Mapping[str, Any]: ...
    async def unprepare(self, claims: Sequence[Claim]) -> Mapping[str, str]: ...


class DirectCaller:
    """What the front does, done here: one NATS request per call (``--direct``)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def _call(self, op: str, claims: Sequence[Claim]) -> NodeReply:
        subject = (subjects.node_prepare if op == "prepare" else subjects.node_unprepare)(NODE)
        refs = [ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name) for c in claims]
        request = NodeRequest(node=NODE, claims=refs, deadline=time.time() + 45)
        return await self.bus.request(subject, request, NodeReply, timeout=45)

    async def prepare(self, claims: Sequence[Claim]) -> Mapping[str, Any]:
        return (await self._call("prepare", claims)).claims

    async def unprepare(self, claims: Sequence[Claim]) -> Mapping[str, str]:
        return {uid: r.error for uid, r in (await self._call("unprepare", claims)).claims.items()}


@dataclass
class Phase:
    concurrency: int
    prepare_ms: list[float]
    unprepare_ms: list[float]
    seconds: float
    errors: list[str]
    cpu_ms_per_cycle: dict[str, float] = field(default_factory=dict)
    api_gets: dict[str, int] = field(default_factory=dict)  # answered during the phase
    call_ms: list[float] = field(default_factory=list)  # NodePrepareResources alone

    @property
    def throughput(self) -> float:
        return len(self.prepare_ms) / self.seconds


async def run_phase(
    kubelet: Caller,
    bus: Bus,
    api: MemoryApiServer,
    gpus: list[str],
    cycles: int,
    concurrency: int,
    rng: random.Random | None = None,
    shares: bool = False,
    hold_s: float = 0.0,
) -> Phase:
    """``rng``: where claim UIDs and GPU choices come from (seeded: the same workload);
    ``hold_s``: how long each claim stays prepared before its unprepare (untimed)."""
    rng = rng or random.Random()
    admin = concurrency > len(gpus)
    plan: list[list[Claim]] = [[] for _ in range(concurrency)]
    read_ahead = api.served["claim"] + cycles
    offset = rng.randrange(len(gpus))
    for i in range(cycles):
        slot = i % concurrency
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pod = pod_object(f"bench-{uid[:8]}", "bench", NODE, [f"bench-{uid[:8]}"])
        rc = claim(uid, gpus[(slot + offset) % len(gpus)], admin, pod, shares)
        api.put_claim(rc)
        api.put_pod(pod)
        await bus.kv_put(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, uid), rc)
        plan[slot].append(Claim(uid, "bench", rc.metadata.name))
    if api.started:
        await api.wait_served("claim", read_ahead, timeout=120)
    phase = await timed_cycles(kubelet, plan, hold_s)
    # The pods are gone: the allocator's watcher drops the claims from the bucket.
    for claims in plan:
        for c in claims:
            await bus.kv_delete(subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, c.uid))
            api.delete_pod("bench", c.name)
            api.delete_claim("bench", c.name)
    return phase


Hook = Callable[[Claim], Awaitable[None]]


async def timed_cycles(
    kubelet: Caller,
    plan: list[list[Claim]],
    hold_s: float = 0.0,
    bind: Hook | None = None,
    release: Hook | None = None,
    admit: Hook | None = None,
) -> Phase:
    """One worker per list of ``plan``: each claim prepared, then unprepared, timed (held
    ``hold_s`` in between, untimed: a pod's life). ``bind``, awaited before each prepare,
    and ``release``, after each unprepare, are untimed (bench/peer.py: the claim's pod is
    bound to the node, the prepare's timer starts when the binding returns; the pod is
    deleted); their time still counts in the phase's seconds. ``admit``, awaited inside
    the prepare's timer just before the call, is what the kubelet does between the pod's
    binding and NodePrepareResources (bench/peer.py: it GETs the claim); the call alone
    is timed too (``call_ms``)."""
    prepare_ms: list[float] = []
    unprepare_ms: list[float] = []
    call_ms: list[float] = []
    errors: list[str] = []

    async def worker(claims: list[Claim]) -> None:
        for c in claims:
            if bind is not None:
                await bind(c)
            t0 = time.perf_counter()
            if admit is not None:
                await admit(c)
            called = time.perf_counter()
            result = (await kubelet.prepare([c]))[c.uid]
            t1 = time.perf_counter()
            prepare_ms.append((t1 - t0) * 1000)
            call_ms.append((t1 - called) * 1000)
            if hold_s:
                await asyncio.sleep(hold_s)
                t1 = time.perf_counter()  # the unprepare is timed on its own
            error = (await kubelet.unprepare([c]))[c.uid]
            unprepare_ms.append((time.perf_counter() - t1) * 1000)
            if release is not None:
                await release(c)
            if result.error or len(result.devices) != 1 or error:
                errors.append(result.error or error or f"{len(result.devices)} devices")

    started = time.perf_counter()
    await asyncio.gather(*(worker(claims) for claims in plan))
    seconds = time.perf_counter() - started
    return Phase(len(plan), prepare_ms, unprepare_ms, seconds, errors, call_ms=call_ms)


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def report(phase: Phase, cycles: int, shared: bool) -> None:
    note = " (adminAccess: workers share GPUs)" if shared else ""
    print(f"concurrency {phase.concurrency}{note}: {cycles} prepare+unprepare cycles")
    for name, values in (("prepare", phase.prepare_ms), ("unprepare", phase.unprepare_ms)):
        print(
            f"  {name:<9} p50 {pct(values, 50):6.2f} ms   p99 {pct(values, 99):6.2f} ms   "
            f"max {max(values):6.2f} ms"
        )
    print(
        f"  throughput {phase.throughput:7.1f} prepares/s (each with its unprepare), "
        f"{phase.seconds:.1f} s"
    )
    cpu = ", ".join(f"{name} {ms:.2f}" for name, ms in phase.cpu_ms_per_cycle.items())
    print(f"  CPU ms per cycle: {cpu}")
    if phase.api_gets:
        gets = ", ".join(f"{kind} {n}" for kind, n in sorted(phase.api_gets.items()))
        print(f"  API server GETs (read ahead included): {gets}")
    if phase.errors:
        print(f"  ERRORS: {len(phase.errors)}, first: {phase.errors[0]}")


def report_median(runs: list[Phase]) -> None:
    """The median of each figure over repeated runs of one concurrency."""

    def med(figure: Callable[[Phase], float]) -> float:
        return statistics.median(figure(run) for run in runs)

    print(
        f"concurrency {runs[0].concurrency}, median of {len(runs)} runs: "
        f"prepare p50 {med(lambda r: pct(r.prepare_ms, 50)):.2f} ms, "
        f"p99 {med(lambda r: pct(r.prepare_ms, 99)):.2f} ms; "
        f"unprepare p50 {med(lambda r: pct(r.unprepare_ms, 50)):.2f} ms; "
        f"{med(lambda r: r.throughput):.1f} prepares/s"
    )


async def timed_phase(
    caller: Caller,
    bus: Bus,
    api: MemoryApiServer,
    gpus: list[str],
    cycles: int,
    concurrency: int,
    procs: dict[str, int],
    rng: random.Random | None = None,
    shares: bool = False,
    hold_s: float = 0.0,
) -> Phase:
    """One phase, with the CPU time each process spent on it."""
    before = {name: cpu_seconds(pid) for name, pid in procs.items()}
    gets = dict(api.served)
    phase = await run_phase(caller, bus, api, gpus, cycles, concurrency, rng, shares, hold_s)
    phase.api_gets = {kind: n - gets.get(kind, 0) for kind, n in api.served.items()}
    phase.cpu_ms_per_cycle = {
        name: (cpu_seconds(pid) - before[name]) * 1000 / cycles for name, pid in procs.items()
    }
    return phase


async def main(args: argparse.Namespace) -> int:
    """One set of runs, or ``--pairs`` back-to-back pairs of tracing off and on."""
    jaeger: Jaeger | None = None
    otlp = args.otlp_endpoint
    if args.jaeger or args.sink:
        workdir = Path(tempfile.mkdtemp(prefix="gpudra-bench-jaeger-", dir="/tmp"))
        jaeger = Jaeger(workdir, store=not args.sink)
        jaeger.start()
        http = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") == "http/protobuf"
        otlp = jaeger.otlp_http if http else jaeger.otlp_grpc
        assert jaeger.proc is not None
        args.sink_pid = jaeger.proc.pid
        kind = "receives and drops spans" if args.sink else "in-memory storage"
        print(f"tracing sink: Jaeger ({kind}), OTLP/{'HTTP' if http else 'gRPC'} {otlp}")
    try:
        if args.compare:
            return 1 if await run_compare(args) else 0
        if args.status_pairs:
            return 1 if await run_status_pairs(args) else 0
        if not args.pairs:
            return 1 if await run_set(args, otlp) else 0
        if not otlp:
            raise SystemExit("--pairs needs a sink: --otlp-endpoint URL, --jaeger or --sink")
        return 1 if await run_pairs(args, otlp) else 0
    finally:
        if jaeger is not None:
            jaeger.stop()
            shutil.rmtree(jaeger.workdir, ignore_errors=True)


GPUDRA_PROCS = ("front", "preparer", "nats-server")  # what "CPU/cycle" ratios add up


def report_ratios(
    pairs: Sequence[tuple[dict[int, list[Phase]], dict[int, list[Phase]]]],
    label: str,
    what: str = "tracing on/off",
) -> None:
    """Second / first of each pair per figure (tracing on / off, this tree / REV): each
    pair's ratio, then the median over pairs."""
    figures: dict[str, Callable[[Phase], float]] = {
        "prepare p50": lambda r: pct(r.prepare_ms, 50),
        "prepare p99": lambda r: pct(r.prepare_ms, 99),
        "unprepare p50": lambda r: pct(r.unprepare_ms, 50),
        "unprepare p99": lambda r: pct(r.unprepare_ms, 99),
        "CPU/cycle": lambda r: sum(r.cpu_ms_per_cycle.get(p, 0.0) for p in GPUDRA_PROCS),
    }
    for concurrency in pairs[0][0]:
        parts = []
        for name, figure in figures.items():
            ratios = [
                statistics.median(figure(r) for r in on[concurrency])
                / statistics.median(figure(r) for r in off[concurrency])
                for off, on in pairs
            ]
            parts.append(f"{name} {statistics.median(ratios):.2f}x")
        sink = [statistics.median(r.cpu_ms_per_cycle.get("sink", 0.0) for r in on[concurrency])
                for _, on in pairs]  # fmt: skip
        if any(sink):
            parts.append(f"sink CPU {statistics.median(sink):.2f} ms/cycle")
        print(f"{what}, {label}, concurrency {concurrency}: {', '.join(parts)}")


@dataclass
class NodeStack:
    """One simulated node's processes, its bus and API server, ready for phases."""

    caller: Caller
    bus: Bus
    api: MemoryApiServer
    gpus: list[str]
    pids: dict[str, int]
    front: Proc
    preparer: Proc
    hold_s: float = 0.0  # --hold

    async def phase(
        self, cycles: int, concurrency: int, rng: random.Random | None = None, shares: bool = False
    ) -> Phase:
        return await timed_phase(
            self.caller, self.bus, self.api, self.gpus, cycles, concurrency, self.pids, rng,
            shares, self.hold_s,
        )  # fmt: skip

    def peak_rss(self) -> str:
        """VmHWM of each node process (the sum is what issue 13's footprint target counts)."""
        sizes = {name: peak_rss_mb(pid) for name, pid in self.pids.items() if name != "bench"}
        parts = ", ".join(f"{name} {mb:.1f} MB" for name, mb in sizes.items())
        both = sizes["front"] + sizes["preparer"]
        uss = {name: private_mb(self.pids[name]) for name in ("front", "preparer")}
        return (
            f"peak RSS: {parts}; front + preparer {both:.1f} MB; now private to each (USS): "
            f"front {uss['front']:.1f} MB, preparer {uss['preparer']:.1f} MB"
        )


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the highest resident set size ``pid`` has had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def private_mb(pid: int) -> float:
    """Unique set size: the pages only ``pid`` maps (RSS also counts the interpreter's and
    the shared libraries' pages, which the node's other Python processes map too)."""
    kb = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            kb += int(line.split()[1])
    return kb / 1024


@contextlib.asynccontextmanager
async def node_stack(
    args: argparse.Namespace,
    otlp: str,
    repo: Path = REPO,
    status: bool = False,
    *,
    kubeconfig: Path | None = None,
    log_level: str = "warning",
) -> AsyncIterator[NodeStack]:
    """Start a node's processes (tracing on when ``otlp``; ``repo``: whose code; ``status``:
    an API server that takes claim status writes, so the preparer writes them), warm
    them up; stop them after. ``kubeconfig``: the preparer checks claims against that API
    server instead of the in-memory one, and the caller warms the node up (bench/peer.py:
    a real kube-apiserver); ``log_level``: every process's ``--log-level``."""
    root = Path(tempfile.mkdtemp(prefix="gpudra-bench-", dir="/tmp"))
    nats = NatsServer(root / "nats", log_file=root / "nats.log")
    procs: list[Proc] = []
    api = MemoryApiServer(version=STATUS_VERSION if status else None)
    try:
        nats.start()
        nats.provision()
        bus = await Bus.connect(
            nats.url,
            name="bench",
            identity=Identity(Role.ADMIN),
            credentials=nats.credentials(Role.ADMIN),
        )
        boot_id = root / "boot_id"
        boot_id.write_text(f"{uuid.uuid4()}\n")
        discovery = spawn(root, "discovery", *nats.client_argv(Role.DISCOVERY, NODE),
                          "--fleet", args.fleet, "--rescan-interval", "3600",
                          otlp=otlp, repo=repo, log_level=log_level)  # fmt: skip
        procs.append(discovery)
        inventory = await wait_for_inventory(bus, discovery)
        gpus = [gpu_device_name(g.minor) for g in inventory.gpus if not g.mig_enabled]
        kubelet_root = root / "kubelet"
        if kubeconfig is not None:
            claims = ["--kubeconfig", str(kubeconfig)]
        elif args.trust_claims_bucket:
            claims = ["--trust-claims-bucket"]
        else:
            await api.start()
            claims = ["--kubeconfig", str(api.kubeconfig(root / "kubeconfig"))]
        preparer = spawn(root, "preparer", *nats.client_argv(Role.PREPARER, NODE),
                         "--fleet", args.fleet,
                         "--kubelet-root", str(kubelet_root), "--cdi-root", str(root / "cdi"),
                         "--boot-id-file", str(boot_id), *claims, *share_flags(args),
                         otlp=otlp, repo=repo, log_level=log_level)  # fmt: skip
        front = spawn(root, "kubeletplugin", *nats.client_argv(Role.FRONT, NODE),
                      "--kubelet-root", str(kubelet_root), otlp=otlp, repo=repo,
                      log_level=log_level)  # fmt: skip
        procs += [preparer, front]
        async with FakeKubelet(kubelet_root) as kubelet:
            await kubelet.wait_for_registration_socket(timeout=30)
            await kubelet.register()
            front.check_alive()
            checks = (
                f"claims checked via the API server of {kubeconfig}"
                if kubeconfig is not None
                else "bucket trusted"
                if args.trust_claims_bucket
                else "claims checked via API"
            )
            tracing = f"tracing on ({otlp})" if otlp else "tracing off"
            tree = "this tree" if repo == REPO else f"{repo}"
            print(
                f"{tree}: fleet {args.fleet}: {len(gpus)} GPUs; {checks}; "
                f"{tracing}; front pid {front.popen.pid}, preparer pid {preparer.popen.pid}"
            )
            await wait_for_preparer(kubelet, preparer)
            if kubeconfig is None:
                warm = await run_phase(kubelet, bus, api, gpus, args.warmup, 1)
                if warm.errors:
                    raise SystemExit(
                        f"warm-up failed: {warm.errors[0]}\n{preparer.log.read_text()}"
                    )
            caller: Caller = kubelet
            if args.direct:  # the preparer answers only its node's front
                caller = DirectCaller(
                    await Bus.connect(
                        nats.url,
                        name="bench-front",
                        identity=Identity(Role.FRONT, NODE),
                        credentials=nats.credentials(Role.FRONT, NODE),
                    )
                )
                print("--direct: NATS requests straight to the preparer, no front, no socket")
            assert nats.proc is not None
            pids = {"front": front.popen.pid, "preparer": preparer.popen.pid}
            pids["nats-server"] = nats.proc.pid
            pids["discovery"] = discovery.popen.pid  # the node DaemonSet's third container
            pids["bench"] = os.getpid()  # the kubelet's client and the API server
            if otlp and args.sink_pid:
                pids["sink"] = args.sink_pid
            yield NodeStack(caller, bus, api, gpus, pids, front, preparer, args.hold / 1000)
        await bus.close()
    finally:
        for proc in reversed(procs):
            proc.stop()
        nats.stop()
        await api.stop()
        shutil.rmtree(root, ignore_errors=True)


def share_flags(args: argparse.Namespace) -> list[str]:
    if not args.shares:
        return []
    return ["--feature-gates", "ConsumableShares=true", "--consumable-shares", "memory"]


async def run_set(args: argparse.Namespace, otlp: str) -> bool:
    """One node (tracing on when ``otlp``): every phase, ``--repeat`` times. True if any failed."""
    runs: dict[tuple[int, bool], list[Phase]] = {}
    failed = False
    kinds = (False, True) if args.shares else (False,)
    async with node_stack(args, otlp) as node:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for _ in range(args.repeat):
            for concurrency in args.concurrency:
                for share in kinds:
                    if args.shares:
                        print("claims:", f"a {SHARE_MEMORY} share" if share else "a whole GPU")
                    phase = await node.phase(args.cycles, concurrency, shares=share)
                    report(phase, args.cycles, concurrency > len(node.gpus) and not share)
                    runs.setdefault((concurrency, share), []).append(phase)
                    failed = failed or bool(phase.errors)
        if args.repeat > 1:
            for (_, share), phases in runs.items():
                if args.shares:
                    print("claims:", f"a {SHARE_MEMORY} share" if share else "a whole GPU")
                report_median(phases)
        print(node.peak_rss())
    return failed


async def run_pairs(args: argparse.Namespace, otlp: str) -> bool:
    """Two nodes side by side, tracing off and on, phases interleaved.

    Each pair is one phase on each node, run one right after the other (the
    order alternates from pair to pair), so a change in the machine's load
    between pairs moves both halves of a pair alike. True if any phase failed.
    """
    pairs: list[tuple[dict[int, list[Phase]], dict[int, list[Phase]]]] = []
    async with node_stack(args, "") as off_node, node_stack(args, otlp) as on_node:
        for i in range(args.pairs):
            off: dict[int, list[Phase]] = {}
            on: dict[int, list[Phase]] = {}
            for concurrency in args.concurrency:
                order = [(off_node, off), (on_node, on)]
                for node, into in order if i % 2 == 0 else reversed(order):
                    phase = await node.phase(args.cycles, concurrency)
                    if phase.errors:
                        report(phase, args.cycles, concurrency > len(node.gpus))
                        return True
                    into[concurrency] = [phase]
            pairs.append((off, on))
            report_ratios(pairs[-1:], f"pair {i + 1}")
        report_ratios(pairs, f"median of {len(pairs)} pairs")
        for label, node in (("off", off_node), ("on", on_node)):
            print(f"tracing {label}: {node.peak_rss()}")
    return False


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """REV in a temporary ``git worktree`` (detached), removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="gpudra-bench-rev-", dir="/tmp")) / "tree"
    git = ["git", "-C", str(REPO)]
    subprocess.run([*git, "worktree", "add", "--detach", "--quiet", str(where), rev], check=True)
    try:
        commit = subprocess.run(
            [*git, "-C", str(where), "rev-parse", "--short", "HEAD"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        print(f"--compare {rev}: {commit} checked out in {where}")
        yield where
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(where)], check=False)
        shutil.rmtree(where.parent, ignore_errors=True)


async def run_status_pairs(args: argparse.Namespace) -> bool:
    """Two nodes of this tree side by side, the same seeded phases interleaved: one whose
    API server takes claim status writes (the preparer writes every prepared claim's
    status.devices, and removes it at unprepare) and one whose API server has no
    /version (the writer stays off). Ratios: writing over not writing."""
    pairs: list[tuple[dict[int, list[Phase]], dict[int, list[Phase]]]] = []
    async with node_stack(args, "") as off_node, node_stack(args, "", status=True) as on_node:
        for i in range(max(args.status_pairs, 1)):
            off: dict[int, list[Phase]] = {}
            on: dict[int, list[Phase]] = {}
            print(f"pair {i + 1}: load average {loadavg()}")
            for concurrency in args.concurrency:
                order = [(off_node, off, "off"), (on_node, on, "on")]
                for node, into, name in order if i % 2 == 0 else reversed(order):
                    rng = random.Random(f"{args.seed}/{i}/{concurrency}")
                    phase = await node.phase(args.cycles, concurrency, rng)
                    print(f"  status {name}: ", end="")
                    report(phase, args.cycles, concurrency > len(node.gpus))
                    if phase.errors:
                        return True
                    into[concurrency] = [phase]
            pairs.append((off, on))
            report_ratios(pairs[-1:], f"pair {i + 1}", "status on/off")
        report_ratios(pairs, f"median of {len(pairs)} pairs", "status on/off")
        print(f"status writes answered: {on_node.api.served['status']}")
        for label, node in (("off", off_node), ("on", on_node)):
            print(f"status {label}: {node.peak_rss()}")
    return False


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def run_compare(args: argparse.Namespace) -> bool:
    """REV's node and this tree's side by side, the same seeded phases interleaved."""
    pairs: list[tuple[dict[int, list[Phase]], dict[int, list[Phase]]]] = []
    with checkout(args.compare) as tree:
        async with node_stack(args, "", tree) as rev_node, node_stack(args, "") as this_node:
            for i in range(max(args.pairs, 1)):
                rev: dict[int, list[Phase]] = {}
                this: dict[int, list[Phase]] = {}
                print(f"pair {i + 1}: load average {loadavg()}")
                for concurrency in args.concurrency:
                    order = [(rev_node, rev, "rev"), (this_node, this, "this")]
                    for node, into, name in order if i % 2 == 0 else reversed(order):
                        rng = random.Random(f"{args.seed}/{i}/{concurrency}")
                        phase = await node.phase(args.cycles, concurrency, rng)
                        print(f"  {name}: ", end="")
                        report(phase, args.cycles, concurrency > len(node.gpus))
                        if phase.errors:
                            return True
                        into[concurrency] = [phase]
                pairs.append((rev, this))
                report_ratios(pairs[-1:], f"pair {i + 1}", f"this/{args.compare}")
            report_ratios(pairs, f"median of {len(pairs)} pairs", f"this/{args.compare}")
            print(f"load average after: {loadavg()}")
            for label, node in ((args.compare, rev_node), ("this tree", this_node)):
                print(f"{label}: {node.peak_rss()}")
    return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--fleet", default="dgx-h100")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--repeat", type=int, default=1, help="run every phase this often; print medians"
    )
    parser.add_argument(
        "--trust-claims-bucket",
        action="store_true",
        help="run the preparer without an API server (claims from the bucket, no pod checks)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default="",
        help="tracing on: every process exports its spans to this OTLP/gRPC endpoint",
    )
    parser.add_argument(
        "--jaeger",
        action="store_true",
        help="tracing on, into a Jaeger started here (services/local/jaeger, built and cached)",
    )
    parser.add_argument(
        "--sink",
        action="store_true",
        help="like --jaeger, but Jaeger only receives and drops the spans (what the sender "
        "pays, without a collector's storage competing for this machine's CPUs)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="run N back-to-back pairs (tracing off, then on against the sink; each with "
        "fresh processes) and print the on/off ratio of each figure, per pair and median",
    )
    parser.add_argument(
        "--compare",
        default="",
        metavar="REV",
        help="run REV (any git revision, checked out in a temporary worktree) beside this "
        "tree, the same seeded workload on both, --pairs interleaved pairs (default 1); "
        "print this tree's figures over REV's",
    )
    parser.add_argument(
        "--status-pairs",
        type=int,
        default=0,
        metavar="N",
        help="run N interleaved pairs of two nodes of this tree, one writing each claim's "
        "status.devices (its API server takes them) and one not; print on/off ratios",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="MS",
        help="keep each claim prepared this long before its unprepare (untimed; a pod's "
        "life: with --status-pairs, long enough for its status to be written)",
    )
    parser.add_argument("--seed", default="gpudra", help="the workload's seed (--compare)")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="bypass the front: time the preparer alone (to see what the front adds)",
    )
    parser.add_argument(
        "--shares",
        action="store_true",
        help="also time claims for a consumable share of a GPU (ConsumableShares, memory mode)",
    )
    parser.set_defaults(sink_pid=0)  # the Jaeger process, when one runs here
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
