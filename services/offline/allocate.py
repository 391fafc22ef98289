"""``gpudra allocate`` / ``gpudra explain``: structured allocation from files, no cluster.

Contract (external scenario suites call it):
``gpudra allocate -f FILE [-f FILE ...] [--node NODE] [--kube-version 1.37]
[--feature-gates NAME=bool,...] [-o json|yaml|text]`` prints ``{"claims": [{namespace,
name, status, node, allocation, error, explanation}]}`` as kube-scheduler of that
Kubernetes version would allocate (1.34 to 1.37; default 1.37, or
``GPUDRA_KUBE_VERSION``; the gates on top of that version's defaults, refused as its
components refuse them); exit 0 whenever the input was read, 2 with a message naming
the file and document when it was not, or when that version's kube-apiserver would
refuse an object under the given gates (then also the object, the field and the API
server's reason; services/offline/validation/). ``gpudra explain`` takes
the same arguments and prints, for people, why each claim is or is not allocated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from services.core.process import config

if TYPE_CHECKING:
    from services.allocator.structured.snapshot import ClaimOutcome


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    allocate = subparsers.add_parser(
        "allocate", help="allocate claims from files as kube-scheduler would (offline)"
    )
    _add_common(allocate)
    allocate.add_argument("-o", "--output", choices=("json", "yaml", "text"), default="json")
    allocate.set_defaults(func=_allocate)
    explain = subparsers.add_parser("explain", help="say why claims from files do (not) allocate")
    _add_common(explain)
    explain.set_defaults(func=_explain)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML or JSON with DeviceClasses, ResourceSlices, ResourceClaims, Nodes",
    )
    parser.add_argument("--node", help="allocate on this node only")
    parser.add_argument(
        "--kube-version",
        default=config.env("kube_version", ""),
        metavar="1.N",
        help="the Kubernetes version whose scheduler and API server to follow "
        "(1.34 to 1.37; default 1.37)",
    )
    parser.add_argument(
        "--feature-gates",
        default="",
        metavar="NAME=bool,...",
        help="Kubernetes gates on top of that version's defaults",
    )


def _outcomes(args: argparse.Namespace, explain: bool) -> list[ClaimOutcome] | None:
    # Imported here: the engine and CEL are heavy, and every service process builds this parser.
    from services.allocator.structured import features as kube_features
    from services.allocator.structured.snapshot import OfflineAllocator
    from services.offline.inputs import InputError, load

    try:
        minor = kube_features.minor_of(args.kube_version or str(kube_features.DEFAULT_MINOR))
        features = kube_features.parse(args.feature_gates, minor)
        inputs = load([Path(f) for f in args.files], features)
    except (InputError, kube_features.FeatureGateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    return OfflineAllocator(inputs, features, explain=explain).run(args.node)


def _allocate(args: argparse.Namespace) -> int:
    outcomes = _outcomes(args, explain=True)
    if outcomes is None:
        return 2
    if args.output == "text":
        from services.allocator.structured.snapshot import describe

        for outcome in outcomes:
            print("\n".join(describe(outcome)))
        return 0
    document: dict[str, Any] = {"claims": [o.to_json() for o in outcomes]}
    if args.output == "yaml":
        print(yaml.safe_dump(document, sort_keys=False), end="")
    else:
        print(json.dumps(document, indent=2))
    return 0


def _explain(args: argparse.Namespace) -> int:
    from services.allocator.structured.snapshot import describe

    outcomes = _outcomes(args, explain=True)
    if outcomes is None:
        return 2
    for outcome in outcomes:
        print("\n".join(describe(outcome)))
    return 0
