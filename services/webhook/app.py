"""The webhook's wiring: the admission server, its certificate watch, and with
``--compute-domains`` the API server, where a claim's ComputeDomain is looked up."""

from __future__ import annotations

import argparse

from services.core.process.serve import Stack
from services.webhook import server
from services.webhook.domains import DomainCheck


async def start(args: argparse.Namespace, stack: Stack) -> None:
    hook = server.Webhook(args.feature_gates, args.cert_file, args.key_file)
    if args.compute_domains:
        controller = f"system:serviceaccount:{args.namespace}:{args.domains_account}"
        hook.domains = DomainCheck(await stack.kube(args.kubeconfig), args.namespace, controller)
    await server.listen(hook, args.address, args.port, stack)
