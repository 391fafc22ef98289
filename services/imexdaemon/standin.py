"""A stand-in for ``nvidia-imex`` on simulated nodes: READY only when every peer answers.

``python -m services.imexdaemon.standin -c imexd.cfg [--hosts-file F]`` listens on
the configured bind address at SERVER_PORT (peers' probes) and IMEX_CMD_PORT (status
queries). A status query answers ``READY`` only if its own address is in the node
list and every other address there accepts a connection on SERVER_PORT at that
moment; otherwise ``NOT_READY``. A node-list entry that is a name (the DNS names of
IMEXDaemonsWithDNSNames) is resolved through ``--hosts-file`` as IMEX's resolver
reads ``/etc/hosts``; a name nobody has is an empty slot, no node. It rereads the
node list and the names on every query (SIGUSR1, which the wrapper sends on a change
as to the real binary, needs nothing more).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from services.imexdaemon import dnsnames, imexcfg

PROBE_TIMEOUT_S = 0.5


async def peer_answers(ip: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def addresses(config: imexcfg.ImexConfig, hosts_file: Path | None = None) -> list[str]:
    """The node list's addresses: names resolved through the hosts file, empty slots out."""
    hosts = dnsnames.read_hosts(hosts_file) if hosts_file is not None else {}
    found = (dnsnames.resolve(entry, hosts) for entry in imexcfg.read_nodes(config.nodes_file))
    return [ip for ip in found if ip is not None]


async def ready(config: imexcfg.ImexConfig, hosts_file: Path | None = None) -> bool:
    listed = addresses(config, hosts_file)
    if config.bind_ip not in listed:
        return False  # not yet in its own domain's list
    peers = [ip for ip in listed if ip != config.bind_ip]
    answers = await asyncio.gather(*(peer_answers(ip, config.server_port) for ip in peers))
    return all(answers)


async def serve(config: imexcfg.ImexConfig, hosts_file: Path | None = None) -> None:
    async def on_peer(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def on_cmd(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"READY\n" if await ready(config, hosts_file) else b"NOT_READY\n")
        await writer.drain()
        writer.close()

    peer = await asyncio.start_server(on_peer, config.bind_ip, config.server_port)
    cmd = await asyncio.start_server(on_cmd, config.bind_ip, config.cmd_port)
    print(f"imex stand-in listening on {config.bind_ip}:{config.server_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: None)  # the list is reread per query
    async with peer, cmd:
        await stop.wait()


async def query(config: imexcfg.ImexConfig, timeout: float = 2.0) -> str:
    """What ``nvidia-imex-ctl -q`` prints, asked of the stand-in's command port."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(config.bind_ip, config.cmd_port), timeout
    )
    try:
        return (await asyncio.wait_for(reader.readline(), timeout)).decode()
    finally:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="imex-standin")
    parser.add_argument("-c", dest="config", required=True, type=Path)
    parser.add_argument("--hosts-file", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        config = imexcfg.read(args.config)
        asyncio.run(serve(config, args.hosts_file))
    except (imexcfg.ConfigError, OSError) as exc:
        print(f"imex stand-in: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
