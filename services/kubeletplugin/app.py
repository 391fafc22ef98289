"""The kubelet plugin process: sockets up in the kubelet's order, down in reverse.

Start: remove stale sockets, serve the DRA socket (DRAPlugin v1 + v1beta1,
DRAResourceHealth, grpc.health.v1), and only then the registration socket,
because the kubelet dials the endpoint as soon as it sees the registration.
Stop (SIGTERM/SIGINT): drop the registration socket first (the kubelet
deregisters), withdraw the presence record, let in-flight calls finish, drop
the DRA socket.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.core import nvidia, runner, supervisor
from services.core.access import Identity, Role
from services.core.bus import Bus
from services.kubeletplugin import draservice, health, registration, sockets
from services.kubeletplugin.forwarder import Forwarder, Timing
from services.kubeletplugin.presence import Presence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    node: str
    kubelet_root: Path
    nats_url: str
    rolling_update_uid: str = ""
    prepare_timeout: float = 45.0
    shutdown_grace: float = 5.0
    driver: str = field(default=nvidia.DRIVER_NAME)


class KubeletPlugin:
    def __init__(self, settings: Settings, bus: Bus) -> None:
        self.settings = settings
        self.bus = bus
        self.paths = sockets.SocketPaths.for_driver(
            settings.kubelet_root, settings.driver, settings.rolling_update_uid
        )
        endpoint = str(self.paths.dra)
        self.presence = Presence(bus, settings.node, settings.driver, endpoint)
        self.board = health.HealthBoard(settings.node)
        self.forwarder = Forwarder(bus, settings.node, Timing(default=settings.prepare_timeout))
        self.grpc_health = grpc_health.aio.HealthServicer()
        self.dra_server = grpc.aio.server()
        versions = draservice.add_to_server(self.dra_server, self.forwarder)
        versions.append(health.add_to_server(self.dra_server, self.board))
        health_pb2_grpc.add_HealthServicer_to_server(self.grpc_health, self.dra_server)
        self.registration = registration.RegistrationServicer(
            settings.driver, endpoint, versions, self.presence
        )
        self.registration_server = grpc.aio.server()
        registration.add_to_server(self.registration_server, self.registration)
        self._bound: list[Path] = []  # only sockets we created are ours to remove

    async def start(self) -> None:
        for path in self.paths.all():
            sockets.ensure_dir(path.parent)
            if sockets.remove_stale(path):
                log.info("removed stale socket", extra={"path": str(path)})
        tasks = supervisor.current()
        tasks.spawn("health-board", lambda: self.board.follow(self.bus))
        tasks.spawn("presence", self.presence.keep)
        await self._serve(self.dra_server, self.paths.dra)
        await self.grpc_health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._serve(self.registration_server, self.paths.registration)
        log.info(
            "serving the kubelet",
            extra={"dra": str(self.paths.dra), "registration": str(self.paths.registration)},
        )

    async def stop(self) -> None:
        grace = self.settings.shutdown_grace
        await self.registration_server.stop(None)
        self._unbind(self.paths.registration)
        await self.presence.withdraw()
        await self.grpc_health.enter_graceful_shutdown()
        await self.dra_server.stop(grace)
        self._unbind(self.paths.dra)
        tasks = supervisor.current()
        await tasks.cancel("health-board")
        await tasks.cancel("presence")
        log.info("stopped")

    async def _serve(self, server: grpc.aio.Server, path: Path) -> None:
        self._bound.append(path)
        sockets.bind(server, path)
        await server.start()

    def _unbind(self, path: Path) -> None:
        if path in self._bound:
            path.unlink(missing_ok=True)
            self._bound.remove(path)


async def run(settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT; return the exit status."""
    try:
        bus = await Bus.connect(
            settings.nats_url,
            name=f"kubeletplugin-{settings.node}",
            identity=Identity(Role.FRONT, settings.node),
        )
    except Exception as exc:
        log.error("cannot connect to NATS", extra={"url": settings.nats_url, "error": str(exc)})
        return 1
    stop = runner.stop_event()
    try:
        plugin = KubeletPlugin(settings, bus)
    except sockets.SocketError as exc:
        log.error("cannot serve the kubelet sockets", extra={"error": str(exc)})
        await bus.close()
        return 1
    status = 0
    try:
        await plugin.start()
        await stop.wait()
        log.info("shutting down")
    except (sockets.SocketError, OSError, RuntimeError) as exc:
        log.error("cannot serve the kubelet sockets", extra={"error": str(exc)})
        status = 1
    finally:
        await plugin.stop()
        await bus.close()
    return status
