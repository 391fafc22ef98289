"""The Kubernetes releases gpudra supports, each one run for real.

1.37 is the default: every other e2e test runs on it. The compatibility tier is
1.34 (the oldest release the reference NVIDIA driver supports), 1.35 and 1.36, each
built from the Go module proxy by ``build.sh --version`` and cached like the default.
On each: ``gpudra up --exit-after-demo`` over every example (claims allocated by that
release's scheduler from gpudra's slices, prepared through that release's kubelet DRA
manager, pods Running with their CDI ids, the unsatisfiable claim explained by the
allocator following that release; then everything deleted, every claim's trail
complete in the audit, nothing left prepared on any node). And for all four: the
feature-gate tables gpudra follows (services/allocator/structured/features.py)
against what each release's own binary says of its gates.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from services.allocator.structured import features
from services.local import demoexamples
from services.local.kubebinary import kube_version
from services.local.nodepaths import NodePaths
from services.local.stackprocs import recorded_pids, still_running
from services.preparer import checkpointfile
from services.preparer.devices.simulated import STATE_FILE, SimHost

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[3]
#: The compatibility tier: every supported minor but the default.
COMPAT = tuple(m for m in features.MINORS if m != features.DEFAULT_MINOR)
#: DRA gates of a release that gpudra's table leaves out on purpose: none of them
#: changes what is allocated or what a resource.k8s.io object may hold.
NOT_ALLOCATION = {
    "DRASchedulerFilterTimeout",  # how long the scheduler's Filter may take
    "DRAResourceClaimGranularStatusAuthorization",  # who may write claim status
    "DRAWorkloadResourceClaims",  # claims of PodGroups (Workload API)
}


@pytest.mark.parametrize("minor", features.MINORS)
def test_the_gate_tables_are_each_releases_own(
    minor: int, controlplane_for: Callable[[int], Path]
) -> None:
    binary = controlplane_for(minor)
    assert kube_version(binary).startswith(f"v1.{minor}."), kube_version(binary)
    out = subprocess.run(
        [str(binary.parent / "reference-allocator"), "--list-feature-gates"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    release = json.loads(out)
    ours = features.GATES[minor]
    for name, gate in ours.items():
        assert name in release, f"1.{minor} has no gate {name}"
        theirs = release[name]
        assert (gate.default, gate.locked) == (theirs["default"], theirs["locked"]), name
        assert sorted(gate.needs) == theirs["needs"], name
    unknown = {g for g in release if g.startswith("DRA")} - set(ours) - NOT_ALLOCATION
    assert not unknown, f"1.{minor} has DRA gates gpudra does not follow: {sorted(unknown)}"


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short path (the kubelet sockets must fit in 108 bytes), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="kv-")) / "up"
    yield path
    for pid in still_running(recorded_pids(path), timeout=0).values():
        os.kill(pid, signal.SIGKILL)  # only if a test failed half-way; never when green
    shutil.rmtree(path.parent, ignore_errors=True)


@pytest.mark.parametrize("minor", COMPAT)
def test_the_demo_and_the_claim_path_run_on_the_compatibility_tier(
    minor: int, controlplane_for: Callable[[int], Path], workdir: Path
) -> None:
    version = kube_version(controlplane_for(minor))  # built outside the command's timing
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "up", "--kube-version", f"1.{minor}",
         "--exit-after-demo", "--timeout", "90", "--workdir", str(workdir)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"Kubernetes {version} " in out, out
    examples = demoexamples.load_examples()
    pods = [p for e in examples for p in e.pods]
    assert f"{len(pods)}/{len(pods)} pods as expected ({len(pods) - 1} Running)" in out, out
    assert "claim unsatisfiable/two-big-gpus: pending; gpudra explains:" in out, out
    assert "gpudra audit --verify: every claim's trail is complete" in out, out
    assert re.search(r"events, \d+ claims complete, 0 incomplete, 0 unreadable", out), out
    # Everything was unprepared again: no claim's CDI spec, no checkpoint entry left.
    nodes = sorted((workdir / "nodes").iterdir())
    assert len(nodes) >= 2, nodes
    for node in nodes:
        paths = NodePaths.under(node)
        specs = [p.name for p in paths.cdi_root.glob("*claim*")]
        assert specs == [], (node.name, specs)
        plugins = paths.kubelet_root / "plugins"
        for path in plugins.glob(f"*/{checkpointfile.FILENAME}"):
            assert checkpointfile.decode(path.read_bytes()).claims == {}, path
        for path in plugins.glob(f"*/{STATE_FILE}"):
            host = msgspec.json.decode(path.read_bytes(), type=SimHost)
            assert not host.mps and not host.pci_driver, (path, host)
    assert still_running(recorded_pids(workdir)) == {}
