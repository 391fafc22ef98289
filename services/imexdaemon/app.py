"""The IMEX daemon wrapper's wiring: its node's bus identity and the daemon task."""

from __future__ import annotations

import argparse

from services.core.bus.access import Identity, Role
from services.core.process.serve import Stack
from services.imexdaemon.daemon import Daemon, DaemonSettings


async def start(settings: DaemonSettings, args: argparse.Namespace, stack: Stack) -> None:
    identity = Identity(Role.IMEX, settings.node)
    bus = await stack.bus(args.nats_url, name="imex-daemon", identity=identity)
    stack.spawn("imex-daemon", Daemon(bus, settings).run)
