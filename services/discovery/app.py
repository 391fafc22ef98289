"""Discovery's wiring: the node's bus identity, the NVML backend (the host's, or a
simulated fleet with its control subjects), the discovery service."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from services.core.bus.access import Identity, Role
from services.core.process.serve import Stack
from services.discovery import backend as nv
from services.discovery import simcontrol
from services.discovery.pciids import PciIds
from services.discovery.service import Discovery
from services.discovery.sim import SimNvml
from services.discovery.simstore import SimStore

log = logging.getLogger(__name__)


async def start(args: argparse.Namespace, pci_ids: PciIds | None, stack: Stack) -> int | None:
    if pci_ids is not None:
        log.info("PCI ID database", extra={"source": pci_ids.source, "version": pci_ids.version})
    identity = Identity(Role.DISCOVERY, args.node_name)
    bus = await stack.bus(args.nats_url, name=f"discovery-{args.node_name}", identity=identity)
    backend: Any
    if args.fleet is not None:
        store = SimStore(bus)
        state, _ = await store.boot(args.node_name, args.fleet, args.seed)
        backend = SimNvml(state)
        await simcontrol.serve(bus, store, args.node_name)
    else:
        from services.discovery.nvml import NvmlBackend

        backend = NvmlBackend(args.sysfs_root, args.dev_root, pci_ids)
    service = Discovery(bus, args.node_name, backend, rescan_interval=args.rescan_interval)
    log.info(
        "discovery starting",
        extra={"node": args.node_name, "backend": backend.name, "nats": args.nats_url},
    )
    stack.closing(service.close, "discovery")
    try:
        await service.start()
    except nv.NvmlError as exc:
        hint = "" if args.fleet else " (no GPU here? use --fleet to simulate one)"
        print(f"gpudra discovery: NVML: {exc}{hint}", file=sys.stderr)
        return 1
    return None
