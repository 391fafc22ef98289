"""The kubelet's side of a DRA plugin's sockets, for benchmarks and tests.

It registers a DRA plugin and calls it like the real kubelet does.

It uses only the generated stubs from proto/ and the unix sockets, in the
kubelet's order: find the registration socket in ``plugins_registry``, GetInfo
(1 s), check type/name/version and pick the first version it supports,
connect to the endpoint (10 s), NotifyRegistrationStatus (5 s). Then
prepare/unprepare over the chosen version (or one named by the test), and
watch device health over the health service the kubelet 1.37 picks: the first
of its own list (v1, then v1alpha1) that the plugin advertises.

    async with FakeKubelet(root) as kubelet:
        await kubelet.register()
        results = await kubelet.prepare([Claim("uid-1", "ns", "c")])
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from services.proto_gen.kubelet.dra.v1 import api_pb2 as dra_v1
from services.proto_gen.kubelet.dra.v1 import api_pb2_grpc as dra_v1_grpc
from services.proto_gen.kubelet.dra.v1beta1 import api_pb2 as dra_v1beta1
from services.proto_gen.kubelet.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from services.proto_gen.kubelet.drahealth.v1 import api_pb2 as health_v1
from services.proto_gen.kubelet.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from services.proto_gen.kubelet.pluginregistration.v1 import api_pb2 as reg_pb
from services.proto_gen.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc

DRIVER = "gpu.nvidia.com"
# What a 1.35 to 1.37 kubelet supports, in its order of preference.
KUBELET_VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAPlugin": (dra_v1, dra_v1_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1, dra_v1beta1_grpc),
}
# The health services a 1.37 kubelet knows, in its order of preference
# (pkg/kubelet/cm/dra/plugin/dra_plugin.go: healthServicesSupportedByKubelet).
KUBELET_HEALTH_VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1.DRAResourceHealth": (health_v1, health_v1_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1, health_v1alpha1_grpc),
}


class RegistrationRefused(AssertionError):
    """The plugin's GetInfo answer is one the kubelet would refuse."""


@dataclass(frozen=True)
class Claim:
    uid: str
    namespace: str = "default"
    name: str = "claim"


@dataclass(frozen=True)
class Device:
    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None = None


@dataclass(frozen=True)
class Result:
    devices: list[Device] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class DeviceHealth:
    health: int  # HealthStatus: 0 UNKNOWN, 1 HEALTHY, 2 UNHEALTHY
    message: str = ""


