"""The IMEX configuration the daemon renders, as the reference renders it, and its reader.

``imexd.cfg`` carries the reference's settings (bind address, the node list file,
logs to stderr, no daemonising, server and command ports, quorum on recovery, no
auth encryption, no grace time for a disconnected node); ``nodes.cfg`` is the peer
list, one IP address per line in index order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SERVER_PORT = 50000
CMD_PORT = 50005
CONFIG = "imexd.cfg"
NODES = "nodes.cfg"


@dataclass(frozen=True)
class ImexConfig:
    bind_ip: str
    nodes_file: Path
    server_port: int = SERVER_PORT
    cmd_port: int = CMD_PORT

    def render(self) -> str:
        return "".join(
            f"{k}={v}\n"
            for k, v in (
                ("IMEX_CMD_BIND_INTERFACE_IP", self.bind_ip),
                ("IMEX_NODE_CONFIG_FILE", self.nodes_file),
                ("LOG_FILE_NAME", ""),
                ("DAEMONIZE", 0),
                ("SERVER_PORT", self.server_port),
                ("IMEX_CMD_PORT", self.cmd_port),
                ("IMEX_CMD_ENABLED", 1),
                ("IMEX_WAIT_FOR_QUORUM", "RECOVERY"),
                ("IMEX_ENABLE_AUTH_ENCRYPTION", 0),
                ("IMEX_NODE_DISCONNECTED_GRACE_TIME", -1),
            )
        )


class ConfigError(ValueError):
    """An IMEX configuration file that is missing a setting or has a bad one."""


def read(path: Path) -> ImexConfig:
    """Parse an ``imexd.cfg``; errors name the file and the setting."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    try:
        return ImexConfig(
            bind_ip=values["IMEX_CMD_BIND_INTERFACE_IP"],
            nodes_file=Path(values["IMEX_NODE_CONFIG_FILE"]),
            server_port=int(values.get("SERVER_PORT", SERVER_PORT)),
            cmd_port=int(values.get("IMEX_CMD_PORT", CMD_PORT)),
        )
    except KeyError as exc:
        raise ConfigError(f"{path}: {exc.args[0]} is not set") from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: a port is not a number: {exc}") from exc


def write_atomic(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already says it; True if it changed."""
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def read_nodes(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]
