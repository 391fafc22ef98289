"""``gpudra publisher``: publish every node's ResourceSlices from the inventories on the bus.

gpudra publisher [--kubeconfig F] [--force-registered] [--kube-version 1.35]
                 [--feature-gates DynamicMIG=true] [--additional-xids-to-ignore 48,63]
"""

from __future__ import annotations

import argparse
import functools
import re

from services.core.process import config, serve
from services.publisher.tuning import DEFAULT_BURST, DEFAULT_QPS, DEFAULT_SHARDS, DEFAULT_WORKERS


def register(subparsers: config.Subparsers) -> None:
    config.service(
        subparsers,
        "publisher",
        "render inventories into ResourceSlices and keep the API server in sync",
        main,
        _flags,
    )


def _flags(parser: argparse.ArgumentParser) -> None:
    config.add_kubeconfig_flag(parser)
    config.switch(
        parser,
        "force-registered",
        "publish nodes without waiting for their kubelet plugin presence record",
    )
    parser.add_argument(
        "--kube-version",
        type=kube_minor_arg,
        default=None,
        help="API server version for the slice layout, e.g. 1.34 (default: ask the server)",
    )
    config.flag(
        parser,
        "additional-xids-to-ignore",
        xid_list_arg,
        "",
        "comma-separated XIDs whose taint gets effect None, beside 13,31,43,45,68,109",
    )
    config.flag(
        parser,
        "workers",
        int,
        DEFAULT_WORKERS,
        "nodes synced at once (each node's slices are written together)",
    )
    config.flag(
        parser,
        "kube-api-qps",
        float,
        DEFAULT_QPS,
        "API requests per second this replica may make (0: no limit)",
    )
    config.flag(
        parser,
        "kube-api-burst",
        int,
        DEFAULT_BURST,
        "requests allowed at once above --kube-api-qps",
    )
    config.flag(
        parser,
        "replica-id",
        str,
        "",
        "this replica's unique name (the pod name); set it on every replica to run "
        "several that share the nodes through shard leases on the bus (empty: one replica "
        "publishes every node)",
    )
    config.flag(
        parser,
        "shards",
        int,
        DEFAULT_SHARDS,
        "lease shards the nodes are split into (the same on every replica)",
    )
    config.flag(
        parser,
        "resync-interval",
        float,
        600,
        "seconds between full comparisons of all slices with the API server",
    )
    config.switch(
        parser,
        "gpu-clique-label",
        "label each node nvidia.com/gpu.clique=<clusterUUID>.<cliqueID> from its GPUs' "
        "NVLink fabric facts (as GPU Feature Discovery does; removed where there is none)",
    )
    config.add_compute_domains_flag(
        parser,
        "also publish the compute-domain.nvidia.com slices (channel-0, daemon-0) of every "
        "node where that driver's kubelet plugin is registered",
    )
    config.add_api_feature_flag(
        parser,
        "binding-conditions",
        "with --compute-domains: bindingConditions on the channel devices, so that a pod "
        "binds only where its IMEX domain is Ready (gpudra domains sets them; give it the "
        "same value): auto on Kubernetes 1.36+",
    )


def kube_minor_arg(value: str) -> int:
    """``1.35``, ``v1.35.2`` or ``35`` -> 35."""
    match = re.fullmatch(r"v?(?:1\.)?(\d+)(?:\.\d+)?", value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a Kubernetes version like 1.35, got {value!r}")
    return int(match.group(1))


def xid_list_arg(value: str) -> frozenset[int]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if not v.isdigit()]
    if bad:
        raise argparse.ArgumentTypeError(f"XIDs must be non-negative integers, got {bad}")
    return frozenset(int(v) for v in items)


def main(args: argparse.Namespace) -> int:
    from services.publisher import app

    return serve.main("publisher", args, functools.partial(app.start, args))
