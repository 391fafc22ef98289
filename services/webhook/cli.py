"""``gpudra webhook``: the validating admission webhook (TLS only).

    gpudra webhook --cert-file /tls/tls.crt --key-file /tls/tls.key \\
        [--address 0.0.0.0] [--port 9443] [--feature-gates MPSSupport=true,...]

``--feature-gates`` must be the node's (the chart passes the same value to
both): a config is refused at admission exactly when prepare would refuse it.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from services.core.process import config, serve


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "webhook",
        help="validating admission webhook: refuse claims with configs prepare would refuse",
    )
    config.add_common_flags(parser)
    parser.add_argument(
        "--cert-file",
        type=Path,
        default=Path(config.env("cert-file", "/tls/tls.crt")),
        help="PEM serving certificate (reloaded when it changes)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=Path(config.env("key-file", "/tls/tls.key")),
        help="PEM key of the serving certificate",
    )
    parser.add_argument("--address", default=config.env("address", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(config.env("port", "9443")))
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from services.webhook import certs

    try:
        certs.check(args.cert_file, args.key_file)
    except certs.CertificateError as exc:
        raise SystemExit(f"gpudra webhook: {exc}") from None
    from services.webhook import app

    return serve.main("webhook", args, functools.partial(app.start, args))
