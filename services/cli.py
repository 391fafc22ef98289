"""The ``gpudra`` command: one entry point, one sub-command per job.

Each service contributes its sub-commands through ``register(subparsers)`` in
its own ``cli`` module, so a service's whole story stays in its folder.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from services.core.process import config

# Which module registers each sub-command, so that a process imports only its own
# (a node's kubelet plugin needs neither the allocator nor discovery's simulator).
# tests/unit/project/test_cli.py checks it against what the modules really register.
COMMANDS: dict[str, str] = {
    "allocator": "services.allocator.cli",
    "discovery": "services.discovery.cli",
    "domains": "services.domains.cli",
    "sim": "services.discovery.cli",
    "imex-daemon": "services.imexdaemon.cli",
    "kubeletplugin": "services.kubeletplugin.cli",
    "nats-auth": "services.natsauth.cli",
    "nats-keygen": "services.natsauth.cli",
    "up": "services.local.cli",
    "slices": "services.offline.cli",
    "host-check": "services.offline.cli",
    "allocate": "services.offline.cli",
    "audit": "services.audit.cli",
    "explain": "services.offline.cli",
    "preparer": "services.preparer.cli",
    "publisher": "services.publisher.cli",
    "webhook": "services.webhook.cli",
}


def _service_clis() -> list[str]:
    """Every ``services/<service>/cli.py``, in name order."""
    root = Path(__file__).parent
    return sorted(f"services.{p.parent.name}.cli" for p in root.glob("*/cli.py"))


def _nats(args: argparse.Namespace) -> int:
    from services.core.bus.access import NODE_ROLES, Role
    from services.local.natsserver import NatsServer

    access = Path(args.access_dir) if args.access_dir else None
    server = NatsServer(Path(args.store_dir), port=args.port, access_dir=access)
    server.start()
    server.provision()
    for role in Role:
        for node in args.node if role in NODE_ROLES else [""]:
            server.credentials(role, node)
    print(
        f"nats-server (pid {server.proc.pid if server.proc else '?'}) on {server.url}\n"
        f"credentials: {server.access.users}/<identity>.nk, CA {server.access.ca}",
        flush=True,
    )
    try:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while server.proc and server.proc.poll() is None:
            time.sleep(0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.stop()
    return 0


def _provision(args: argparse.Namespace) -> int:
    import asyncio

    from services.core.bus.access import Identity, Role
    from services.core.bus.client import Bus

    async def run() -> None:
        creds = config.nats_credentials(args)
        bus = await Bus.connect(
            args.nats_url, name="provision", identity=Identity(Role.ADMIN), credentials=creds,
            replicas=args.nats_replicas,
        )  # fmt: skip
        await bus.close()

    asyncio.run(run())
    print(f"provisioned the streams and buckets on {args.nats_url}")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every sub-command, or (``command`` given and known) only the module that has it."""
    parser = argparse.ArgumentParser(prog="gpudra", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    nats = sub.add_parser("nats", help="run an embedded nats-server with JetStream on 127.0.0.1")
    nats.add_argument("--port", type=int, default=4222)
    nats.add_argument("--store-dir", default=".gpudra/nats")
    nats.add_argument(
        "--access-dir", default="", help="CA, certificates and seeds (default: <store-dir>-access)"
    )
    nats.add_argument(
        "--node", action="append", default=[], help="make the node components' credentials"
    )
    nats.set_defaults(func=_nats)
    provision = sub.add_parser(
        "provision", help="create the streams and buckets, or update their limits (admin)"
    )
    config.add_nats_flags(provision)
    config.add_replicas_flag(
        provision,
        "JetStream replicas of the streams and buckets (3 with the chart's NATS cluster)",
    )
    provision.set_defaults(func=_provision)
    modules = [COMMANDS[command]] if command in COMMANDS else _service_clis()
    for module in modules:
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words[0] if words else None).parse_args(words)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