@dataclass
class FakeKubelet:
    root: Path
    driver: str = DRIVER
    info: Any = None  # the PluginInfo of the last registration
    version: str = ""  # the DRAPlugin version the kubelet chose
    # The health services this kubelet knows, in its order of preference (a 1.36
    # kubelet: only v1alpha1), and the one it chose at registration ("": none).
    health_versions: tuple[str, ...] = tuple(KUBELET_HEALTH_VERSIONS)
    health_version: str = ""
    metadata: tuple[tuple[str, str], ...] = ()  # sent with every DRA call (e.g. traceparent)
    _channels: list[grpc.aio.Channel] = field(default_factory=list)
    _dra: grpc.aio.Channel | None = None

    async def __aenter__(self) -> FakeKubelet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        self._dra = None

    # ------------------------------------------------------------ registration

    def registration_sockets(self) -> list[Path]:
        """What the kubelet's plugin watcher would act on: sockets not starting with '.'."""
        registry = self.root / "plugins_registry"
        if not registry.is_dir():
            return []
        return sorted(p for p in registry.iterdir() if not p.name.startswith(".") and p.is_socket())

    async def wait_for_registration_socket(self, timeout: float = 10.0) -> Path:
        """The first registration socket that accepts connections (a stale one does not)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for path in self.registration_sockets():
                if await _accepts(path):
                    return path
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no live registration socket in {self.root / 'plugins_registry'}")

    async def register(
        self, socket: Path | None = None, *, accept: bool = True, error: str = ""
    ) -> Any:
        """Register like the kubelet; ``accept=False`` reports a failed registration instead."""
        socket = socket or await self.wait_for_registration_socket()
        channel = self._channel(socket)
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=1)
        if accept:
            self.version = self._validate(info)
            advertised = list(info.supported_versions)
            self.health_version = next((v for v in self.health_versions if v in advertised), "")
            await self._dial(info.endpoint)
        await stub.NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=accept, error=error), timeout=5
        )
        self.info = info
        return info

    def _validate(self, info: Any) -> str:
        if info.type != "DRAPlugin":
            raise RegistrationRefused(f"type {info.type!r} is not DRAPlugin")
        if info.name != self.driver:
            raise RegistrationRefused(f"name {info.name!r} is not {self.driver!r}")
        if not Path(info.endpoint).is_absolute():
            raise RegistrationRefused(f"endpoint {info.endpoint!r} is not an absolute path")
        for version in info.supported_versions:
            if version in KUBELET_VERSIONS:
                return str(version)
        raise RegistrationRefused(f"no supported version in {list(info.supported_versions)}")

    async def _dial(self, endpoint: str) -> None:
        self._dra = self._channel(Path(endpoint))
        await asyncio.wait_for(self._dra.channel_ready(), 10)

    def _channel(self, socket: Path) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(f"unix:{socket}")
        self._channels.append(channel)
        return channel

    # ------------------------------------------------------------ DRA calls

    def _stub(self, version: str | None) -> tuple[ModuleType, Any]:
        if self._dra is None:
            raise RuntimeError("register() first")
        pb, pb_grpc = KUBELET_VERSIONS[version or self.version]
        return pb, pb_grpc.DRAPluginStub(self._dra)

    async def prepare(
        self, claims: Sequence[Claim], *, version: str | None = None, timeout: float = 45.0
    ) -> dict[str, Result]:
        pb, stub = self._stub(version)
        response = await stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[_claim(pb, c) for c in claims]),
            timeout=timeout,
            metadata=self.metadata,
        )
        return {uid: _result(r) for uid, r in response.claims.items()}

    async def unprepare(
        self, claims: Sequence[Claim], *, version: str | None = None, timeout: float = 45.0
    ) -> dict[str, str]:
        """Per-claim error strings ('' when unprepared)."""
        pb, stub = self._stub(version)
        response = await stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[_claim(pb, c) for c in claims]),
            timeout=timeout,
            metadata=self.metadata,
        )
        return {uid: r.error for uid, r in response.claims.items()}

    async def watch_device_health(
        self, version: str | None = None
    ) -> AsyncGenerator[dict[str, DeviceHealth]]:
        """Each streamed message as ``{"<pool>/<device>": DeviceHealth}``.

        Over ``version`` (e.g. ``v1alpha1.DRAResourceHealth``), by default the
        one chosen at registration.
        """
        if self._dra is None:
            raise RuntimeError("register() first")
        name = version or self.health_version
        if name not in KUBELET_HEALTH_VERSIONS:
            raise RuntimeError(f"no health service to watch (chosen: {name!r})")
        pb, pb_grpc = KUBELET_HEALTH_VERSIONS[name]
        stub = pb_grpc.DRAResourceHealthStub(self._dra)
        async for message in stub.NodeWatchResources(pb.NodeWatchResourcesRequest()):
            yield {
                f"{d.device.pool_name}/{d.device.device_name}": DeviceHealth(
                    int(d.health), d.message
                )
                for d in message.devices
            }

    async def watch_health(self, version: str | None = None) -> AsyncGenerator[dict[str, int]]:
        """Each streamed message as ``{"<pool>/<device>": HealthStatus}``."""
        async with aclosing(self.watch_device_health(version)) as stream:
            async for devices in stream:
                yield {device: d.health for device, d in devices.items()}


async def _accepts(path: Path) -> bool:
    try:
        _, writer = await asyncio.open_unix_connection(path)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


def _claim(pb: ModuleType, claim: Claim) -> Any:
    return pb.Claim(uid=claim.uid, namespace=claim.namespace, name=claim.name)


def _result(message: Any) -> Result:
    devices = [
        Device(
            request_names=list(d.request_names),
            pool_name=d.pool_name,
            device_name=d.device_name,
            cdi_device_ids=list(d.cdi_device_ids),
            share_id=d.share_id
            if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id")
            else None,
        )
        for d in message.devices
    ]
    return Result(devices=devices, error=message.error)
