"""The controller's wiring: its bus identity, the API server, the controller task."""

from __future__ import annotations

import argparse
import functools

from services.core.bus import subjects, usage
from services.core.bus.access import Identity, Role
from services.core.kube.resourceapi import versioned
from services.core.process.serve import Stack
from services.domains.service import Controller, ControllerConfig


async def start(settings: ControllerConfig, args: argparse.Namespace, stack: Stack) -> None:
    bus = await stack.bus(args.nats_url, name="domains", identity=Identity(Role.DOMAINS))
    api = versioned(await stack.kube(args.kubeconfig))
    stack.spawn("domains", Controller(api, bus, settings).run)
    domains = [usage.bucket(subjects.DOMAINS_BUCKET)]  # how full it is (bus/usage.py)
    stack.spawn("bus usage", functools.partial(usage.watch, bus, domains), fatal=False)
