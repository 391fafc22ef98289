"""gpudra's claim path beside another DRA kubelet plugin's, in one run.

    python bench/peer.py --peer /path/to/dra-example-kubeletplugin
                         [--cycles 1000] [--concurrency 1 16] [--repeat 3]

The peer is any kubelet plugin binary with the flags of kubernetes-sigs'
dra-example-driver (``--kubeconfig``, ``--node-name``, ``--cdi-root``, the
kubelet's registrar and plugins folders, ``--num-devices``); build it yourself
from its source, nothing here fetches or builds it. It runs on its production
path against a real kube-apiserver (the local control plane,
services.local.cluster): its claims are created there, allocated to its
devices, and it reads each one there when the kubelet asks (its client's rate
limit raised with ``--kube-api-qps``: at its default of 5 QPS each prepare
waits about 200 ms for it). gpudra runs as
bench/prepare.py runs it (front, preparer, discovery and nats-server as
separate processes; claims read ahead by the preparer's pod watch). Both are
driven by the same gRPC client (services.local.kubelet.FakeKubelet) through
their DRA sockets, one prepare then one unprepare per cycle, with the same
concurrency; their phases alternate (the order flipping each repeat), so the
machine's load weighs on both alike.

Printed per phase and driver: p50/p99 of prepare and unprepare, cycles/s, CPU
ms per cycle (gpudra: front + preparer + nats-server; the peer: its one
process, and what its GETs cost the API server, apart), peak RSS; then the
medians over the repeats and gpudra/peer ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import prepare  # noqa: E402
from bench.prepare import Phase, Proc, cpu_seconds, pct, peak_rss_mb, report  # noqa: E402
from services.core.kube.client import KubeApi, http_api  # noqa: E402
from services.core.kube.resourceapi import versioned  # noqa: E402
from services.local.cluster import ControlPlane  # noqa: E402
from services.local.kubebinary import build_controlplane  # noqa: E402
from services.local.kubelet import Claim, FakeKubelet  # noqa: E402

PEER_DRIVER = "gpu.example.com"
NAMESPACE = "bench-peer"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


@dataclass
class Peer:
    kubelet: FakeKubelet
    api: KubeApi
    pid: int
    apiserver_pid: int
    gpus: list[str]


async def _claim(api: KubeApi, gpu: str) -> Claim:
    """A claim allocated to ``gpu`` of the peer's node pool, as the scheduler leaves it."""
    name = f"peer-{uuid.uuid4().hex[:12]}"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}  # fmt: skip
    made = json.loads(await api.create(CLAIMS, body))
    result = {"request": "gpu", "driver": PEER_DRIVER, "pool": prepare.NODE, "device": gpu}
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    await api.patch(f"{CLAIMS}/{name}/status", status)
    return Claim(made["metadata"]["uid"], NAMESPACE, name)


async def _claims(api: KubeApi, gpus: list[str], count: int, concurrency: int) -> list[Claim]:
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> Claim:
        async with gate:
            return await _claim(api, gpus[(i % concurrency) % len(gpus)])

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def peer_phase(peer: Peer, cycles: int, concurrency: int) -> tuple[Phase, float]:
    """One phase on the peer; also the API server's CPU ms per cycle during it."""
    claims = await _claims(peer.api, peer.gpus, cycles, concurrency)
    plan = [claims[slot::concurrency] for slot in range(concurrency)]
    before = cpu_seconds(peer.pid), cpu_seconds(peer.apiserver_pid)
    phase = await prepare.timed_cycles(peer.kubelet, plan)
    plugin_ms = (cpu_seconds(peer.pid) - before[0]) * 1000 / cycles
    apiserver_ms = (cpu_seconds(peer.apiserver_pid) - before[1]) * 1000 / cycles
    phase.cpu_ms_per_cycle = {"plugin": plugin_ms}
    return phase, apiserver_ms


def start_peer(binary: Path, cp: ControlPlane, root: Path, gpus: int, qps: float) -> Proc:
    """The peer's kubelet plugin for the bench node, its kubelet folders under ``root``."""
    kubelet_root = root / "kubelet"
    for folder in ("plugins_registry", "plugins"):
        (kubelet_root / folder).mkdir(parents=True)
    (root / "cdi").mkdir()
    log = root / "peer.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [str(binary), "--kubeconfig", str(cp.kubeconfig), "--node-name", prepare.NODE,
             "--cdi-root", str(root / "cdi"), "--num-devices", str(gpus),
             "--kubelet-registrar-directory-path", str(kubelet_root / "plugins_registry"),
             "--kubelet-plugins-directory-path", str(kubelet_root / "plugins"),
             "--healthcheck-port", "-1", "--metrics-port", "-1",
             "--kube-api-qps", str(qps), "--kube-api-burst", str(int(qps))],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return Proc("peer", popen, log)


