"""Settings shared by every service: command-line flags with environment fallbacks.

Each flag ``--foo-bar`` reads ``GPUDRA_FOO_BAR`` when not given, so the same
binary is configured by a Helm chart (env) or a developer (flags). A service
declares each of its own with :func:`flag` (a value) or :func:`switch` (on or
off), which derive the flag, the variable and the typed default from one name.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from services.core.bus.natsauth import Credentials
from services.core.kit.env import env as env  # every flag's fallback
from services.core.model import featuregates, shares

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Where a module registers its sub-commands, what one runs (its exit status), and how
# a service adds its own flags.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Command: TypeAlias = Callable[[argparse.Namespace], int]
Flags: TypeAlias = Callable[[argparse.ArgumentParser], None]

T = TypeVar("T")
S = TypeVar("S", bound="DataclassInstance")

DEFAULT_NATS_URL = "tls://127.0.0.1:4222"
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or env("node-name") or socket.gethostname()


def flag(
    parser: argparse._ActionsContainer,
    name: str,
    type: Callable[[str], Any] = str,
    default: object = "",
    help: str | None = None,
    *,
    env_name: str = "",
    lazy: bool = False,
    **options: Any,
) -> argparse.Action:
    """``--<name>``: given, else ``GPUDRA_<NAME>`` (:func:`env`; ``env_name`` where the
    variable's name is not the flag's), else ``default``; a value ``type`` makes of it.

    The variable's text, or ``str(default)``, is converted by ``type`` as the parser is
    built, so the default is typed as a given value is; with ``lazy`` argparse converts it
    only when it parses, so that a bad variable is a usage error as a bad flag is.
    ``default=None``: None unless the variable is set (a setting that may be absent).
    ``options`` go to :meth:`argparse.ArgumentParser.add_argument` (choices, metavar, dest).
    """
    text = env(env_name or name, "" if default is None else str(default))
    value: Any = None
    if text or default is not None:
        value = text if lazy else type(text)  # argparse converts a lazy one as it parses
    return parser.add_argument(f"--{name}", type=type, default=value, help=help, **options)


def switch(parser: argparse._ActionsContainer, name: str, help: str) -> argparse.Action:
    """``--<name>``: on when given, or when ``GPUDRA_<NAME>`` is ``true``."""
    return parser.add_argument(
        f"--{name}", action="store_true", default=env(name, "") == "true", help=help
    )


def add_nats_flags(parser: argparse.ArgumentParser) -> None:
    """Where the bus is and who this process is on it (see services.core.bus.access)."""
    flag(
        parser,
        "nats-url",
        str,
        DEFAULT_NATS_URL,
        "the bus: one server's URL, or a cluster's, comma-separated (tls://a:4222,tls://b:4222)",
    )
    flag(
        parser,
        "nats-creds",
        Path,
        None,
        "file with this component's nkey seed (its identity on the bus)",
        lazy=True,
    )
    flag(
        parser,
        "nats-token-file",
        Path,
        None,
        "projected ServiceAccount token (audience <aud>:<role>) the bus's auth callout "
        "checks; read again on every reconnect, as the kubelet rotates it (in a cluster)",
        lazy=True,
    )
    flag(
        parser,
        "nats-ca",
        Path,
        None,
        "CA certificate that signed the NATS server's (TLS)",
        lazy=True,
    )


def nats_credentials(args: argparse.Namespace) -> Credentials:
    return Credentials(creds=args.nats_creds, ca=args.nats_ca, token_file=args.nats_token_file)


EVENT_LOOPS = ("uvloop", "asyncio")


def service(
    subparsers: Subparsers, name: str, help: str, main: Command, flags: Flags
) -> argparse.ArgumentParser:
    """``gpudra <name>``: a service's sub-command, run by ``main``: the flags every
    service has (:func:`add_common_flags`), then its own (``flags(parser)``)."""
    parser = subparsers.add_parser(name, help=help)
    add_common_flags(parser)
    flags(parser)
    parser.set_defaults(func=main)
    return parser


def documented(
    subparsers: Subparsers, name: str, help: str, doc: str | None
) -> argparse.ArgumentParser:
    """``gpudra <name>``: a sub-command whose ``--help`` shows ``doc`` (its module's
    docstring) as it is written."""
    return subparsers.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def settings(cls: type[S], args: argparse.Namespace, **given: Any) -> S:
    """A service's settings (the dataclass ``cls``) from its flags: each field as
    ``given``, else the value of the flag of its name, else the field's default."""
    names = {f.name for f in dataclasses.fields(cls)} - given.keys()
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)}, **given)


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    add_nats_flags(parser)
    add_replicas_flag(
        parser, "JetStream replicas for the streams and buckets we create (3 in a cluster)"
    )
    flag(
        parser,
        "max-inflight",
        _positive_int,
        64,
        "bus requests this process handles at once; more wait in the client",
        lazy=True,
    )
    flag(
        parser,
        "event-loop",
        str,
        "asyncio",
        "the event loop: asyncio's own (default) or uvloop (measured: no less CPU per "
        "claim on the whole path, longer queues at concurrency 16; docs/operations.md)",
        choices=EVENT_LOOPS,
    )
    flag(parser, "log-level", str, "info")
    flag(parser, "metrics-port", int, 0, "serve this process's Prometheus metrics on PORT (0: off)")
    flag(
        parser,
        "metrics-address",
        str,
        "127.0.0.1",
        "address the metrics port listens on (0.0.0.0 in a cluster, for Prometheus)",
    )
    flag(
        parser,
        "otlp-endpoint",
        str,
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
        "OTLP endpoint for traces (empty: tracing off); the other OTEL_EXPORTER_OTLP_* "
        "and OTEL_TRACES_SAMPLER* variables apply as the OpenTelemetry SDK reads them",
    )
    flag(
        parser,
        "feature-gates",
        feature_gates_arg,
        "",
        f"Name=bool,... of: {featuregates.valid_names()}",
        lazy=True,
    )
    flag(
        parser,
        shares.FLAG.removeprefix("--"),
        consumable_shares_arg,
        "disabled",
        "publish and prepare GPU and MIG devices as consumable shares: 'disabled', "
        f"'memory', 'unlimited' or a share count N (needs gate {featuregates.CONSUMABLE_SHARES})",
        lazy=True,
    )


