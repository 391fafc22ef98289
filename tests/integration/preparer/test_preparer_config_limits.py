"""Configs that cannot mean what they say, through the real preparer: refused, not dropped.

Found by an attacker with a Role for claims only: a ``MigDeviceConfig`` naming no
request on a claim for a full GPU was silently replaced by the default (the reference
does the same). Now a config naming no request whose kind fits none of the claim's
devices is the claim's error, naming the config, its kind and the devices, and the
claim leaves nothing: no checkpoint entry, no CDI spec, no MPS daemon.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.preparer import API, Dev, Node, make_claim, opaque, ref

pytestmark = pytest.mark.integration

GATES = "MPSSupport=true,TimeSlicingSettings=true,PassthroughSupport=true"


def assert_nothing_left(node: Node, uid: str) -> None:
    assert uid not in node.checkpoint().claims
    assert node.cdi_files() == []
    assert node.sim_host().get("mps", {}) == {}


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
         "config[0] (FromClaim) MigDeviceConfig: names no request and fits none of the claim's "
         "devices ('gpu-0' of type gpu): a MigDeviceConfig applies to mig devices only; it "
         "would be replaced by the default"),
        ({"apiVersion": API, "kind": "VfioDeviceConfig"},
         "config[0] (FromClaim) VfioDeviceConfig: names no request and fits none of the "
         "claim's devices ('gpu-0' of type gpu): a VfioDeviceConfig applies to vfio devices"),
    ],
    ids=["mig-config-on-a-gpu", "vfio-config-on-a-gpu"],
)  # fmt: skip
async def test_a_config_none_of_the_claims_devices_takes_is_the_claims_error(
    node: Node, params: dict[str, Any], words: str
) -> None:
    await node.start_preparer(gates=GATES)
    claim = await node.put_claim(
        make_claim(node.name, [Dev("gpu", "gpu-0")], name="fit", configs=[opaque(params)])
    )
    uid = ref(claim).uid
    error = (await node.prepare(claim)).claims[uid].error
    assert error == f"claim default/fit: {words}" or words in error, error
    assert_nothing_left(node, uid)
