"""``gpudra nats-auth`` (the bus's auth callout) and ``gpudra nats-keygen`` (its keys).

    gpudra nats-auth --issuer-seed-file /keys/issuer.nk --nats-creds /keys/user.nk \\
        --nats-ca /tls/ca.crt --grants preparer=gpu-system/gpudra-node,... [--audience gpudra-nats]
    gpudra nats-keygen --namespace gpu-system --secret gpudra-nats-auth \\
        --configmap gpudra-nats-auth-public

``--grants ROLE=NAMESPACE/SERVICEACCOUNT,...`` (repeatable, or ``GPUDRA_GRANTS``)
says which ServiceAccount may connect as which role; a client's token names the
role by its audience, ``<audience>:<role>``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path

from services.core.process import config, serve
from services.natsauth import grants as g

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def register(sub: config.Subparsers) -> None:
    config.service(
        sub,
        "nats-auth",
        "the bus's auth callout: ServiceAccount tokens -> bus identities",
        _run_auth,
        _auth_flags,
    )
    _register_keygen(sub)


def _auth_flags(parser: argparse.ArgumentParser) -> None:
    config.flag(
        parser,
        "issuer-seed-file",
        Path,
        None,
        "the account nkey seed that signs user JWTs (nats-server trusts its public key)",
        lazy=True,
    )
    parser.add_argument(
        "--grants",
        type=_grant_arg,
        action="append",
        default=None,
        help="ROLE=NAMESPACE/SERVICEACCOUNT[,...]: that account may connect as ROLE "
        "(repeatable; default GPUDRA_GRANTS)",
    )
    config.flag(
        parser,
        "audience",
        str,
        "gpudra-nats",
        "token audiences are AUDIENCE:ROLE (gpudra-nats:preparer)",
    )
    config.flag(
        parser,
        "account",
        str,
        "GPUDRA",
        "the nats-server account every gpudra identity is placed in",
    )
    config.flag(
        parser,
        "admin-job-prefix",
        str,
        "",
        "admin only for a token bound to a running pod of a Job named PREFIX* that has not "
        "finished (the chart's <release>-provision-); empty: nobody may be admin",
    )
    config.add_kubeconfig_flag(parser, "for TokenReviews (empty: the pod's service account)")


def _grant_arg(value: str) -> str:
    try:
        g.parse_grants([value])
    except g.GrantError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def _run_auth(args: argparse.Namespace) -> int:
    grants = g.parse_grants(args.grants or [config.env("grants")])
    if not grants:
        raise SystemExit("gpudra nats-auth: no --grants (or GPUDRA_GRANTS): nobody could connect")
    if args.issuer_seed_file is None:
        raise SystemExit("gpudra nats-auth: --issuer-seed-file is required")
    from services.natsauth import keys

    try:
        signer = keys.load_signer(args.issuer_seed_file)
    except keys.KeysError as exc:
        raise SystemExit(f"gpudra nats-auth: {exc}") from None
    from services.natsauth import app

    start = functools.partial(app.start, args, grants, signer)
    return serve.main("nats-auth", args, start)


def _register_keygen(sub: config.Subparsers) -> None:
    parser = sub.add_parser(
        "nats-keygen",
        help="make the auth callout's keys once: seeds in a Secret, public keys in a ConfigMap",
    )
    config.flag(parser, "namespace")
    parser.add_argument("--secret", required=True, help="Secret for the seeds (kept if present)")
    parser.add_argument("--configmap", required=True, help="ConfigMap for the public keys")
    config.add_kubeconfig_flag(parser)
    parser.set_defaults(func=_run_keygen)


def _run_keygen(args: argparse.Namespace) -> int:
    import asyncio

    from services.core.kube.client import http_api
    from services.natsauth import keys

    namespace = args.namespace or _own_namespace()

    async def run() -> dict[str, str]:
        api = await http_api(args.kubeconfig or None)
        try:
            return await keys.ensure(api, namespace, args.secret, args.configmap)
        finally:
            await api.close()

    public = asyncio.run(run())
    print(json.dumps({"namespace": namespace, **public}))
    return 0


def _own_namespace() -> str:
    try:
        return NAMESPACE_FILE.read_text().strip()
    except OSError:
        return os.environ.get("POD_NAMESPACE", "default")