def add_node_name_flag(parser: argparse.ArgumentParser) -> None:
    """``--node-name``: the node services' node (NODE_NAME, else the host's name)."""
    parser.add_argument("--node-name", default=default_node_name())


def add_replicas_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--nats-replicas``: every process that creates streams and buckets on the bus."""
    flag(parser, "nats-replicas", int, 1, help)


def add_kubeconfig_flag(
    parser: argparse.ArgumentParser,
    help: str = "kubeconfig file (empty: the pod's service account)",
) -> None:
    """``--kubeconfig``: every process that talks to the API server."""
    flag(parser, "kubeconfig", str, "", help)


def add_kubelet_root_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--kubelet-root``: the node processes that find their files under the kubelet's root."""
    flag(parser, "kubelet-root", Path, DEFAULT_KUBELET_ROOT, help)


def add_compute_domains_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """``--compute-domains``: the node services' and the publisher's part of the
    compute-domain.nvidia.com driver (the chart's computeDomains.enabled)."""
    switch(parser, "compute-domains", help)


def add_api_feature_flag(parser: argparse.ArgumentParser, name: str, help: str) -> None:
    """``--<name> auto|on|off``: a write gpudra makes only where the API server supports
    it (services.core.kube.claimstatus.wanted: ``auto`` asks the server's version)."""
    flag(parser, name, str, "auto", help, choices=("auto", "on", "off"))


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"want a positive integer, got {value!r}")
    return number


def parsed(parse: Callable[[str], T], value: str, error: type[Exception]) -> T:
    """``parse(value)``, its ``error`` a usage error: a flag's type says what is wrong
    with the value, where argparse would say only that it is invalid."""
    try:
        return parse(value)
    except error as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def consumable_shares_arg(value: str) -> shares.SharesMode:
    return parsed(shares.parse_mode, value, shares.SharesError)


def consumable_shares(args: argparse.Namespace, command: str) -> shares.SharesMode:
    """The mode, refused without its gate (the reference refuses it at start-up)."""
    mode: shares.SharesMode = args.consumable_shares
    try:
        shares.require_gate(mode, args.feature_gates)
    except shares.SharesError as exc:
        raise SystemExit(f"gpudra {command}: {exc}") from exc
    return mode


def feature_gates_arg(value: str) -> featuregates.FeatureGates:
    return parsed(featuregates.parse, value, featuregates.FeatureGateError)
