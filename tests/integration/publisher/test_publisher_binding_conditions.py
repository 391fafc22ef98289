"""The channel devices' binding conditions, as ``gpudra publisher`` publishes them per release.

On Kubernetes 1.37 (1.36+: DRADeviceBindingConditions beta and on) every node's
``channel-0`` carries bindingConditions [IMEXDomainReady] and bindingFailureConditions
[IMEXDomainFailed] and ``daemon-0`` none; on 1.35 (the gate alpha and off, the field
dropped) the publisher leaves them out, so a channel claim is scheduled as before and
waits inside its prepare; ``--binding-conditions off`` leaves them out anywhere. Each
against a real kube-apiserver of that release (1.35 built on demand and cached).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.client import http_api
from services.core.kube.resource import Device
from services.core.model import computedomain as cd
from services.core.model.schemas import PluginPresence
from services.local.cluster import ControlPlane
from services.local.natsserver import NatsServer
from services.offline.slices import fleet_inventory
from services.publisher.kubeapi import KubeSliceApi
from tests.helpers.publisher import PublisherProcess, put_inventory

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODE = "bc-node-gb200"


@pytest.fixture(scope="module", params=[37, 35], ids=["1.37", "1.35"])
def apiserver(
    request: pytest.FixtureRequest, controlplane_for: Callable[[int], Path]
) -> Iterator[tuple[int, ControlPlane]]:
    minor = int(request.param)
    with ControlPlane(controlplane_for(minor), nodes=[NODE]) as cp:
        yield minor, cp


async def published(
    cp: ControlPlane, nats_server: NatsServer, bus: Bus, log: Path, *extra: str
) -> dict[str, Device]:
    """The node's compute-domain pool as a publisher run with ``extra`` writes it."""
    api = KubeSliceApi(await http_api(str(cp.kubeconfig)), driver=cd.CD_DRIVER)
    proc = PublisherProcess(nats_server, cp.kubeconfig, log, "--compute-domains", *extra)
    try:
        await put_inventory(bus, fleet_inventory("gb200-nvl72", NODE))
        record = PluginPresence(node=NODE, driver=cd.CD_DRIVER, endpoint="/plugins/cd/dra.sock")
        await bus.kv_put(
            subjects.PRESENCE_BUCKET, subjects.presence_key(NODE, cd.CD_DRIVER), record
        )
        deadline = time.monotonic() + 60
        while not (items := (await api.list_slices(NODE)).items):
            assert proc.alive(), proc.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "timed out waiting for the pool"
            await asyncio.sleep(0.1)
        [pool] = items
        return {d.name: d for d in pool.spec.devices or []}
    finally:
        proc.stop()
        for s in (await api.list_slices(NODE)).items:  # the next run starts from nothing
            await api.delete(s.metadata.name, uid=s.metadata.uid, resource_version=None)
        await api.close()


async def test_channel_devices_carry_binding_conditions_where_the_release_has_them(
    apiserver: tuple[int, ControlPlane], nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    minor, cp = apiserver
    devices = await published(cp, nats_server, bus, tmp_path / "publisher.log")
    channel, daemon = devices["channel-0"], devices[cd.DAEMON_DEVICE]
    if minor >= 36:
        assert channel.binding_conditions == [cd.IMEX_DOMAIN_READY]
        assert channel.binding_failure_conditions == [cd.IMEX_DOMAIN_FAILED]
    else:
        assert channel.binding_conditions is None and channel.binding_failure_conditions is None
    assert daemon.binding_conditions is None and daemon.binding_failure_conditions is None
    assert channel.binds_to_node is None  # a node-local pool binds to its node already
    log = (tmp_path / "publisher.log").read_text()
    assert '"binding conditions on channel devices"' in log


async def test_binding_conditions_off_publishes_none(
    apiserver: tuple[int, ControlPlane], nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    _, cp = apiserver
    log = tmp_path / "publisher.log"
    devices = await published(cp, nats_server, bus, log, "--binding-conditions", "off")
    assert all(d.binding_conditions is None for d in devices.values())
