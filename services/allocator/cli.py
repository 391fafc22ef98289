"""``gpudra allocator``: the claim watcher (cluster mode).

``gpudra allocator --kubeconfig F [--nats-url URL] [--pending-threshold 30s]
[--kube-version 1.N] [--kube-feature-gates NAME=bool,...]``. Explanations follow the
scheduler of the API server's own Kubernetes version (``GET /version``) unless
``--kube-version`` names one; the gates go on top of that version's defaults. The
offline commands over the same allocation code (``gpudra allocate``, ``gpudra
explain``) are in services/offline.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
from typing import Any

from services.allocator.structured import features as kube_features
from services.core.kit import supervisor
from services.core.process import config, runner

log = logging.getLogger(__name__)


def duration(value: str) -> float:
    """``30s``, ``2m``, ``1h``, ``500ms`` or plain seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a duration like 30s, 2m or 500ms, got {value!r}"
        )
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


def kube_version(value: str) -> int | None:
    """``1.37`` or ``v1.37.2`` -> 37; empty: ask the API server."""
    if not value:
        return None
    try:
        return kube_features.minor_of(value)
    except kube_features.FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def followed_minor(server: str) -> int:
    """The minor to follow for an API server of release ``server``: its own, else the
    nearest gpudra follows (said in the log: explanations may then differ)."""
    try:
        return kube_features.minor_of(server)
    except kube_features.FeatureGateError:
        pass
    digits = re.match(r"v?1\.(\d+)", server)
    newest, oldest = kube_features.MINORS[-1], kube_features.MINORS[0]
    minor = newest if digits is None or int(digits.group(1)) > newest else oldest
    log.warning(
        "API server %s is not a Kubernetes version gpudra follows; explaining as 1.%d",
        server or "(no version)",
        minor,
    )
    return minor


def _serve(args: argparse.Namespace) -> int:
    return runner.run("allocator", args, _watch(args))


async def _watch(args: argparse.Namespace) -> int | None:
    from services.allocator.watcher.watcher import ClaimWatcher, WatcherConfig
    from services.core.bus.access import Identity, Role
    from services.core.bus.client import Bus
    from services.core.kube.client import http_api, server_version
    from services.core.kube.resourceapi import versioned

    stop = runner.stop_event()
    raw_api = await http_api(args.kubeconfig or None)
    minor = args.kube_version or followed_minor(await server_version(raw_api))
    try:
        features = kube_features.parse(args.kube_feature_gates, minor)
    except kube_features.FeatureGateError as exc:
        log.error("bad --kube-feature-gates", extra={"error": str(exc)})
        await raw_api.close()
        return 2
    log.info("explaining as kube-scheduler %s (gates: %s)", features.version, features.spec())
    settings = WatcherConfig(pending_threshold=args.pending_threshold, features=features)
    bus = await Bus.connect(args.nats_url, name="allocator", identity=Identity(Role.ALLOCATOR))
    api = versioned(raw_api)
    tasks = supervisor.current()
    tasks.spawn("claim-watcher", ClaimWatcher(api, bus, settings).run, fatal=True)
    await stop.wait()
    log.info("claim watcher stopping")
    await tasks.cancel("claim-watcher")
    with contextlib.suppress(Exception):
        await api.close()
    await bus.close()
    return None


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
        "--kube-version",
        type=kube_version,
        default=kube_version(config.env("kube-version", "")),
        metavar="1.N",
        help="the Kubernetes version whose scheduler to follow (default: the API server's)",
    )
    watcher.add_argument(
        "--kube-feature-gates",
        default=config.env("kube-feature-gates", ""),
        metavar="NAME=bool,...",
        help="the scheduler's DRA gates for explanations, on top of that version's defaults",
    )
    watcher.set_defaults(func=_serve)
