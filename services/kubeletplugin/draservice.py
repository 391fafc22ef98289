"""The kubelet's DRAPlugin service, v1 and v1beta1, on top of the forwarder.

Both versions carry the same messages (v1 adds ``Device.share_id``), so one
servicer class serves either, given the generated module of its version.
Request names keep only the base of ``request/subrequest`` references: that
is what containers refer to, and what the reference kubelet-plugin helper sends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import grpc
from opentelemetry.context import Context

from services.core.model.schemas import ClaimRef, ClaimResult, PreparedDevice
from services.core.telemetry import tracing
from services.kubeletplugin.forwarder import Forwarder
from services.proto_gen.kubelet.dra.v1 import api_pb2 as v1
from services.proto_gen.kubelet.dra.v1 import api_pb2_grpc as v1_grpc
from services.proto_gen.kubelet.dra.v1beta1 import api_pb2 as v1beta1
from services.proto_gen.kubelet.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)

# (advertised service name, generated messages, generated grpc module), most preferred first.
VERSIONS: tuple[tuple[str, ModuleType, ModuleType], ...] = (
    ("v1.DRAPlugin", v1, v1_grpc),
    ("v1beta1.DRAPlugin", v1beta1, v1beta1_grpc),
)


class DraServicer:
    """NodePrepareResources / NodeUnprepareResources of one API version."""

    def __init__(self, pb: ModuleType, forwarder: Forwarder) -> None:
        self.pb = pb
        self.forwarder = forwarder
        self.with_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        results = await _guarded(self.forwarder.prepare, request, context)
        response = self.pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
            else:
                entry.devices.extend(self._device(d) for d in result.devices)
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        results = await _guarded(self.forwarder.unprepare, request, context)
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, result in results.items():
            response.claims[uid].error = result.error
        return response

    def _device(self, device: PreparedDevice) -> Any:
        message = self.pb.Device(
            request_names=[name.split("/", 1)[0] for name in device.request_names],
            pool_name=device.pool_name,
            device_name=device.device_name,
            cdi_device_ids=device.cdi_device_ids,
        )
        if device.share_id is not None and self.with_share_id:
            message.share_id = device.share_id
        return message


def add_to_server(server: grpc.aio.Server, forwarder: Forwarder) -> list[str]:
    """Serve every DRAPlugin version; return the advertised names, most preferred first."""
    for _, pb, pb_grpc in VERSIONS:
        pb_grpc.add_DRAPluginServicer_to_server(DraServicer(pb, forwarder), server)
    return [name for name, _, _ in VERSIONS]


async def _guarded(
    call: Callable[[list[ClaimRef], float | None, Context], Awaitable[dict[str, ClaimResult]]],
    request: Any,
    context: grpc.aio.ServicerContext,
) -> dict[str, ClaimResult]:
    """Run the forwarder; a bug in it still answers every claim instead of failing the RPC.

    The kubelet's own trace context (W3C ``traceparent`` in the gRPC metadata,
    sent when kubelet tracing is on) is linked from each claim's span.
    """
    claims = [ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name) for c in request.claims]
    metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
    try:
        return await call(claims, context.time_remaining(), tracing.extract(metadata))
    except Exception as exc:
        log.exception("forwarding failed unexpectedly")
        error = f"internal error in the kubelet plugin: {type(exc).__name__}: {exc}"
        return {c.uid: ClaimResult(error=error) for c in claims}
