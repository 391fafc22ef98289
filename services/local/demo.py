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
``gpudra up`` adds :data:`~services.local.stacknodes.GB200_DEMO_NODES` for it on
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

This module runs the demo; the examples are :mod:`services.local.demoexamples`,
what the cluster says about them :mod:`services.local.demoview`, what is printed
:mod:`services.local.demoreport`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

import yaml

from services.core.bus.access import Role
from services.local import REPO, images
from services.local.demoexamples import Example
from services.local.demoview import DemoResult, container_logs, observe
from services.local.stack import DRIVER_NAMESPACE, Stack


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
