"""``gpudra domains``: the ComputeDomain controller (docs/computedomains.md).

gpudra domains [--kubeconfig F] [--namespace gpudra] [--daemon-image IMAGE]
               [--daemon-nats-ca-secret SECRET] [--daemon-env NAME=value]
               [--status-batch 0.1] [--sweep-interval 600]
               [--binding-conditions auto|on|off]
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from typing import Any

from services.core.model import computedomain as cd
from services.core.model import featuregates
from services.core.process import config, serve

log = logging.getLogger(__name__)


def env_pair(value: str) -> tuple[str, str]:
    """``NAME=value`` -> (NAME, value); the name must be a valid variable name."""
    name, sep, rest = value.partition("=")
    if not sep or not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise argparse.ArgumentTypeError(f"want NAME=value with a variable name, got {value!r}")
    return name, rest


def positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return number


def register(subparsers: config.Subparsers) -> None:
    config.service(
        subparsers,
        "domains",
        "the ComputeDomain controller: templates and IMEX DaemonSets, status from the bus",
        main,
        _flags,
    )


def _flags(parser: argparse.ArgumentParser) -> None:
    config.add_kubeconfig_flag(parser)
    config.flag(
        parser,
        "namespace",
        str,
        "gpudra",
        "the driver's namespace: where the IMEX DaemonSets and their templates go",
    )
    config.flag(parser, "daemon-image", str, "gpudra:latest")
    config.flag(parser, "daemon-image-pull-policy", str, "IfNotPresent")
    config.flag(
        parser,
        "daemon-imex-mode",
        str,
        "real",
        "what the daemons run: NVIDIA's nvidia-imex, or the simulated stand-in",
        choices=("real", "simulated"),
    )
    parser.add_argument(
        "--daemon-env",
        type=env_pair,
        action="append",
        default=[],
        help="NAME=value for the IMEX daemon containers (repeatable)",
    )
    _bus_flags(parser)
    config.flag(
        parser,
        "max-nodes-per-imex-domain",
        int,
        cd.MAX_NODES_PER_IMEX_DOMAIN,
        "indices per clique (the reference's MAX_NODES_PER_IMEX_DOMAIN)",
    )
    config.flag(
        parser,
        "status-batch",
        positive,
        "0.1",
        "seconds a status write waits to take several membership changes at once",
    )
    config.add_api_feature_flag(
        parser,
        "binding-conditions",
        "set the binding conditions of channel claims (compute-domain.nvidia.com/"
        "IMEXDomainReady, IMEXDomainFailed) so that a pod binds only where its IMEX domain is "
        "Ready: auto on Kubernetes 1.36+; give the publisher the same value",
    )
    config.flag(
        parser,
        "sweep-interval",
        positive,
        "600",
        "seconds between sweeps for what deleted domains left behind",
    )


def _bus_flags(parser: argparse.ArgumentParser) -> None:
    """The daemons' own bus credentials in a cluster (objects.DaemonBus)."""
    config.flag(
        parser,
        "daemon-nats-ca-secret",
        str,
        "",
        "Secret (driver's namespace) whose ca.crt the daemons trust the bus by; with it "
        "each daemon pod mounts a projected token of audience <audience>:imex-daemon; "
        "empty: no bus credentials in the pods (daemons run by gpudra up get theirs)",
    )
    config.flag(
        parser,
        "daemon-nats-url",
        str,
        "",
        "where the daemons connect (empty: this controller's --nats-url)",
    )
    config.flag(
        parser,
        "daemon-nats-audience",
        str,
        "gpudra-nats",
        "the auth callout's audience prefix (the chart's nats.auth.audience)",
    )
    config.flag(
        parser,
        "daemon-nats-token-seconds",
        int,
        3600,
        "lifetime of the daemons' projected bus tokens (the kubelet renews them)",
    )


def daemon_bus(args: argparse.Namespace) -> Any:
    """The DaemonBus the flags describe, or None without a CA Secret."""
    from services.domains.objects import DaemonBus

    if not args.daemon_nats_ca_secret:
        return None
    return DaemonBus(
        url=args.daemon_nats_url or args.nats_url,
        ca_secret=args.daemon_nats_ca_secret,
        audience=args.daemon_nats_audience,
        token_seconds=args.daemon_nats_token_seconds,
    )


def main(args: argparse.Namespace) -> int:
    if args.daemon_nats_token_seconds < 600:  # the API server's least for a projected token
        print("gpudra domains: --daemon-nats-token-seconds must be at least 600", file=sys.stderr)
        return 2
    from services.domains import app

    return serve.main("domains", args, functools.partial(app.start, settings(args), args))


def settings(args: argparse.Namespace) -> Any:
    """The controller's settings from the flags."""
    from services.domains.objects import DaemonSettings
    from services.domains.service import ControllerConfig

    return ControllerConfig(
        daemon=DaemonSettings(
            namespace=args.namespace,
            image=args.daemon_image,
            image_pull_policy=args.daemon_image_pull_policy,
            max_nodes=args.max_nodes_per_imex_domain,
            feature_gates=args.feature_gates.spec(),
            env={"GPUDRA_IMEX_MODE": args.daemon_imex_mode, **dict(args.daemon_env)},
            bus=daemon_bus(args),
        ),
        batch_s=args.status_batch,
        sweep_s=args.sweep_interval,
        binding_conditions=args.binding_conditions,
        cliques=args.feature_gates.enabled(featuregates.COMPUTE_DOMAIN_CLIQUES),
    )
