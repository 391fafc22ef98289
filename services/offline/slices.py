"""``gpudra slices``: the ResourceSlices the publisher would write for a simulated node.

    gpudra slices --fleet dgx-h100 --node n1 [--feature-gates DynamicMIG=true]
                  [--kube-version 1.37] [--seed 0] [-o yaml|json]

No cluster and no bus: the node's inventory comes from discovery's simulated
NVML for the fleet (the same one ``gpudra discovery --fleet`` serves, so UUIDs
match for the same node and seed), and the slices are what the publisher
creates in an empty cluster (generation 1, no owner reference: there is no
Node to own them). Every slice is checked against the API limits; a problem is
reported on stderr with exit status 1. The API server's version (default 1.37, the
version gpudra follows by default) decides the layout and whether list-type
attributes exist (DRAListTypeAttributes: 1.36 and later; a note on stderr says what
the API server needs for them).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

import yaml

from services.core.kube import resource
from services.core.kube.resource import ResourceSlice
from services.core.model import deviceattrs, featuregates
from services.core.model.schemas import NodeInventory
from services.core.process import config
from services.offline import slicecheck

if TYPE_CHECKING:
    from services.publisher.render import RenderOptions

DEFAULT_MINOR = 37  # kube_features.DEFAULT_MINOR: the version gpudra follows by default


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "slices", help="print the ResourceSlices the publisher would write for a simulated node"
    )
    parser.add_argument("--fleet", required=True, type=_fleet_arg, help="simulated fleet profile")
    parser.add_argument("--node", required=True, help="node name (pool and nodeName)")
    parser.add_argument(
        "--feature-gates",
        type=config.feature_gates_arg,
        default=featuregates.parse(""),
        help=f"Name=bool,... of: {featuregates.valid_names()}",
    )
    parser.add_argument(
        "--consumable-shares",
        type=config.consumable_shares_arg,
        default="disabled",
        help="'disabled', 'memory', 'unlimited' or a share count N (needs ConsumableShares)",
    )
    parser.add_argument(
        "--kube-version",
        type=_kube_minor_arg,
        default=DEFAULT_MINOR,
        help="API server version deciding the slice layout and list attributes (default 1.37)",
    )
    parser.add_argument("--seed", type=int, default=0, help="simulation seed (UUIDs)")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(func=main)


def _fleet_arg(value: str) -> str:
    from services.discovery.fleet import FleetError, get_fleet

    try:
        get_fleet(value)
    except FleetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def _kube_minor_arg(value: str) -> int:
    from services.publisher.cli import kube_minor_arg

    return kube_minor_arg(value)


def fleet_inventory(fleet: str, node: str, seed: int = 0) -> NodeInventory:
    """What discovery would report for ``node`` booted as ``fleet``."""
    from services.discovery.fleet import get_fleet
    from services.discovery.inventory import scan
    from services.discovery.sim import SimNvml

    nvml = SimNvml.boot(node, get_fleet(fleet), seed)  # initialised, static MIG created
    try:
        return scan(nvml, node).inventory
    finally:
        nvml.shutdown()


def main(args: argparse.Namespace) -> int:
    from services.publisher.render import RenderError, RenderOptions, render_slices

    inventory = fleet_inventory(args.fleet, args.node, args.seed)
    options = RenderOptions(
        gates=args.feature_gates,
        kube_minor=args.kube_version,
        shares=config.consumable_shares(args, "slices"),
    )
    try:
        slices = render_slices(inventory, options, generation=1)
    except RenderError as exc:
        print(f"gpudra slices: {exc}", file=sys.stderr)
        return 1
    items = [resource.to_builtins(s) for s in slices]
    print(_format(items, args.output), end="")
    problems = slicecheck.check_pool(slices, kube_minor=args.kube_version)
    note = _list_attributes_note(slices, options)
    if note:
        print(f"gpudra slices: note: {note}", file=sys.stderr)
    for problem in problems:
        print(f"gpudra slices: invalid slice: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _list_attributes_note(slices: list[ResourceSlice], options: RenderOptions) -> str:
    """What DRAListTypeAttributes needs from the API server, when the gate is on."""
    if not options.gates.enabled(featuregates.DRA_LIST_TYPE_ATTRIBUTES):
        return ""
    version = f"1.{options.kube_minor}"
    if not options.list_attributes:
        return (
            f"{featuregates.DRA_LIST_TYPE_ATTRIBUTES} changes nothing on Kubernetes {version}: "
            "list-type attributes exist from 1.36, so numaNode stays an int"
        )
    if not any(deviceattrs.has_list_attributes(d) for s in slices for d in s.spec.devices or []):
        return ""
    return (
        f"numaNode is a list ({featuregates.DRA_LIST_TYPE_ATTRIBUTES}): the API server and "
        f"the scheduler need Kubernetes' own gate {featuregates.DRA_LIST_TYPE_ATTRIBUTES} "
        f"(alpha, off by default in {version}); without it the publisher publishes the int "
        "(selectors comparing numaNode with == match only the int)"
    )


def _format(items: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        listing = {"apiVersion": "v1", "kind": "List", "items": items}
        return json.dumps(listing, indent=2) + "\n"
    return yaml.safe_dump_all(items, sort_keys=False, explicit_start=True)
