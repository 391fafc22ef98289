"""``gpudra up``: the whole driver on this machine, with a demo.

    gpudra up [--workdir DIR] [--no-examples] [--examples DIR] [--timeout 180]
              [--exit-after-demo] [--feature-gates G=true,...] [--jaeger] [--real-nodes]
              [--kube-version 1.N]

Starts embedded NATS, a real Kubernetes control plane (built by
services/local/controlplane/build.sh, so it runs from a source checkout), two
simulated GPU nodes (``gpu-node-h100`` as dgx-h100, ``gpu-node-a100`` as
dgx-a100 with its static MIG layout) each with discovery, preparer, kubelet
plugin and the kubelet's DRA manager, the publisher and the allocator's claim
watcher; applies examples/ and prints the slices, claims, pods and CDI ids.
An example with a ComputeDomain (a two-node IMEX job) adds two ``gb200-nvl72``
nodes of one NVLink clique, ``gpu-node-gb200-1`` and ``-2``, whose IMEX daemon pods
run as local processes; on real nodes such examples are left out.
Then it stays up until Ctrl-C or SIGTERM and stops everything it started.

Every process it started (nats-server, the control plane's components, the
kubelets, each gpudra service) is watched, as a cluster's kubelet watches its
pods: one that dies is reported at once (its PID, exit status or signal and the
tail of its log) and started again the same way (same arguments, identity, ports;
nats-server on the same port and store) after 1 s, doubling to 30 s if it keeps
dying; the stack stays up. Restarts are counted in ``supervision.json`` in the work
directory and listed when it stops. Stopping ends the watch first.

``--kube-version`` runs another Kubernetes release than the default 1.37: 1.34, 1.35
or 1.36, the compatibility tier (each built from the Go module proxy on first use
and cached); the allocator's explanations follow the release it runs.

``--jaeger`` also starts Jaeger v2 (built by services/local/jaeger/build.sh,
in-memory storage) first, every gpudra process exports its spans to it, and
each claim of the demo is printed with the URL of its trace (one trace per
claim: its id is derived from the claim UID).

``--real-nodes`` runs each node as a real one (services/local/node.py):
containerd (built by services/local/containerd/build.sh), runc and the real
kubelet in the node's own mount namespace, with the simulated driver root and
device nodes; every example pod runs in real containers (a local busybox image
in place of the examples' images, never pulled) and each container's output
(the stand-in ``nvidia-smi -L``) is printed. Without root, cgroups, runc or
busybox-static it says why and runs kubelet-dra instead.

``--exit-after-demo`` stops after the demo: it deletes the examples and runs
``gpudra audit --verify``; exit 0 only if every pod ended as its example
expects (Running, or Pending with gpudra's explanation) and every claim's
event trail is complete (the pending claim's closed by its deletion).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from services.core.process import config

if TYPE_CHECKING:  # imported when run: every gpudra command builds this parser
    from services.local.demoexamples import Example
    from services.local.nodetools import NodeTools
    from services.local.stack import Stack


class _Interrupted(BaseException):
    """SIGINT or SIGTERM while starting or running."""


def register(subparsers: config.Subparsers) -> None:
    parser = config.documented(
        subparsers,
        "up",
        "run NATS, a real control plane and every gpudra service for two simulated nodes",
        __doc__,
    )
    # Only --kube-version falls back to a variable (GPUDRA_KUBE_VERSION): the others
    # read none, so they are not config.flag or config.switch, which would add one.
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep logs, kubeconfig and node files here (default: a temp dir, removed after "
        "a clean stop)",
    )
    parser.add_argument("--no-examples", action="store_true", help="start the stack only")
    parser.add_argument("--examples", type=Path, help="directory of example manifests")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=180.0,
        help="seconds to wait for the examples' pods (default 180)",
    )
    parser.add_argument(
        "--exit-after-demo",
        action="store_true",
        help="stop after the demo; exit 0 only if every pod ended as expected",
    )
    parser.add_argument(
        "--feature-gates",
        type=config.feature_gates_arg,
        default=None,
        help="driver gates (default: MPSSupport, PassthroughSupport, TimeSlicingSettings on)",
    )
    parser.add_argument(
        "--jaeger",
        action="store_true",
        help="start Jaeger v2 and export every process's traces to it; print each demo "
        "claim's trace URL",
    )
    parser.add_argument(
        "--real-nodes",
        action="store_true",
        help="containerd and the real kubelet run the pods in real containers (needs root "
        "and cgroups; otherwise kubelet-dra, saying why)",
    )
    config.flag(
        parser,
        "kube-version",
        str,
        None,
        "the Kubernetes release to run: 1.37 (default), or 1.34, 1.35, 1.36 (built on "
        "first use and cached)",
        metavar="1.N",
    )
    parser.add_argument(
        "--no-webhook",
        action="store_true",
        help="do not run gpudra webhook (bad configs are then refused only at prepare)",
    )
    parser.set_defaults(func=run)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value}")
    return seconds


def _say(line: str = "") -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    from services.local import demoexamples, stacknodes, stackprocs
    from services.local import stack as stacks

    examples: list[demoexamples.Example] = []
    if not args.no_examples:
        try:
            examples = demoexamples.load_examples(args.examples or demoexamples.EXAMPLES_DIR)
        except demoexamples.ExampleError as exc:
            print(f"gpudra up: {exc}", file=sys.stderr)
            return 2
    gates = args.feature_gates.spec() if args.feature_gates is not None else stacks.DEMO_GATES
    tools = _real_node_tools(args.kube_version) if args.real_nodes else None
    if tools is not None:  # real nodes: none in an NVLink fabric (docs/computedomains.md)
        for example in [e for e in examples if e.domains]:
            _say(f"{example.name}: left out on real nodes (ComputeDomains need simulated nodes)")
        examples = demoexamples.gpu_only(examples)
    domains = any(e.domains for e in examples)
    try:
        stack = stacks.Stack(
            stacknodes.DEMO_NODES + (stacknodes.GB200_DEMO_NODES if domains else ()),
            workdir=args.workdir,
            gates=gates,
            prepare_timeout=stacks.DOMAIN_DEMO_PREPARE_TIMEOUT if domains else None,
            jaeger=args.jaeger,
            real_nodes=tools is not None,
            node_tools=tools,
            kube_version=args.kube_version,
            webhook=not args.no_webhook,
            supervise=True,
            say=lambda line: _say(f"gpudra up: {line}"),
        )
    except stackprocs.StackError as exc:
        print(f"gpudra up: {exc}", file=sys.stderr)
        return 2

    stopping = False

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        if not stopping:
            raise _Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = True
    try:
        status = _up(stack, examples, args)
        failed = status != 0
        return status
    except _Interrupted as sig:
        _say(f"{sig}: stopping")
        failed = False
        return 0
    except (stackprocs.StackError, RuntimeError, TimeoutError) as exc:
        print(f"gpudra up: {exc}", file=sys.stderr)
        return 1
    finally:
        stopping = True
        _stop(stack, keep=failed or args.workdir is not None)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _real_node_tools(kube_version: str | None = None) -> NodeTools | None:
    """The real nodes' binaries (containerd built if needed), or None after saying
    why real nodes cannot run here."""
    from services.local import node, nodetools
    from services.local.component import ControlPlaneError
    from services.local.kubebinary import build_controlplane

    reason = node.unavailable()
    if reason is None:
        try:
            binary = build_controlplane(version=kube_version)
            return nodetools.NodeTools.find(binary, hooks_from=build_controlplane())
        except (nodetools.NodeError, ControlPlaneError) as exc:
            reason = str(exc)
    _say(f"gpudra up: --real-nodes: {reason}; running kubelet-dra instead (no containers)")
    return None


def _up(stack: Stack, examples: list[Example], args: argparse.Namespace) -> int:
    from services.local import demo, demoreport, stackprocs

    started = time.monotonic()
    _say(f"gpudra up: starting in {stack.workdir} (driver gates {stack.gates})")
    stack.start()
    _say(f"stack up after {time.monotonic() - started:.1f}s:")
    _say(f"  nats            {stack.nats.url} (TLS, CA {stack.nats.access.ca})")
    _say(f"                  one identity per component: {stack.nats.access.users}/*.nk")
    _say(
        f"  kube-apiserver  {stack.cp.server}, Kubernetes {stack.cp.kube_version} "
        "(+ etcd, kube-scheduler, kube-controller-manager)"
    )
    kubelet = "containerd, kubelet (real containers)" if stack.real_nodes else "kubelet-dra"
    for node in stack.nodes.values():
        _say(
            f"  {node.name:15} fleet {node.spec.fleet}: discovery, preparer, kubeletplugin, "
            f"{kubelet}"
        )
    _say("  cluster-wide    publisher, allocator (claim watcher), domains (ComputeDomains)")
    if stack.webhook:
        _say("  admission       gpudra webhook (ValidatingWebhookConfiguration gpudra-webhook)")
    if stack.jaeger is not None:
        _say(f"  jaeger          query API and UI {stack.jaeger.ui}, OTLP {stack.jaeger.otlp_grpc}")
    _say(
        "  supervised      every process above: a death is reported here and the process "
        "restarted (1s, doubling to 30s)"
    )
    _say(f"                  restarts counted in {stack.workdir / stackprocs.SUPERVISION_FILE}")
    _say("metrics (Prometheus, OpenMetrics with exemplars), one port per process:")
    for name, port in stack.metrics_ports.items():
        _say(f"  {name:36} http://127.0.0.1:{port}/metrics")
    _say()
    for line in demoreport.describe_slices(stack):
        _say(line)
    ok = True
    if examples:
        _say()
        _say(f"applying {len(examples)} examples from {examples[0].path.parent} ...")
        demo.apply_examples(stack, examples)
        result = demo.wait_for_examples(stack, examples, args.timeout)
        _say()
        trace_url = None if stack.jaeger is None else stack.jaeger.trace_url
        for line in demoreport.describe_result(result, examples, trace_url):
            _say(line)
        ok = result.ok
    _say()
    kubectl = " ".join(stack.cp.command("kubectl"))
    _say(f"kubeconfig: {stack.cp.kubeconfig}")
    _say(f"  {kubectl} --kubeconfig {stack.cp.kubeconfig} get resourceslices,resourceclaims -A")
    _say(f"logs: {stack.logs_dir}")
    _say("audit trail (read-only auditor):")
    _say(f"  {' '.join(demo.audit_argv(stack, '-o', 'table'))}")
    if args.exit_after_demo:
        if examples:
            ok = _close_examples(stack, examples, args) and ok
        return 0 if ok else 1
    _say("up; Ctrl-C stops everything")
    while True:  # the supervisor's thread reports and restarts; we wait for a signal
        time.sleep(1)


def _close_examples(stack: Stack, examples: list[Example], args: argparse.Namespace) -> bool:
    """Delete the examples, then verify every claim's trail ends (``gpudra audit --verify``)."""
    from services.local import demo

    _say()
    _say("deleting the examples ...")
    demo.delete_examples(stack, examples, args.timeout)
    complete, said = demo.verify_trail(stack, wait=30.0)
    _say("gpudra audit --verify: " + ("every claim's trail is complete" if complete else "FAILED"))
    for line in said:
        _say(f"  {line}")
    return complete


def _stop(stack: Stack, keep: bool) -> None:
    started = time.monotonic()
    stack.stop()  # the supervision first: nothing restarts while it stops
    if stack.supervisor is not None:
        _say(f"restarts while up: {stack.supervisor.summary()}")
    if keep:
        _say(f"stopped after {time.monotonic() - started:.1f}s; work dir kept: {stack.workdir}")
    else:
        stack.cleanup()
        _say(f"stopped after {time.monotonic() - started:.1f}s")
