"""``gpudra allocate`` / ``gpudra explain``: structured allocation from files, no cluster.

Contract (external scenario suites call it):
``gpudra allocate -f FILE [-f FILE ...] [--node NODE] [--feature-gates NAME=bool,...]
[-o json|yaml|text]`` prints ``{"claims": [{namespace, name, status, node,
allocation, error, explanation}]}``; exit 0 whenever the input parsed, 2 with a
message naming the file and document when it did not. ``gpudra explain`` takes
the same arguments and prints, for people, why each claim is or is not allocated.

``gpudra allocator --kubeconfig F [--nats-url URL] [--pending-threshold 30s]
[--kube-feature-gates NAME=bool,...]`` runs the claim watcher (cluster mode).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from services.allocator import features as kube_features
from services.core import config, runner, supervisor

if TYPE_CHECKING:
    from services.allocator.offline import ClaimOutcome

log = logging.getLogger(__name__)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML or JSON with DeviceClasses, ResourceSlices, ResourceClaims, Nodes",
    )
    parser.add_argument("--node", help="allocate on this node only")
    parser.add_argument(
        "--feature-gates",
        default="",
        metavar="NAME=bool,...",
        help="Kubernetes gates (1.35 defaults: DRAAdminAccess and DRAPrioritizedList on)",
    )


def _outcomes(args: argparse.Namespace, explain: bool) -> list[ClaimOutcome] | None:
    # Imported here: the engine and CEL are heavy, and every service process builds this parser.
    from services.allocator.inputs import InputError, load
    from services.allocator.offline import OfflineAllocator

    try:
        features = kube_features.parse(args.feature_gates)
        inputs = load([Path(f) for f in args.files], features)
    except (InputError, kube_features.FeatureGateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return OfflineAllocator(inputs, features, explain=explain).run(args.node)


def _allocate(args: argparse.Namespace) -> int:
    outcomes = _outcomes(args, explain=True)
    if outcomes is None:
        return 2
    if args.output == "text":
        from services.allocator.offline import describe

        for outcome in outcomes:
            print("\n".join(describe(outcome)))
        return 0
    document: dict[str, Any] = {"claims": [o.to_json() for o in outcomes]}
    if args.output == "yaml":
        print(yaml.safe_dump(document, sort_keys=False), end="")
    else:
        print(json.dumps(document, indent=2))
    return 0


def _explain(args: argparse.Namespace) -> int:
    from services.allocator.offline import describe

    outcomes = _outcomes(args, explain=True)
    if outcomes is None:
        return 2
    for outcome in outcomes:
        print("\n".join(describe(outcome)))
    return 0


def duration(value: str) -> float:
    """``30s``, ``2m``, ``1h``, ``500ms`` or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 30s, 2m or 500ms, got {value!r}"
        )
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


def kube_gates(value: str) -> kube_features.Features:
    try:
        return kube_features.parse(value)
    except kube_features.FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _serve(args: argparse.Namespace) -> int:
    return runner.run("allocator", args, _watch(args))


async def _watch(args: argparse.Namespace) -> None:
    from services.allocator.watcher import ClaimWatcher, WatcherConfig
    from services.core.bus import Bus
    from services.core.kube import http_api

    settings = WatcherConfig(
        pending_threshold=args.pending_threshold, features=args.kube_feature_gates
    )
    stop = runner.stop_event()
    bus = await Bus.connect(args.nats_url, name="allocator")
    api = await http_api(args.kubeconfig or None)
    tasks = supervisor.current()
    tasks.spawn("claim-watcher", ClaimWatcher(api, bus, settings).run, fatal=True)
    await stop.wait()
    log.info("claim watcher stopping")
    await tasks.cancel("claim-watcher")
    with contextlib.suppress(Exception):
        await api.close()
    await bus.close()


def register(subparsers: Any) -> None:
    watcher = subparsers.add_parser(
        "allocator",
        help="watch ResourceClaims: lifecycle events, the claims bucket, why-pending Events",
    )
    config.add_common_flags(watcher)
    watcher.add_argument(
        "--kubeconfig",
        default=config.env("kubeconfig", ""),
        help="kubeconfig file (empty: the pod's service account)",
    )
    watcher.add_argument(
        "--pending-threshold",
        type=duration,
        default=duration(config.env("pending-threshold", "30s")),
        help="explain a claim once its pod has waited this long, and again every period",
    )
    watcher.add_argument(
        "--kube-feature-gates",
        type=kube_gates,
        default=kube_gates(config.env("kube-feature-gates", "")),
        metavar="NAME=bool,...",
        help="the scheduler's DRA gates for explanations (1.35 defaults)",
    )
    watcher.set_defaults(func=_serve)

    allocate = subparsers.add_parser(
        "allocate", help="allocate claims from files as kube-scheduler would (offline)"
    )
    _add_common(allocate)
    allocate.add_argument("-o", "--output", choices=("json", "yaml", "text"), default="json")
    allocate.set_defaults(func=_allocate)
    explain = subparsers.add_parser("explain", help="say why claims from files do (not) allocate")
    _add_common(explain)
    explain.set_defaults(func=_explain)
