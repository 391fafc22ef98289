"""Benchmark: a ComputeDomain from creation to Ready (and to its pods Running), and what
the controller costs.

Against a real kube-apiserver (the e2e control plane) and nats-server on
127.0.0.1, with ``gpudra domains`` as its own process, prints without asserting
anything, for 2, 8 and 18 nodes (18: the reference's limit per IMEX domain):

- creation -> Ready: a ComputeDomain is created, then one simulated IMEX daemon
  per node starts (``gpudra imex-daemon run --mode simulated``, a real process on
  its own 127.0.0.x): the time until ``status.status`` is Ready, which needs every
  daemon to reach every peer;
- the controller's status writes for that domain, and its CPU seconds and RSS
  (from /proc) after each size.

With ``--pods`` it measures the whole path instead, on a `gpudra up` stack
(services.local.stack) of N simulated ``gb200-nvl72`` nodes, fresh per size: a
ComputeDomain is created, then (once its workload template exists, as a job would
find it) one pod per node with a channel claim from it; the time from creating the
domain to every pod Running, and to the domain Ready, and the controller's CPU and
RSS. kubelet-dra syncs pods side by side (``--pod-workers``, as the kubelet's pod
workers), so a workload pod's channel claim waits for its node's daemon pod while
that pod is prepared and started.

Usage: ``python -m bench.domains [--sizes 2,8,18] [--pods [--prepare-timeout 12]]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.core.bus.access import Role
from services.core.kube.client import ApiError, KubeApi, http_api
from services.core.model import computedomain as cd
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.kubebinary import build_controlplane
from services.local.natsserver import NatsServer
from services.local.ports import free_port
from services.local.stack import COMPUTE_DOMAIN_CLIQUE_CRD, COMPUTE_DOMAIN_CRD, Stack
from services.local.stacknodes import NodeSpec

TICK = os.sysconf("SC_CLK_TCK")


def proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS KiB) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text()
               .splitlines() if line.startswith("VmRSS:"))  # fmt: skip
    return cpu, rss


def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A process in its own group (a daemon and its IMEX stand-in die together)."""
    return subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def status_of(api: KubeApi, name: str) -> dict[str, object]:
    try:
        return dict(json.loads(await api.get(cd.domains_path("default", name))).get("status") or {})
    except ApiError:
        return {}


async def one_size(api: KubeApi, nats: NatsServer, root: Path, n: int) -> float:
    name = f"bench-{n}"
    spec = {"numNodes": n, "channel": {"resourceClaimTemplate": {"name": name}}}
    body = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}  # fmt: skip
    port, cmd = free_port(), free_port()
    start = time.perf_counter()
    uid = json.loads(await api.create(cd.domains_path("default"), body))["metadata"]["uid"]
    procs = []
    for i in range(n):
        node = f"bench-node-{i:02d}"
        env = {**os.environ, "NODE_NAME": node, "POD_IP": f"127.0.0.{2 + i}",
               "COMPUTE_DOMAIN_UUID": uid, "CLIQUE_ID": "bench-cluster.1"}  # fmt: skip
        argv = [sys.executable, "-m", "services.cli", "imex-daemon", "run", "--mode", "simulated",
                "--imexd-dir", str(root / name / node), "--server-port", str(port),
                "--cmd-port", str(cmd), "--probe-interval", "0.5", "--log-level", "warning",
                "--hosts-file", str(root / name / f"{node}.hosts"),
                *nats.client_argv(Role.IMEX, node)]  # fmt: skip
        procs.append(spawn(argv, env))
    while True:
        status = await status_of(api, name)
        if status.get("status") == "Ready" and len(status.get("nodes", [])) == n:  # type: ignore[arg-type]
            break
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - start
    for proc in procs:
        os.killpg(proc.pid, 9)
        proc.wait()
    await api.delete(cd.domains_path("default", name))
    while True:
        if not await status_of(api, name):
            return elapsed
        await asyncio.sleep(0.1)


