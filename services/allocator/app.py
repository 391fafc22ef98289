"""The claim watcher's wiring: the API server's release to follow, the bus, the watcher,
and how full its streams are."""

from __future__ import annotations

import argparse
import functools
import logging
import re

from services.allocator.structured import features as kube_features
from services.allocator.watcher import auditwindow
from services.allocator.watcher.watcher import ClaimWatcher, WatcherConfig
from services.core.bus import subjects, usage
from services.core.bus.access import Identity, Role
from services.core.kube.client import server_version
from services.core.kube.resourceapi import versioned
from services.core.process.serve import Stack

log = logging.getLogger(__name__)


async def start(args: argparse.Namespace, stack: Stack) -> int | None:
    raw_api = await stack.kube(args.kubeconfig)
    minor = args.kube_version or followed_minor(await server_version(raw_api))
    try:
        features = kube_features.parse(args.kube_feature_gates, minor)
    except kube_features.FeatureGateError as exc:
        log.error("bad --kube-feature-gates", extra={"error": str(exc)})
        return 2
    log.info("explaining as kube-scheduler %s (gates: %s)", features.version, features.spec())
    settings = WatcherConfig(pending_threshold=args.pending_threshold, features=features)
    bus = await stack.bus(args.nats_url, name="allocator", identity=Identity(Role.ALLOCATOR))
    watcher = ClaimWatcher(versioned(raw_api), bus, settings)
    stack.spawn("claim-watcher", watcher.run)
    # How full CLAIMS and the claims bucket are, and whether CLAIMS still reaches back to
    # the first events of every claim allocated now (services/core/bus/usage.py).
    streams = [subjects.CLAIMS_STREAM, usage.bucket(subjects.CLAIMS_BUCKET)]
    then = functools.partial(auditwindow.record, watcher)
    stack.spawn("bus usage", functools.partial(usage.watch, bus, streams, then=then), fatal=False)
    return None


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
