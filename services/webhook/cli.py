"""``gpudra webhook``: the validating admission webhook (TLS only).

    gpudra webhook --cert-file /tls/tls.crt --key-file /tls/tls.key \\
        [--address 0.0.0.0] [--port 9443] [--feature-gates MPSSupport=true,...] \\
        [--compute-domains [--kubeconfig F] [--namespace gpudra] [--domains-account A]]

``--feature-gates`` must be the node's (the chart passes the same value to
both): a config is refused at admission exactly when prepare would refuse it.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from services.core.process import config, serve


def register(sub: config.Subparsers) -> None:
    config.service(
        sub,
        "webhook",
        "validating admission webhook: refuse claims with configs prepare would refuse",
        main,
        _flags,
    )


def _flags(parser: argparse.ArgumentParser) -> None:
    config.flag(
        parser,
        "cert-file",
        Path,
        "/tls/tls.crt",
        "PEM serving certificate (reloaded when it changes)",
    )
    config.flag(parser, "key-file", Path, "/tls/tls.key", "PEM key of the serving certificate")
    config.flag(parser, "address", str, "127.0.0.1")
    config.flag(parser, "port", int, 9443)
    config.add_compute_domains_flag(
        parser,
        "admit a channel or daemon claim only for a ComputeDomain that exists (looked up "
        "through the API server), daemon claims only in --namespace and their templates "
        "only from the controller",
    )
    config.add_kubeconfig_flag(parser)
    config.flag(parser, "namespace", str, "gpudra", "the driver's namespace (--compute-domains)")
    config.flag(
        parser,
        "domains-account",
        str,
        "gpudra-domains",
        "the ComputeDomain controller's ServiceAccount in --namespace (--compute-domains)",
    )


def main(args: argparse.Namespace) -> int:
    from services.webhook import certs

    try:
        certs.check(args.cert_file, args.key_file)
    except certs.CertificateError as exc:
        raise SystemExit(f"gpudra webhook: {exc}") from None
    from services.webhook import app

    return serve.main("webhook", args, functools.partial(app.start, args))
