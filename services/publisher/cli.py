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


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "publisher", help="render inventories into ResourceSlices and keep the API server in sync"
    )
    config.add_common_flags(parser)
    config.add_kubeconfig_flag(parser)
    parser.add_argument(
        "--force-registered",
        action="store_true",
        default=config.env("force-registered", "") == "true",
        help="publish nodes without waiting for their kubelet plugin presence record",
    )
    parser.add_argument(
        "--kube-version",
        type=kube_minor_arg,
        default=None,
        help="API server version for the slice layout, e.g. 1.34 (default: ask the server)",
    )
    parser.add_argument(
        "--additional-xids-to-ignore",
        type=xid_list_arg,
        default=xid_list_arg(config.env("additional-xids-to-ignore", "")),
        help="comma-separated XIDs whose taint gets effect None, beside 13,31,43,45,68,109",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=int(config.env("workers", str(DEFAULT_WORKERS))),
        help="nodes synced at once (each node's slices are written together)",
    )
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        default=float(config.env("kube-api-qps", str(DEFAULT_QPS))),
        help="API requests per second this replica may make (0: no limit)",
    )
    parser.add_argument(
        "--kube-api-burst",
        type=int,
        default=int(config.env("kube-api-burst", str(DEFAULT_BURST))),
        help="requests allowed at once above --kube-api-qps",
    )
    parser.add_argument(
        "--replica-id",
        default=config.env("replica-id", ""),
        help="this replica's unique name (the pod name); set it on every replica to run "
        "several that share the nodes through shard leases on the bus (empty: one replica "
        "publishes every node)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=int(config.env("shards", str(DEFAULT_SHARDS))),
        help="lease shards the nodes are split into (the same on every replica)",
    )
    parser.add_argument(
        "--resync-interval",
        type=float,
        default=float(config.env("resync-interval", "600")),
        help="seconds between full comparisons of all slices with the API server",
    )
    parser.add_argument(
        "--gpu-clique-label",
        action="store_true",
        default=config.env("gpu-clique-label", "") == "true",
        help="label each node nvidia.com/gpu.clique=<clusterUUID>.<cliqueID> from its GPUs' "
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
    parser.set_defaults(func=main)


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
