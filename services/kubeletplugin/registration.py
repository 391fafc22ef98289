"""The kubelet's plugin Registration service on the registration socket.

The kubelet calls GetInfo, checks the answer (type, name, a supported
version), connects to the endpoint, and tells us the outcome through
NotifyRegistrationStatus. Only a positive status makes the node present on the
bus; a negative one withdraws it, so a plugin the kubelet refused never keeps
ResourceSlices alive.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc

from services.kubeletplugin import metrics
from services.kubeletplugin.presence import Presence
from services.proto_gen.kubelet.pluginregistration.v1 import api_pb2 as pb
from services.proto_gen.kubelet.pluginregistration.v1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"


class RegistrationServicer:
    def __init__(
        self, driver: str, endpoint: str, versions: Sequence[str], presence: Presence
    ) -> None:
        self.info = pb.PluginInfo(
            type=PLUGIN_TYPE, name=driver, endpoint=endpoint, supported_versions=list(versions)
        )
        self.presence = presence
        self.registered = False
        self.last_error = ""
        metrics.REGISTERED.labels(driver).set(0)

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext) -> pb.PluginInfo:
        return self.info

    async def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        self.last_error = request.error
        metrics.REGISTERED.labels(self.info.name).set(1 if self.registered else 0)
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"endpoint": self.info.endpoint})
            await self.presence.announce()
        else:
            log.error("the kubelet refused the registration", extra={"error": request.error})
            await self.presence.withdraw()
        return pb.RegistrationStatusResponse()

    def deregistered(self) -> None:
        """The registration socket is gone (shutdown): the kubelet deregisters the plugin."""
        self.registered = False
        metrics.REGISTERED.labels(self.info.name).set(0)


def add_to_server(server: grpc.aio.Server, servicer: RegistrationServicer) -> None:
    pb_grpc.add_RegistrationServicer_to_server(servicer, server)
