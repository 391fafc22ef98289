"""``gpudra discovery`` (the service) and ``gpudra sim`` (act on simulated nodes).

    gpudra discovery --node-name N [--fleet dgx-h100 [--seed S]] [--rescan-interval 30]
    gpudra sim fleets
    gpudra sim boot --node N --fleet dgx-a100 [--seed S]
    gpudra sim show --node N
    gpudra sim xid --node N --gpu 3 --xid 79 [--gi 1 --ci 0]
    gpudra sim lose|recover --node N --gpu 3
    gpudra sim mig create --node N --gpu 0 --profile 1g.10gb [--placement 6]
    gpudra sim mig destroy --node N --gpu 0 --gi 13 --ci 0
    gpudra sim mig mode --node N --gpu 0 --on|--off

Without ``--fleet`` discovery reads the host's NVML. An unknown fleet is a
usage error (exit 2) listing the valid ones; NVML errors from ``gpudra sim``
exit 1 with NVML's error name.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.model.schemas import SchemaError
from services.core.process import config, serve
from services.core.telemetry import logs
from services.discovery import backend as nv
from services.discovery import fleet as fleets
from services.discovery import pciids
from services.discovery.sim import SimStateError
from services.discovery.simstore import SimConflict, SimNodeMissing, SimStore

log = logging.getLogger(__name__)


def fleet_arg(value: str) -> fleets.Fleet:
    return config.parsed(fleets.get_fleet, value, fleets.FleetError)


def register(sub: config.Subparsers) -> None:
    config.service(
        sub,
        "discovery",
        "scan GPUs (NVML or a simulated fleet) into the inventory",
        run_discovery,
        _discovery_flags,
    )
    _register_sim(sub)


# ---------------------------------------------------------------- gpudra discovery


def _discovery_flags(p: argparse.ArgumentParser) -> None:
    config.add_node_name_flag(p)
    config.flag(
        p,
        "fleet",
        fleet_arg,
        None,
        f"simulate this fleet instead of reading NVML: {', '.join(fleets.fleet_names())}",
        lazy=True,
    )
    config.flag(p, "seed", int, 0)
    config.flag(
        p,
        "rescan-interval",
        float,
        30,
        "seconds between periodic scans (NVML events and simulated changes scan at once)",
    )
    config.flag(p, "sysfs-root", Path, "/sys")
    config.flag(p, "dev-root", Path, "/dev")
    config.flag(
        p,
        "pci-ids",
        Path,
        None,
        "PCI ID database naming VFIO devices (default: the first of "
        f"{', '.join(str(s) for s in pciids.SYSTEM_PATHS)}, else a built-in subset; "
        "simulated fleets always use the built-in subset)",
    )


def run_discovery(args: argparse.Namespace) -> int:
    try:
        pci_ids = None if args.fleet is not None else pciids.load(args.pci_ids)
    except pciids.PciIdsError as exc:
        print(f"gpudra discovery: {exc}", file=sys.stderr)
        return 2
    from services.discovery import app

    return serve.main("discovery", args, functools.partial(app.start, args, pci_ids))


# ---------------------------------------------------------------- gpudra sim


def _register_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="inspect and change simulated GPU nodes")
    cmds = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")

    fleets_cmd = cmds.add_parser("fleets", help="list the simulated fleets")
    fleets_cmd.set_defaults(func=_list_fleets)

    def node_cmd(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        help: str,
        action: Callable[[SimStore, argparse.Namespace], Awaitable[Any]],
    ) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help)
        config.add_nats_flags(p)
        p.add_argument("--node", "--node-name", dest="node", default=config.default_node_name())
        p.set_defaults(func=lambda args: _run_sim(action, args))
        return p

    boot = node_cmd(cmds, "boot", "(re)start a simulated node from a fleet", _boot)
    boot.add_argument("--fleet", type=fleet_arg, required=True)
    boot.add_argument("--seed", type=int, default=0)
    boot.add_argument("--force", action="store_true", help="replace even the same fleet and seed")

    node_cmd(cmds, "show", "print a simulated node's GPUs and MIG devices", _show)

    xid = node_cmd(cmds, "xid", "raise an XID on a GPU (or on one of its MIG devices)", _xid)
    xid.add_argument("--gpu", type=int, required=True, help="NVML index")
    xid.add_argument("--xid", type=int, required=True)
    xid.add_argument("--gi", type=int, help="GPU instance id of the MIG device")
    xid.add_argument("--ci", type=int, help="compute instance id of the MIG device")

    lose = node_cmd(cmds, "lose", "make a GPU fall off the bus", _lose)
    lose.add_argument("--gpu", type=int, required=True)
    recover = node_cmd(cmds, "recover", "bring a lost GPU back (as after a reset)", _recover)
    recover.add_argument("--gpu", type=int, required=True)

    mig = cmds.add_parser("mig", help="create and destroy MIG devices")
    mig_cmds = mig.add_subparsers(dest="mig_command", required=True, metavar="COMMAND")
    create = node_cmd(mig_cmds, "create", "create a MIG device (GI + full CI)", _mig_create)
    create.add_argument("--gpu", type=int, required=True)
    create.add_argument("--profile", required=True, help="name (1g.10gb) or GI profile id (19)")
    create.add_argument("--placement", type=int, help="memory-slice start (default: first free)")
    destroy = node_cmd(mig_cmds, "destroy", "destroy a MIG device", _mig_destroy)
    destroy.add_argument("--gpu", type=int, required=True)
    destroy.add_argument("--gi", type=int, required=True)
    destroy.add_argument("--ci", type=int, required=True)
    mode = node_cmd(mig_cmds, "mode", "switch MIG mode on or off", _mig_mode)
    mode.add_argument("--gpu", type=int, required=True)
    onoff = mode.add_mutually_exclusive_group(required=True)
    onoff.add_argument("--on", dest="enabled", action="store_true")
    onoff.add_argument("--off", dest="enabled", action="store_false")


def _list_fleets(_args: argparse.Namespace) -> int:
    for name in fleets.fleet_names():
        fleet = fleets.get_fleet(name)
        print(f"{name:10}  {len(fleet.gpus)} x GPU  {fleet.description}")
    return 0


def _run_sim(
    action: Callable[[SimStore, argparse.Namespace], Awaitable[Any]], args: argparse.Namespace
) -> int:
    logs.setup("sim", "error")  # the command's own output is what matters here

    async def main() -> int:
        try:
            bus = await asyncio.wait_for(
                Bus.connect(
                    args.nats_url,
                    name="gpudra-sim",
                    identity=Identity(Role.SIM),
                    credentials=config.nats_credentials(args),
                ),
                10,
            )
        except TimeoutError:
            print(f"gpudra sim: cannot reach NATS at {args.nats_url}", file=sys.stderr)
            return 1
        try:
            result = await action(SimStore(bus), args)
        finally:
            await bus.close()
        if result is not None:
            print(json.dumps(msgspec.to_builtins(result), indent=2))
        return 0

    try:
        return asyncio.run(main())
    except nv.NvmlError as exc:
        print(f"gpudra sim: {exc}", file=sys.stderr)
        return 1
    except (SimNodeMissing, SimConflict, SchemaError, SimStateError) as exc:
        print(f"gpudra sim: {exc}", file=sys.stderr)
        return 1


async def _boot(store: SimStore, args: argparse.Namespace) -> dict[str, Any]:
    state, revision = await store.boot(args.node, args.fleet, args.seed, force=args.force)
    return {"node": state.node, "fleet": state.fleet, "gpus": len(state.gpus), "revision": revision}


async def _show(store: SimStore, args: argparse.Namespace) -> dict[str, Any]:
    found = await store.get(args.node)
    if found is None:
        raise SimNodeMissing(f"no simulated node {args.node!r}")
    state, revision = found
    return {"revision": revision, **msgspec.to_builtins(state)}


async def _xid(store: SimStore, args: argparse.Namespace) -> dict[str, int]:
    seq = await store.inject_xid(args.node, args.gpu, args.xid, args.gi, args.ci)
    return {"event": seq}


async def _lose(store: SimStore, args: argparse.Namespace) -> None:
    await store.set_lost(args.node, args.gpu, True)


async def _recover(store: SimStore, args: argparse.Namespace) -> None:
    await store.set_lost(args.node, args.gpu, False)


async def _mig_create(store: SimStore, args: argparse.Namespace) -> Any:
    profile: str | int = int(args.profile) if args.profile.isdigit() else args.profile
    return await store.create_mig_device(args.node, args.gpu, profile, args.placement)


async def _mig_destroy(store: SimStore, args: argparse.Namespace) -> None:
    await store.destroy_mig_device(args.node, args.gpu, args.gi, args.ci)


async def _mig_mode(store: SimStore, args: argparse.Namespace) -> None:
    await store.set_mig_mode(args.node, args.gpu, args.enabled)
