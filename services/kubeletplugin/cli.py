"""``gpudra kubeletplugin``: serve the kubelet's DRA and registration sockets for one node."""

from __future__ import annotations

import argparse
import functools

from services.core.process import config, serve


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "kubeletplugin",
        help="serve the kubelet DRA plugin sockets and forward prepare calls to the preparer",
    )
    config.add_common_flags(parser, node=True)
    config.add_kubelet_root_flag(
        parser, "kubelet root directory (sockets go under plugins/ and plugins_registry/)"
    )
    parser.add_argument(
        "--rolling-update-uid",
        default=config.env("rolling-update-uid", ""),
        help="this pod's UID: socket names carry it so two plugin pods can overlap",
    )
    parser.add_argument(
        "--prepare-timeout",
        type=_positive_seconds,
        default=_positive_seconds(config.env("prepare-timeout", "45")),
        help="longest wait for the preparer, in seconds (the kubelet's deadline may cut it)",
    )
    config.add_compute_domains_flag(
        parser,
        "also serve the compute-domain.nvidia.com driver (its own registration and DRA "
        "sockets), forwarding its claims to the preparer",
    )
    parser.set_defaults(func=main)


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds as a number, got {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return seconds


def main(args: argparse.Namespace) -> int:
    from services.kubeletplugin.app import Settings, start

    settings = Settings(
        node=args.node_name,
        kubelet_root=args.kubelet_root,
        nats_url=args.nats_url,
        rolling_update_uid=args.rolling_update_uid,
        prepare_timeout=args.prepare_timeout,
        compute_domains=args.compute_domains,
    )
    return serve.main("kubeletplugin", args, functools.partial(start, settings))
