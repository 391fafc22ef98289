"""``gpudra audit``: replay the claim event trail, filtered by the server; verify it.

    gpudra audit [--since start|2026-01-02T03:04:05Z|2h] [--follow]
                 [--namespace NS] [--claim NAME] [--node NODE] [--event E ...]
                 [-o json|table] [--verify [--wait S]] [--durable NAME]
                 --nats-url URL --nats-creds auditor.nk --nats-ca ca.pem

Connects as the read-only ``auditor`` identity. Prints one JSON object per
event (``-o json``, the default) or a table. ``--verify`` checks, instead of
printing, that every claim's trail is complete, numbered without gaps and
its own (each event placed by its subject, which only its emitter may
publish: services/audit/judge.py), says when the stream no longer holds a
live claim's first events or is full, prints each claim's problems and exits
1 if there are any; with ``--wait S`` it keeps reading new events for up to S
seconds until every claim is complete (events of a claim deleted a moment ago may
still be on their way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import re
import sys
from typing import TYPE_CHECKING

from services.core.process import config

if TYPE_CHECKING:  # imported when run: every gpudra command builds this parser
    from services.audit.replay import Filters
    from services.core.bus.client import Bus

_AGO = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")


def register(subparsers: config.Subparsers) -> None:
    parser = config.documented(
        subparsers, "audit", "replay, filter and verify the claim event trail (read-only)", __doc__
    )
    config.add_nats_flags(parser)
    parser.add_argument(
        "--since",
        type=since_arg,
        default=None,
        help="'start' (default), an RFC 3339 time, or an age such as 90m or 2d",
    )
    parser.add_argument("--follow", action="store_true", help="keep printing new events")
    parser.add_argument("--namespace", help="only claims in this namespace")
    parser.add_argument("--claim", help="only claims of this name")
    parser.add_argument("--node", help="only events about this node")
    parser.add_argument(
        "--event", action="append", default=[], type=event_arg, help="only this event (repeat)"
    )
    parser.add_argument("-o", "--output", choices=("json", "table"), default="json")
    parser.add_argument("--verify", action="store_true", help="check every claim's trail")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="with --verify: read new events for up to this many seconds until all are complete",
    )
    parser.add_argument(
        "--durable",
        type=durable_arg,
        help="consumer name to create or resume (default: a new one, forgotten after 1 h)",
    )
    parser.set_defaults(func=main)


def since_arg(value: str) -> datetime.datetime | None:
    if value == "start":
        return None
    if match := _AGO.match(value):
        seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since: expected 'start', an RFC 3339 time or an age like 90m, got {value!r}"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def event_arg(value: str) -> str:
    from typing import get_args

    from services.core.model.schemas import ClaimEventName

    names = get_args(ClaimEventName)
    if value not in names:
        raise argparse.ArgumentTypeError(
            f"--event: expected one of {', '.join(names)}; got {value!r}"
        )
    return value


def durable_arg(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value):
        raise argparse.ArgumentTypeError(
            f"--durable: expected 1 to 64 letters, digits, '-' or '_', got {value!r}"
        )
    return value


def main(args: argparse.Namespace) -> int:
    problem = _run_checked(args)
    if problem:
        print(f"gpudra audit: {problem}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_audit(args))
    except KeyboardInterrupt:
        return 0


def _run_checked(args: argparse.Namespace) -> str:
    """Why these arguments cannot go together ("" when they can)."""
    if args.verify and (args.event or args.node):
        return (
            "--verify judges whole trails: --event and --node would cut them "
            "(use --namespace or --claim to verify fewer claims)"
        )
    if args.wait and not args.verify:
        return "--wait goes with --verify"
    return ""


async def _audit(args: argparse.Namespace) -> int:
    from services.audit import render
    from services.audit.replay import Filters, replay
    from services.core.bus.access import Identity, Role
    from services.core.bus.client import Bus

    bus = await Bus.connect(
        args.nats_url,
        name="gpudra-audit",
        identity=Identity(Role.AUDITOR),
        credentials=config.nats_credentials(args),
    )
    filters = Filters(args.namespace, args.claim, args.node, tuple(args.event))
    try:
        if args.verify:
            return await _verify(bus, filters, args)
        if args.output == "table":
            print(render.TABLE_HEADER, flush=True)
        line = render.json_line if args.output == "json" else render.table_row
        source = replay(bus, filters, since=args.since, durable=args.durable, follow=args.follow)
        async with contextlib.aclosing(source):
            async for item in source:
                print(line(item), flush=True)
        return 0
    finally:
        await bus.close()


async def _verify(bus: Bus, filters: Filters, args: argparse.Namespace) -> int:
    """Judge the trail (services/audit/judge.py)."""
    from services.audit import judge

    return await judge.run(bus, filters, since=args.since, durable=args.durable, wait=args.wait)