async def run(sizes: list[int]) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpudra-bench-domains-"))
    nats = NatsServer(root / "nats", log_file=root / "nats.log")
    nats.start()
    nats.provision()
    with ControlPlane(build_controlplane(), workdir=root / "cp") as cp:
        install_crd(cp, COMPUTE_DOMAIN_CRD.read_text())
        install_crd(cp, COMPUTE_DOMAIN_CLIQUE_CRD.read_text())
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpudra"}})
        argv = [sys.executable, "-m", "services.cli", "domains", "--kubeconfig", str(cp.kubeconfig),
                "--namespace", "gpudra", "--log-level", "warning",
                *nats.client_argv(Role.DOMAINS)]  # fmt: skip
        controller = spawn(argv, dict(os.environ))
        api = await http_api(str(cp.kubeconfig))
        try:
            await asyncio.sleep(3)  # the controller's informer lists
            print(f"{'nodes':>5} {'create->Ready s':>16} {'ctl CPU s':>10} {'ctl RSS MiB':>12}")
            for n in sizes:
                seconds = await one_size(api, nats, root, n)
                cpu, rss = proc_usage(controller.pid)
                print(f"{n:>5} {seconds:>16.2f} {cpu:>10.2f} {rss / 1024:>12.1f}", flush=True)
        finally:
            await api.close()
            controller.terminate()
            controller.wait(timeout=20)
    nats.stop()


def pods_running(n: int, prepare_timeout: float) -> tuple[float, float, float, int]:
    """One stack of ``n`` GB200 nodes: (creation -> pods Running s, creation -> Ready s,
    controller CPU s, controller RSS KiB)."""
    nodes = [NodeSpec(f"gb-{i:02d}", "gb200-nvl72") for i in range(n)]
    stack = Stack(nodes, prepare_timeout=prepare_timeout)
    try:
        stack.start()
        spec = {"numNodes": n, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}
        body = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                "metadata": {"name": "job", "namespace": "default"}, "spec": spec}  # fmt: skip
        template = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates/job-channel"
        start = time.perf_counter()
        stack.cp.apply(body)
        stack.wait_for(lambda: stack.api_get(template), "the workload template")
        claim = {"name": "ch", "resourceClaimTemplateName": "job-channel"}
        container = {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "ch"}]}}
        stack.cp.apply([{"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": f"worker-{i}", "namespace": "default"},
                         "spec": {"containers": [container], "resourceClaims": [claim],
                                  "nodeSelector": {"kubernetes.io/hostname": node.name}}}
                        for i, node in enumerate(nodes)])  # fmt: skip
        ready_at: list[float] = []

        def ready() -> bool:  # noted on the way; the CR may trail the pods (they read the bus)
            status = stack.api_get(cd.domains_path("default", "job")).get("status") or {}
            if not ready_at and status.get("status") == "Ready":
                ready_at.append(time.perf_counter() - start)
            return bool(ready_at)

        def all_running() -> bool:
            ready()
            pods = stack.api_get("/api/v1/namespaces/default/pods")["items"]
            return len(pods) == n and all(p["status"].get("phase") == "Running" for p in pods)

        stack.wait_for(all_running, "every workload pod Running", timeout=600)
        running = time.perf_counter() - start
        stack.wait_for(ready, "the domain Ready")
        cpu, rss = proc_usage(stack.processes["domains"].pid)
    finally:
        stack.cleanup()  # stops every process by PID, then removes its work directory
    return running, ready_at[0], cpu, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2,8,18")
    parser.add_argument("--pods", action="store_true", help="to pods Running, on a stack")
    parser.add_argument("--prepare-timeout", type=float, default=12.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not args.pods:
        asyncio.run(run(sizes))
        return
    print(f"{'nodes':>5} {'create->pods Running s':>23} {'create->Ready s':>16} "
          f"{'ctl CPU s':>10} {'ctl RSS MiB':>12}")  # fmt: skip
    for n in sizes:
        running, ready, cpu, rss = pods_running(n, args.prepare_timeout)
        print(f"{n:>5} {running:>23.2f} {ready:>16.2f} {cpu:>10.2f} {rss / 1024:>12.1f}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
