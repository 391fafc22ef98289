"""``gpudra up`` itself, as a user runs it: the command, its output, its exit.

``--exit-after-demo`` runs the demo over examples/ and exits 0 only if every
pod ended as expected; without it the stack stays up (kubectl works with the
printed command line) until SIGTERM, and then every process it started is
gone. Each test is one whole stack (about 20 s to start on 2 cores).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.local import demoexamples
from services.local.stackprocs import recorded_pids, still_running

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]
NODES = ("gpu-node-h100", "gpu-node-a100")
GB200_NODES = ("gpu-node-gb200-1", "gpu-node-gb200-2")  # added for the ComputeDomain example


@pytest.fixture
def workdir(controlplane_binary: Path) -> Iterator[Path]:
    """A short path (the kubelet sockets must fit in 108 bytes), removed afterwards.

    Depends on ``controlplane_binary`` so that a missing toolchain skips and
    the build happens outside the command's timing."""
    path = Path(tempfile.mkdtemp(prefix="gu-")) / "up"  # both drivers' sockets fit
    yield path
    left = still_running(recorded_pids(path), timeout=0)
    for pid in left.values():  # only if a test failed half-way; never reached when green
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path.parent, ignore_errors=True)


def gpudra_up(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> str:
    """Output lines up to and including the one containing ``marker``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return "".join(lines)
    raise AssertionError(f"no {marker!r} from gpudra up:\n{''.join(lines)}")


def test_exit_after_demo_runs_every_example_and_stops_everything(workdir: Path) -> None:
    proc = gpudra_up("--exit-after-demo", "--timeout", "60", "--workdir", str(workdir), "--jaeger")
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert proc.returncode == 0, out
    examples = demoexamples.load_examples()
    pods = [p for e in examples for p in e.pods]
    assert f"{len(pods)}/{len(pods)} pods as expected ({len(pods) - 1} Running)" in out, out
    for node in NODES:
        assert re.search(rf"{node} \(dgx-\w+\): 1 slice\(s\), \d+ devices", out), out
    for node in GB200_NODES:
        assert re.search(rf"{node} \(gb200-nvl72\): 1 slice\(s\), \d+ devices", out), out
    for example in examples:
        assert f"{example.name}: {example.title}" in out
        vendor = "compute-domain" if example.domains else "gpu"  # an IMEX channel, or GPUs
        for pod in example.pods:
            if pod.expect == demoexamples.RUNNING:
                assert re.search(
                    rf"pod {pod.namespace}/{pod.name}: Running on gpu-node-[\w-]+\n"
                    rf"      \S+: k8s\.{vendor}\.nvidia\.com/claim=",
                    out,
                ), pod
    assert "claim unsatisfiable/two-big-gpus: pending; gpudra explains:" in out
    assert "pod unsatisfiable/too-big: Pending (as expected)" in out
    assert f"kubeconfig: {workdir}/kubeconfig" in out
    assert "supervised      every process above: a death is reported here" in out, out
    assert "restarts while up: none" in out, out
    # --jaeger: Jaeger listed, and every claim shown with the URL of its own trace.
    [ui] = re.findall(r"jaeger          query API and UI (http://127\.0\.0\.1:\d+),", out)
    claims = re.findall(r"^  claim (\S+):", out, re.MULTILINE)
    traces = re.findall(
        rf"^      trace: {re.escape(ui)}/trace/([0-9a-f]{{32}})$", out, re.MULTILINE
    )
    assert len(traces) == len(claims) == len(set(traces)), out
    # The examples deleted, every claim's trail ends, the pending claim's with 'deleted'.
    assert "gpudra audit --verify: every claim's trail is complete" in out, out
    # One claim per GPU example (the shared one is one for two pods); the ComputeDomain
    # example's two channel claims and its two nodes' IMEX daemon claims.
    n_claims = len(demoexamples.gpu_only(examples)) + 4
    assert re.search(rf"events, {n_claims} claims complete, 0 incomplete, 0 unreadable", out), out
    pids = recorded_pids(workdir)
    assert "jaeger" in pids
    nodes = len(NODES) + len(GB200_NODES)
    assert len(pids) >= 1 + 4 + 4 * nodes + 2, pids  # nats, control plane, nodes, cluster
    assert still_running(pids) == {}


def test_stays_up_for_kubectl_and_stops_on_sigterm(workdir: Path, tmp_path: Path) -> None:
    """A failing example is reported without stopping the stack, and so is kill -9 of
    nats-server or a service: `gpudra up` restarts it."""
    examples = tmp_path / "examples"
    examples.mkdir()
    shutil.copy(demoexamples.EXAMPLES_DIR / "01-single-gpu-template.yaml", examples)
    template = (demoexamples.EXAMPLES_DIR / "01-single-gpu-template.yaml").read_text()
    nine = "deviceClassName: gpu.nvidia.com\n          count: 9\n"
    (examples / "02-too-many.yaml").write_text(
        template.replace("single-gpu\n", "too-many\n").replace(
            "deviceClassName: gpu.nvidia.com\n", nine
        )
    )
    proc = gpudra_up("--workdir", str(workdir), "--examples", str(examples), "--timeout", "5")
    try:
        out = read_until(proc, "Ctrl-C stops everything", timeout=300)
        assert "1/2 pods as expected (1 Running)" in out, out
        assert re.search(r"pod too-many/cuda: Pending on - \(FAILED: not prepared\)", out), out
        command = next(line for line in out.splitlines() if line.strip().endswith(" -A"))
        kubectl = subprocess.run(
            shlex.split(command), capture_output=True, text=True, timeout=60, check=False
        )
        assert kubectl.returncode == 0, kubectl.stderr
        for node in NODES:
            assert f"{node}-gpu.nvidia.com" in kubectl.stdout, kubectl.stdout
        assert "resourceclaim.resource.k8s.io/cuda-gpu-" in kubectl.stdout
        # One metrics port per gpudra process, each serving its own service's families.
        ports = dict(re.findall(r"^  (\S+) +http://127\.0\.0\.1:(\d+)/metrics$", out, re.M))
        assert set(ports) == {"publisher", "allocator", "domains", "webhook"} | {
            f"{s}-{n}" for s in ("discovery", "preparer", "kubeletplugin") for n in NODES
        }, out
        for name, port in ports.items():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                families = set(re.findall(r"^# TYPE gpudra_([a-z]+)_", r.read().decode(), re.M))
            service = name.split("-")[0]
            assert service in families and families <= {service, "bus", "kube", "task"}, name
        audit = next(line for line in out.splitlines() if " audit " in line).split()
        deadline = time.monotonic() + 60
        while True:  # the running claim's events, as the printed command line shows them
            trail = subprocess.run([sys.executable, "-m", "services.cli", *audit[1:]], cwd=REPO,
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
            assert trail.returncode == 0, trail.stderr
            if re.search(r" prepared +single-gpu/cuda-gpu-", trail.stdout):
                break
            assert time.monotonic() < deadline, trail.stdout
            time.sleep(0.5)
        pids = recorded_pids(workdir)
        assert still_running(pids, timeout=0) == pids  # everything is up
        # kill -9 of nats-server and of the publisher: each reported at once and started
        # again by `gpudra up` itself, which stays up; nats on its port and store.
        for name in ("nats", "publisher"):
            os.kill(pids[name], signal.SIGKILL)
            said = read_until(proc, f"gpudra up: {name} restarted (pid ", timeout=60)
            assert re.search(
                rf"^gpudra up: {name} \(pid {pids[name]}\) killed by SIGKILL; restarting it "
                rf"in 1s; log {workdir}/logs/{name}\.log: .+$",
                said,
                re.M,
            ), said
        # The restarted nats-server kept JetStream's store: the trail is still there.
        trail = subprocess.run([sys.executable, "-m", "services.cli", *audit[1:]], cwd=REPO,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert re.search(r" prepared +single-gpu/cuda-gpu-", trail.stdout), trail
        restarted = recorded_pids(workdir)
        assert {n for n in pids if restarted[n] != pids[n]} == {"nats", "publisher"}
        pids = restarted
        assert still_running(pids, timeout=0) == pids
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "SIGTERM: stopping" in rest
    assert "restarts while up: 2 (nats 1, publisher 1)" in rest, rest
    assert f"work dir kept: {workdir}" in rest
    assert still_running(pids) == {}


@pytest.mark.realnode
def test_real_nodes_run_every_example_in_containers(workdir: Path) -> None:
    """``--real-nodes``: containerd and the real kubelet; each running container
    prints what the stand-in nvidia-smi finds in it: its own GPUs."""
    from services.local import node

    reason = node.unavailable()
    if reason:
        pytest.skip(f"real nodes cannot run here: {reason}")
    proc = gpudra_up("--real-nodes", "--exit-after-demo", "--timeout", "90",
                     "--workdir", str(workdir))  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert proc.returncode == 0, out
    for name in NODES:
        assert re.search(rf"{name} +fleet dgx-\w+: .*containerd, kubelet \(real containers\)", out)
    examples = demoexamples.gpu_only(
        demoexamples.load_examples()
    )  # ComputeDomains are left out there
    pods = [p for e in examples for p in e.pods]
    assert f"{len(pods)}/{len(pods)} pods as expected ({len(pods) - 1} Running)" in out, out
    # Each GPU container's log: nvidia-smi -L run in the container, its one GPU.
    assert re.search(
        r"pod single-gpu/cuda: Running on gpu-node-\w+\n"
        r"      cuda: k8s\.gpu\.nvidia\.com/claim=\S+\n"
        r"        \| GPU 0: NVIDIA \S+.* \(UUID: GPU-[0-9a-f-]+\)\n",
        out,
    ), out
    four = re.search(r"pod mig-four-slices/sweep: Running on gpu-node-a100\n(?:.*\n){6}", out)
    assert four is not None and len(re.findall(r"MIG 1g\.5gb Device \d", four.group(0))) == 4
    assert "gpudra audit --verify: every claim's trail is complete" in out, out
    pids = recorded_pids(workdir)
    assert {f"nodehost-{n}" for n in NODES} <= set(pids)
    assert {f"kubelet-{n}" for n in NODES} | {f"containerd-{n}" for n in NODES} <= set(pids)
    assert still_running(pids) == {}
