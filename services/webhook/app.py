"""The webhook's wiring: the admission server and its certificate watch."""

from __future__ import annotations

import argparse

from services.core.process.serve import Stack
from services.webhook import server


async def start(args: argparse.Namespace, stack: Stack) -> None:
    hook = server.Webhook(args.feature_gates, args.cert_file, args.key_file)
    await server.listen(hook, args.address, args.port, stack)
