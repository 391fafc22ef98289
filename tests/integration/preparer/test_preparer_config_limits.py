"""Configs that cannot mean what they say, through the real preparer: refused, or capped.

Found by an attacker with a Role for claims only: ``defaultPinnedDeviceMemoryLimit:
99999999999999999999999Ei`` was accepted (a 36-digit MiB figure in the checkpoint and
the MPS daemon), and a ``MigDeviceConfig`` naming no request on a claim for a full
GPU was silently replaced by the default (the reference does the same). Now:

- a limit beyond what a Kubernetes quantity's value holds is refused, naming the field;
- a limit above the memory of the device it lands on is capped to that memory, and the
  preparer logs it and counts it (a ceiling the device already meets, see
  docs/differences.md);
- a config naming no request whose kind fits none of the claim's devices is the
  claim's error, naming the config, its kind and the devices.

Each refused claim leaves nothing: no checkpoint entry, no CDI spec, no MPS daemon.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.preparer import API, Dev, Node, gpu_config, make_claim, opaque, ref

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


async def test_a_pinned_limit_no_device_can_have_is_refused(node: Node) -> None:
    await node.start_preparer(gates=GATES)
    config = gpu_config(
        strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "99999999999999999999999Ei"}
    )
    claim = await node.put_claim(
        make_claim(node.name, [Dev("gpu", "gpu-0")], name="huge", configs=[opaque(config)])
    )
    uid = ref(claim).uid
    error = (await node.prepare(claim)).claims[uid].error
    assert (
        "config[0] (FromClaim) GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
        "99999999999999999999999Ei is more memory than any device has"
    ) in error, error
    assert_nothing_left(node, uid)


async def test_a_pinned_limit_above_the_gpus_memory_is_capped_and_logged(node: Node) -> None:
    preparer = await node.start_preparer(gates=GATES)
    inv = await node.inventory()
    assert inv is not None
    gpu = next(g for g in inv.gpus if g.minor == 0)
    memory_mib = gpu.memory_bytes // 2**20
    config = gpu_config(
        strategy="MPS",
        mpsConfig={
            "defaultPinnedDeviceMemoryLimit": "1Ti",
            "defaultPerDevicePinnedMemoryLimit": {},
        },
    )
    claim = await node.put_claim(
        make_claim(node.name, [Dev("gpu", "gpu-0")], name="big", configs=[opaque(config)])
    )
    uid = ref(claim).uid
    assert (await node.prepare(claim)).claims[uid].error == ""

    [daemon] = node.sim_host()["mps"].values()
    assert daemon["pinnedMemoryLimitsMib"] == {gpu.uuid: memory_mib}  # not 1048576
    [group] = node.checkpoint().claims[uid].groups
    assert group.mps is not None and group.mps.pinned_memory_limits_mib == {gpu.uuid: memory_mib}
    log = preparer.output()
    assert "pinned memory limit above the device's memory; capped to it" in log, log[-2000:]
    assert "1048576" in log and str(memory_mib) in log
    assert (await node.unprepare(claim)).claims[uid].error == ""
