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
import functools
import re

from services.allocator.structured import features as kube_features
from services.core.process import config, serve


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
    return config.parsed(kube_features.minor_of, value, kube_features.FeatureGateError)


def _serve(args: argparse.Namespace) -> int:
    from services.allocator import app

    return serve.main("allocator", args, functools.partial(app.start, args))


def register(subparsers: config.Subparsers) -> None:
    config.service(
        subparsers,
        "allocator",
        "watch ResourceClaims: lifecycle events, the claims bucket, why-pending Events",
        _serve,
        _flags,
    )


def _flags(parser: argparse.ArgumentParser) -> None:
    config.add_kubeconfig_flag(parser)
    config.flag(
        parser,
        "pending-threshold",
        duration,
        "30s",
        "explain a claim once its pod has waited this long, and again every period",
    )
    config.flag(
        parser,
        "kube-version",
        kube_version,
        "",
        "the Kubernetes version whose scheduler to follow (default: the API server's)",
        metavar="1.N",
    )
    config.flag(
        parser,
        "kube-feature-gates",
        str,
        "",
        "the scheduler's DRA gates for explanations, on top of that version's defaults",
        metavar="NAME=bool,...",
    )
