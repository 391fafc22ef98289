"""The nvidia.com/gpu.clique node label against a real kube-apiserver (v1.35).

The labeler is fed inventories as the publisher's inventory watch feeds it; the
label is read back from the API server. Skipped where the control plane cannot be
built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.core.kube.client import KubeApi, http_api
from services.core.model import cliques
from services.local.cluster import ControlPlane
from services.offline.slices import fleet_inventory
from services.publisher.cliquelabel import CliqueLabeler

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
TRAY, PLAIN = "tray-1", "h100-1"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=[TRAY, PLAIN]) as cp:
        yield cp


async def _label(api: KubeApi, node: str) -> str | None:
    labels = json.loads(await api.get(f"/api/v1/nodes/{node}"))["metadata"].get("labels", {})
    value = labels.get(cliques.GPU_CLIQUE_LABEL)
    return None if value is None else str(value)


async def _until(api: KubeApi, node: str, want: str | None) -> None:
    while await _label(api, node) != want:
        await asyncio.sleep(0.05)


async def test_label_follows_the_inventory(apiserver: ControlPlane) -> None:
    api = await http_api(str(apiserver.kubeconfig))
    labeler = CliqueLabeler(api, retry_s=0.1)
    task = asyncio.create_task(labeler.run())
    try:
        tray = fleet_inventory("gb200-nvl72", TRAY)
        clique = cliques.node_clique_id(tray.gpus)
        assert clique.endswith(".1")
        labeler.set_inventory(TRAY, tray)
        labeler.set_inventory(PLAIN, fleet_inventory("dgx-h100", PLAIN))
        labeler.set_inventory("no-such-node", tray)  # retried, never fatal
        await asyncio.wait_for(_until(api, TRAY, clique), 30)
        assert await _label(api, PLAIN) is None
        # The same node now reports GPUs outside any fabric: the label goes.
        labeler.set_inventory(TRAY, fleet_inventory("dgx-h100", TRAY))
        await asyncio.wait_for(_until(api, TRAY, None), 30)
        assert not task.done()
    finally:
        task.cancel()
        await api.close()
