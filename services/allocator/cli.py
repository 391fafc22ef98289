"""``gpudra allocator``: the claim watcher (cluster mode).

``gpudra allocator --kubeconfig F [--nats-url URL] [--pending-threshold 30s]
[--kube-feature-gates NAME=bool,...]``. The offline commands over the same
allocation code (``gpudra allocate``, ``gpudra explain``) are in services/offline.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
from typing import TYPE_CHECKING, Any

from services.allocator.structured import features as kube_features
from services.core import config, runner, supervisor

if TYPE_CHECKING:
    pass

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


def kube_gates(value: str) -> kube_features.Features:
    try:
        return kube_features.parse(value)
    except kube_features.FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _serve(args: argparse.Namespace) -> int:
    return runner.run("allocator", args, _watch(args))


async def _watch(args: argparse.Namespace) -> None:
    from services.allocator.watcher.watcher import ClaimWatcher, WatcherConfig
    from services.core.access import Identity, Role
    from services.core.bus import Bus
    from services.core.kube import http_api
    from services.core.resourceapi import versioned

    settings = WatcherConfig(
        pending_threshold=args.pending_threshold, features=args.kube_feature_gates
    )
    stop = runner.stop_event()
    bus = await Bus.connect(args.nats_url, name="allocator", identity=Identity(Role.ALLOCATOR))
    api = versioned(await http_api(args.kubeconfig or None))
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
