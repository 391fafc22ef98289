"""The kubelet plugin process: sockets up in the kubelet's order, down in reverse.

One process serves the GPU driver and, with ``--compute-domains``, the
``compute-domain.nvidia.com`` driver too, each with its own pair of sockets,
presence record and bus subjects, started one driver after the other.

Start: remove stale sockets, serve the DRA socket (DRAPlugin v1 + v1beta1,
DRAResourceHealth v1 + v1alpha1, grpc.health.v1), and only then the registration socket,
because the kubelet dials the endpoint as soon as it sees the registration.
Stop (SIGTERM/SIGINT): drop the registration socket first (the kubelet
deregisters), withdraw the presence record, let in-flight calls finish, drop
the DRA socket.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.model import computedomain as cd
from services.core.model import nvidia
from services.core.process.serve import Stack
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
    # Also serve compute-domain.nvidia.com (the reference's chart runs its plugin
    # only where ComputeDomains are enabled): its own sockets, presence and subjects.
    compute_domains: bool = False

    def drivers(self) -> list[str]:
        return [self.driver, *([cd.CD_DRIVER] if self.compute_domains else [])]


class DriverFront:
    """One driver's kubelet-facing half: its DRA and registration sockets, its presence.

    The GPU driver also serves DRAResourceHealth (its devices have health); the
    ComputeDomain driver's two devices have none.
    """

    def __init__(self, settings: Settings, bus: Bus, driver: str) -> None:
        self.driver = driver
        self.paths = sockets.SocketPaths.for_driver(
            settings.kubelet_root, driver, settings.rolling_update_uid
        )
        endpoint = str(self.paths.dra)
        self.presence = Presence(bus, settings.node, driver, endpoint)
        self.board = health.HealthBoard(settings.node) if driver == nvidia.DRIVER_NAME else None
        self.forwarder = Forwarder(
            bus, settings.node, Timing(default=settings.prepare_timeout), driver=driver
        )
        self.grpc_health = grpc_health.aio.HealthServicer()
        self.dra_server = grpc.aio.server()
        versions = draservice.add_to_server(self.dra_server, self.forwarder)
        if self.board is not None:
            versions.extend(health.add_to_server(self.dra_server, self.board))
        health_pb2_grpc.add_HealthServicer_to_server(self.grpc_health, self.dra_server)
        self.registration = registration.RegistrationServicer(
            driver, endpoint, versions, self.presence
        )
        self.registration_server = grpc.aio.server()
        registration.add_to_server(self.registration_server, self.registration)


class KubeletPlugin:
    def __init__(self, settings: Settings, bus: Bus) -> None:
        self.settings = settings
        self.bus = bus
        self.fronts = [DriverFront(settings, bus, driver) for driver in settings.drivers()]
        self._bound: list[Path] = []  # only sockets we created are ours to remove

    async def start(self) -> None:
        for front in self.fronts:
            for path in front.paths.all():
                sockets.ensure_dir(path.parent)
                if sockets.remove_stale(path):
                    log.info("removed stale socket", extra={"path": str(path)})
        tasks = supervisor.current()
        for front in self.fronts:
            if front.board is not None:
                tasks.spawn(f"health-board-{front.driver}", partial(front.board.follow, self.bus))
            tasks.spawn(f"presence-{front.driver}", front.presence.keep)
            await self._serve(front.dra_server, front.paths.dra)
            await front.grpc_health.set("", health_pb2.HealthCheckResponse.SERVING)
            await self._serve(front.registration_server, front.paths.registration)
            log.info(
                "serving the kubelet",
                extra={
                    "driver": front.driver,
                    "dra": str(front.paths.dra),
                    "registration": str(front.paths.registration),
                },
            )

    async def stop(self) -> None:
        """Each driver in reverse order of start, each as the kubelet expects."""
        grace = self.settings.shutdown_grace
        tasks = supervisor.current()
        for front in reversed(self.fronts):
            await front.registration_server.stop(None)
            self._unbind(front.paths.registration)
            front.registration.deregistered()
            await front.presence.withdraw()
            await front.grpc_health.enter_graceful_shutdown()
            await front.dra_server.stop(grace)
            self._unbind(front.paths.dra)
            if front.board is not None:
                await tasks.cancel(f"health-board-{front.driver}")
            await tasks.cancel(f"presence-{front.driver}")
        log.info("stopped")

    async def _serve(self, server: grpc.aio.Server, path: Path) -> None:
        self._bound.append(path)
        sockets.bind(server, path)
        await server.start()

    def _unbind(self, path: Path) -> None:
        if path in self._bound:
            path.unlink(missing_ok=True)
            self._bound.remove(path)


async def start(settings: Settings, stack: Stack) -> int | None:
    """The bus, then the sockets (:class:`KubeletPlugin`); a bus or a socket that cannot be
    had is said in one line and exits 1."""
    name, identity = f"kubeletplugin-{settings.node}", Identity(Role.FRONT, settings.node)
    try:
        bus = await stack.bus(settings.nats_url, name=name, identity=identity)
    except Exception as exc:
        log.error("cannot connect to NATS", extra={"url": settings.nats_url, "error": str(exc)})
        return 1
    try:
        plugin = KubeletPlugin(settings, bus)
        stack.closing(plugin.stop, "the kubelet sockets")
        await plugin.start()
    except (sockets.SocketError, OSError, RuntimeError) as exc:
        log.error("cannot serve the kubelet sockets", extra={"error": str(exc)})
        return 1
    return None
