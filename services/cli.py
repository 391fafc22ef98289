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

# Which module registers each sub-command, so that a process imports only its own
# (a node's kubelet plugin needs neither the allocator nor discovery's simulator).
# tests/unit/test_cli.py checks it against what the modules really register.
COMMANDS: dict[str, str] = {
    "allocator": "services.allocator.cli",
    "discovery": "services.discovery.cli",
    "sim": "services.discovery.cli",
    "kubeletplugin": "services.kubeletplugin.cli",
    "up": "services.local.cli",
    "slices": "services.offline.cli",
    "allocate": "services.offline.cli",
    "explain": "services.offline.cli",
    "preparer": "services.preparer.cli",
    "publisher": "services.publisher.cli",
}


def _service_clis() -> list[str]:
    """Every ``services/<service>/cli.py``, in name order."""
    root = Path(__file__).parent
    return sorted(f"services.{p.parent.name}.cli" for p in root.glob("*/cli.py"))


def _nats(args: argparse.Namespace) -> int:
    from services.core.natsserver import NatsServer

    server = NatsServer(Path(args.store_dir), port=args.port)
    server.start()
    print(
        f"nats-server (pid {server.proc.pid if server.proc else '?'}) on {server.url}", flush=True
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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every sub-command, or (``command`` given and known) only the module that has it."""
    parser = argparse.ArgumentParser(prog="gpudra", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    nats = sub.add_parser("nats", help="run an embedded nats-server with JetStream on 127.0.0.1")
    nats.add_argument("--port", type=int, default=4222)
    nats.add_argument("--store-dir", default=".gpudra/nats")
    nats.set_defaults(func=_nats)
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
