"""Settings shared by every service: command-line flags with environment fallbacks.

Each flag ``--foo-bar`` reads ``GPUDRA_FOO_BAR`` when not given, so the same
binary is configured by a Helm chart (env) or a developer (flags).
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from services.core.bus.natsauth import Credentials
from services.core.kit.env import env as env  # every flag's fallback
from services.core.model import featuregates, shares

DEFAULT_NATS_URL = "tls://127.0.0.1:4222"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or env("node-name") or socket.gethostname()


def add_nats_flags(parser: argparse.ArgumentParser) -> None:
    """Where the bus is and who this process is on it (see services.core.bus.access)."""
    parser.add_argument(
        "--nats-url",
        default=env("nats-url", DEFAULT_NATS_URL),
        help="the bus: one server's URL, or a cluster's, comma-separated (tls://a:4222,tls://b:4222)",
    )
    parser.add_argument(
        "--nats-creds",
        type=Path,
        default=env("nats-creds") or None,
        help="file with this component's nkey seed (its identity on the bus)",
    )
    parser.add_argument(
        "--nats-token-file",
        type=Path,
        default=env("nats-token-file") or None,
        help="projected ServiceAccount token (audience <aud>:<role>) the bus's auth callout "
        "checks; read again on every reconnect, as the kubelet rotates it (in a cluster)",
    )
    parser.add_argument(
        "--nats-ca",
        type=Path,
        default=env("nats-ca") or None,
        help="CA certificate that signed the NATS server's (TLS)",
    )


def nats_credentials(args: argparse.Namespace) -> Credentials:
    return Credentials(creds=args.nats_creds, ca=args.nats_ca, token_file=args.nats_token_file)


EVENT_LOOPS = ("uvloop", "asyncio")


def add_common_flags(parser: argparse.ArgumentParser, *, node: bool = False) -> None:
    add_nats_flags(parser)
    parser.add_argument(
        "--nats-replicas",
        type=int,
        default=int(env("nats-replicas", "1")),
        help="JetStream replicas for the streams and buckets we create (3 in a cluster)",
    )
    parser.add_argument(
        "--max-inflight",
        type=_positive_int,
        default=env("max-inflight", "64"),
        help="bus requests this process handles at once; more wait in the client",
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=env("event-loop", "asyncio"),
        help="the event loop: asyncio's own (default) or uvloop (measured: no less CPU per "
        "claim on the whole path, longer queues at concurrency 16; docs/operations.md)",
    )
    parser.add_argument("--log-level", default=env("log-level", "info"))
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("metrics-port", "0")),
        help="serve this process's Prometheus metrics on PORT (0: off)",
    )
    parser.add_argument(
        "--metrics-address",
        default=env("metrics-address", "127.0.0.1"),
        help="address the metrics port listens on (0.0.0.0 in a cluster, for Prometheus)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=env("otlp-endpoint", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")),
        help="OTLP endpoint for traces (empty: tracing off); the other OTEL_EXPORTER_OTLP_* "
        "and OTEL_TRACES_SAMPLER* variables apply as the OpenTelemetry SDK reads them",
    )
    parser.add_argument(
        "--feature-gates",
        type=feature_gates_arg,
        default=env("feature-gates", ""),
        help=f"Name=bool,... of: {featuregates.valid_names()}",
    )
    parser.add_argument(
        shares.FLAG,
        dest="consumable_shares",
        type=consumable_shares_arg,
        default=env("consumable-shares", "disabled"),
        help="publish and prepare GPU and MIG devices as consumable shares: 'disabled', "
        f"'memory', 'unlimited' or a share count N (needs gate {featuregates.CONSUMABLE_SHARES})",
    )
    if node:
        parser.add_argument("--node-name", default=default_node_name())


def add_kubeconfig_flag(
    parser: argparse.ArgumentParser,
    help: str = "kubeconfig file (empty: the pod's service account)",
) -> None:
    """``--kubeconfig``: every process that talks to the API server."""
    parser.add_argument("--kubeconfig", default=env("kubeconfig", ""), help=help)


def add_kubelet_root_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--kubelet-root``: the node processes that find their files under the kubelet's root."""
    parser.add_argument(
        "--kubelet-root",
        type=Path,
        default=Path(env("kubelet-root", DEFAULT_KUBELET_ROOT)),
        help=help,
    )


def add_compute_domains_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--compute-domains``: the node services' and the publisher's part of the
    compute-domain.nvidia.com driver (the chart's computeDomains.enabled)."""
    parser.add_argument(
        "--compute-domains",
        action="store_true",
        default=env("compute-domains", "") == "true",
        help=help,
    )


def add_api_feature_flag(parser: argparse.ArgumentParser, flag: str, help: str) -> None:
    """``--<flag> auto|on|off``: a write gpudra makes only where the API server supports
    it (services.core.kube.claimstatus.wanted: ``auto`` asks the server's version)."""
    parser.add_argument(
        f"--{flag}",
        choices=("auto", "on", "off"),
        default=env(flag, "auto"),
        help=help,
    )


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"want a positive integer, got {value!r}")
    return number


def consumable_shares_arg(value: str) -> shares.SharesMode:
    try:
        return shares.parse_mode(value)
    except shares.SharesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def consumable_shares(args: argparse.Namespace, command: str) -> shares.SharesMode:
    """The mode, refused without its gate (the reference refuses it at start-up)."""
    mode: shares.SharesMode = args.consumable_shares
    try:
        shares.require_gate(mode, args.feature_gates)
    except shares.SharesError as exc:
        raise SystemExit(f"gpudra {command}: {exc}") from exc
    return mode


def feature_gates_arg(value: str) -> featuregates.FeatureGates:
    try:
        return featuregates.parse(value)
    except featuregates.FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
