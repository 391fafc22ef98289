"""The auth callout's wiring: TokenReview on the API server, the callout on its own NATS
connection (the callout user answers $SYS.REQ.USER.AUTH; it is no gpudra identity)."""

from __future__ import annotations

import argparse
import logging

import nats

from services.core.bus.access import Role
from services.core.bus.natsjwt import Signer
from services.core.process import config
from services.core.process.serve import Stack
from services.natsauth import grants as g
from services.natsauth.adminpod import ProvisionJob
from services.natsauth.authorize import Authorizer
from services.natsauth.service import Callout
from services.natsauth.tokenreview import TokenReviewer

log = logging.getLogger(__name__)


async def start(
    args: argparse.Namespace,
    grants: dict[g.Account, frozenset[Role]],
    signer: Signer,
    stack: Stack,
) -> None:
    api = await stack.kube(args.kubeconfig)
    admin = ProvisionJob(api, args.admin_job_prefix)
    authorizer = Authorizer(TokenReviewer(api), grants, args.audience, admin)
    callout = Callout(authorizer, signer, account=args.account, max_inflight=args.max_inflight)
    stack.closing(callout.close, "the callout")
    creds = config.nats_credentials(args)
    nc = await nats.connect(
        servers=[args.nats_url],
        name="nats-auth",
        nkeys_seed_str=creds.seed(),
        tls=creds.tls(),
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
    )
    stack.closing(nc.drain, "the callout's NATS connection")
    await callout.serve(nc)
    log.info(
        "answering authorization requests",
        extra={
            "issuer": signer.public_key,
            "grants": g.describe(grants),
            "admin_job_prefix": args.admin_job_prefix,
        },
    )
