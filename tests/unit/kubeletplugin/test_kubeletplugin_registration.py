"""What the front tells Prometheus about its registration with the kubelet
(``gpudra_kubeletplugin_registered``, which the chart's GpudraFrontUnregistered alert
watches): 0 until the kubelet says it registered the plugin, 1 after, 0 again after a
refusal or at shutdown, per driver."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import REGISTRY

from services.kubeletplugin.presence import Presence
from services.kubeletplugin.registration import RegistrationServicer
from services.proto_gen.kubelet.pluginregistration.v1 import api_pb2 as pb


class FakePresence:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def announce(self) -> None:
        self.calls.append("announce")

    async def withdraw(self) -> None:
        self.calls.append("withdraw")


def registered(driver: str) -> float | None:
    return REGISTRY.get_sample_value("gpudra_kubeletplugin_registered", {"driver": driver})


async def test_the_registered_gauge_follows_the_kubelets_word_per_driver() -> None:
    presence = FakePresence()
    gpu = RegistrationServicer(
        "test-gpu.example.com", "/dra.sock", ["v1.DRAPlugin"], cast(Presence, presence)
    )
    other = RegistrationServicer(
        "test-other.example.com", "/other.sock", ["v1.DRAPlugin"], cast(Presence, presence)
    )
    assert registered("test-gpu.example.com") == 0  # serving, not yet registered
    context = cast(Any, None)

    await gpu.NotifyRegistrationStatus(pb.RegistrationStatus(plugin_registered=True), context)
    assert registered("test-gpu.example.com") == 1
    assert registered("test-other.example.com") == 0  # each driver is registered on its own

    await gpu.NotifyRegistrationStatus(
        pb.RegistrationStatus(plugin_registered=False, error="no supported version"), context
    )
    assert registered("test-gpu.example.com") == 0
    assert presence.calls == ["announce", "withdraw"]

    await other.NotifyRegistrationStatus(pb.RegistrationStatus(plugin_registered=True), context)
    other.deregistered()  # shutdown: the registration socket is gone
    assert registered("test-other.example.com") == 0
    assert not other.registered
