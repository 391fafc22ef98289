"""``gpudra kubeletplugin``: serve the kubelet's DRA and registration sockets for one node."""

from __future__ import annotations

import argparse
import functools

from services.core.process import config, serve


def register(subparsers: config.Subparsers) -> None:
    config.service(
        subparsers,
        "kubeletplugin",
        "serve the kubelet DRA plugin sockets and forward prepare calls to the preparer",
        main,
        _flags,
    )


def _flags(parser: argparse.ArgumentParser) -> None:
    config.add_node_name_flag(parser)
    config.add_kubelet_root_flag(
        parser, "kubelet root directory (sockets go under plugins/ and plugins_registry/)"
    )
    config.flag(
        parser,
        "rolling-update-uid",
        str,
        "",
        "this pod's UID: socket names carry it so two plugin pods can overlap",
    )
    config.flag(
        parser,
        "prepare-timeout",
        _positive_seconds,
        "45",
        "longest wait for the preparer, in seconds (the kubelet's deadline may cut it)",
    )
    config.add_compute_domains_flag(
        parser,
        "also serve the compute-domain.nvidia.com driver (its own registration and DRA "
        "sockets), forwarding its claims to the preparer",
    )


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

    settings = config.settings(Settings, args, node=args.node_name)
    return serve.main("kubeletplugin", args, functools.partial(start, settings))
