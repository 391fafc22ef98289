"""A stand-in for ``nvidia-imex`` on simulated nodes: READY only when every peer answers.

``python -m services.imexdaemon.standin -c imexd.cfg`` listens on the configured
bind address at SERVER_PORT (peers' probes) and IMEX_CMD_PORT (status queries).
A status query answers ``READY`` only if every address in the node list, other than
its own, accepts a connection on SERVER_PORT at that moment; otherwise
``NOT_READY``. It rereads the node list on every query (SIGUSR1, which the
wrapper sends on a change as to the real binary, needs nothing more).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from services.imexdaemon import imexcfg

PROBE_TIMEOUT_S = 0.5


async def peer_answers(ip: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def ready(config: imexcfg.ImexConfig) -> bool:
    peers = [ip for ip in imexcfg.read_nodes(config.nodes_file) if ip != config.bind_ip]
    if config.bind_ip not in imexcfg.read_nodes(config.nodes_file):
        return False  # not yet in its own domain's list
    answers = await asyncio.gather(*(peer_answers(ip, config.server_port) for ip in peers))
    return all(answers)


async def serve(config: imexcfg.ImexConfig) -> None:
    async def on_peer(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async def on_cmd(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"READY\n" if await ready(config) else b"NOT_READY\n")
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
    args = parser.parse_args(argv)
    try:
        config = imexcfg.read(args.config)
        asyncio.run(serve(config))
    except (imexcfg.ConfigError, OSError) as exc:
        print(f"imex stand-in: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