@contextlib.asynccontextmanager
async def peer_stack(binary: Path, gpus: int, qps: float) -> AsyncIterator[Peer]:
    root = Path(tempfile.mkdtemp(prefix="gpudra-bench-peer-", dir="/tmp"))
    with ControlPlane(build_controlplane(), nodes=[prepare.NODE], verbosity=0) as cp:
        cp.kubectl("create", "namespace", NAMESPACE)
        proc = start_peer(binary, cp, root, gpus, qps)
        api = versioned(await http_api(str(cp.kubeconfig)))
        apiserver = next(p for p in cp.processes if p.name == "kube-apiserver")
        try:
            async with FakeKubelet(root / "kubelet", driver=PEER_DRIVER) as kubelet:
                await kubelet.wait_for_registration_socket(timeout=60)
                await kubelet.register()
                names = [f"gpu-{i}" for i in range(gpus)]
                peer = Peer(kubelet, api, proc.popen.pid, apiserver.proc.pid, names)
                warm, _ = await peer_phase(peer, 20, 1)
                if warm.errors:
                    raise SystemExit(f"peer warm-up failed: {warm.errors[0]}")
                print(f"peer: {binary.name}, pid {peer.pid}, {gpus} GPUs, claims GET from "
                      f"kube-apiserver pid {peer.apiserver_pid}, client QPS {qps:g}")  # fmt: skip
                yield peer
        finally:
            await api.close()
            proc.stop()
            shutil.rmtree(root, ignore_errors=True)


def _median(phases: Sequence[Phase], figure: str) -> float:
    values: Callable[[Phase], float] = {
        "prepare p50": lambda p: pct(p.prepare_ms, 50),
        "prepare p99": lambda p: pct(p.prepare_ms, 99),
        "unprepare p50": lambda p: pct(p.unprepare_ms, 50),
        "unprepare p99": lambda p: pct(p.unprepare_ms, 99),
        "cycles/s": lambda p: p.throughput,
        "CPU ms/cycle": lambda p: sum(p.cpu_ms_per_cycle.values()),
    }[figure]
    return statistics.median(values(p) for p in phases)


def summary(ours: dict[int, list[Phase]], theirs: dict[int, list[Phase]]) -> None:
    print("\nmedians over the repeats (gpudra CPU: front + preparer + nats-server)")
    print(f"{'figure':<16}{'c':>4}{'gpudra':>10}{'peer':>10}{'gpudra/peer':>13}")
    for c in sorted(ours):
        for figure in ("prepare p50", "prepare p99", "unprepare p50", "unprepare p99",
                       "cycles/s", "CPU ms/cycle"):  # fmt: skip
            a, b = _median(ours[c], figure), _median(theirs[c], figure)
            print(f"{figure:<16}{c:>4}{a:>10.2f}{b:>10.2f}{a / b:>12.2f}x")


async def run(args: argparse.Namespace) -> int:
    prepare_args = prepare.parse_args(["--cycles", str(args.cycles), "--fleet", args.fleet])
    ours: dict[int, list[Phase]] = {c: [] for c in args.concurrency}
    theirs: dict[int, list[Phase]] = {c: [] for c in args.concurrency}
    async with prepare.node_stack(prepare_args, "") as node:
        async with peer_stack(args.peer, len(node.gpus), args.peer_qps) as peer:
            for repeat in range(args.repeat):
                for c in args.concurrency:
                    order = ("gpudra", "peer") if repeat % 2 == 0 else ("peer", "gpudra")
                    for who in order:
                        print(f"\n[{who}, repeat {repeat + 1}, load {os.getloadavg()[0]:.1f}]")
                        if who == "gpudra":
                            phase = await node.phase(args.cycles, c)
                            ours[c].append(phase)
                            report(phase, args.cycles, shared=c > len(node.gpus))
                        else:
                            phase, api_ms = await peer_phase(peer, args.cycles, c)
                            theirs[c].append(phase)
                            report(phase, args.cycles, shared=False)
                            print(f"  kube-apiserver CPU ms per cycle (its GETs): {api_ms:.2f}")
            print(f"\n{node.peak_rss()}")
            print(f"peer peak RSS: {peak_rss_mb(peer.pid):.1f} MB")
    summary(ours, theirs)
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
