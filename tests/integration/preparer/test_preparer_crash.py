"""Crash safety: the preparer killed at each step of a prepare, restarted, asked again.

A fault-injection switch (``GPUDRA_PREPARER_CRASH_AT``) makes the preparer exit
at once (status 137, no clean-up) at one step of preparing a dynamic MIG
claim. The kubelet's call fails; the preparer is started again; the kubelet
repeats the call. Afterwards the node must hold exactly one MIG device for the
claim, one CDI spec, a checkpoint that says so, and an unprepare must leave
nothing behind.
"""

from __future__ import annotations

import pytest

from services.core.bus.failures import RequestFailed
from services.core.model import nvidia
from services.local.kubelet import Claim, FakeKubelet
from services.preparer import cdi
from services.preparer.faults import ENV, EXIT_STATUS, STEPS
from tests.helpers.preparer import Dev, Node, make_claim, ref, validate_cdi_file

pytestmark = pytest.mark.integration

GATES = "DynamicMIG=true,TimeSlicingSettings=true"
MIG = nvidia.mig_device_name(3, "2g.20gb", 14, 2)


async def crash_once(node: Node, step: str, kubelet: FakeKubelet, claim: Claim) -> None:
    preparer = await node.start_preparer(gates=GATES, env={ENV: step})
    results = await kubelet.prepare([claim], timeout=20)
    assert results[claim.uid].error != "", "the kubelet must see the failed call"
    assert preparer.wait(timeout=10) == EXIT_STATUS
    assert f"crashing at {step}" in preparer.output()


async def live_migs_on_gpu3(node: Node) -> list[tuple[str, int, int, int]]:
    inv = await node.inventory()
    assert inv is not None
    return [
        (m.uuid, m.placement.start, m.gi_id, m.ci_id)
        for g in inv.gpus
        if g.minor == 3
        for m in g.mig_devices
    ]


@pytest.mark.parametrize("step", STEPS)
async def test_a_crash_at_any_step_is_repaired_by_the_next_call(node: Node, step: str) -> None:
    node.start_front("--prepare-timeout", "3")
    claim = await node.put_claim(make_claim(node.name, [Dev("slice", MIG)], name="job"))
    r = ref(claim)
    kclaim = Claim(r.uid, r.namespace, r.name)
    async with FakeKubelet(node.paths.kubelet_root) as kubelet:
        await kubelet.wait_for_registration_socket(timeout=20)
        await kubelet.register()
        await crash_once(node, step, kubelet, kclaim)

        await node.start_preparer(gates=GATES)  # the restart repairs what it finds
        results = await kubelet.prepare([kclaim], timeout=20)
        assert results[r.uid].error == "", results[r.uid].error
        [device] = results[r.uid].devices
        assert device.cdi_device_ids == [f"k8s.gpu.nvidia.com/claim={r.uid}-{MIG}"]

        [(uuid, start, gi, ci)] = await live_migs_on_gpu3(node)  # exactly one MIG device
        assert start == 2
        [spec_file] = node.cdi_files()  # exactly one CDI spec
        spec = validate_cdi_file(spec_file)
        paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
        assert paths[1:] == [
            f"/dev/nvidia-caps/nvidia-cap{m}" for m in cdi.mig_cap_minors(3, gi, ci)
        ]
        entries = node.checkpoint().claims
        assert list(entries) == [r.uid]
        entry = entries[r.uid]
        assert entry.state == "PrepareCompleted"
        assert entry.devices[0].mig is not None and entry.devices[0].mig.uuid == uuid

        assert await kubelet.unprepare([kclaim], timeout=20) == {r.uid: ""}
    assert await live_migs_on_gpu3(node) == []
    assert node.cdi_files() == []
    assert dict(node.checkpoint().claims) == {}
    leftovers = sorted(p.name for p in node.paths.plugin_dir.iterdir() if not p.is_socket())
    # The simulated node's driver installation stays, as a real node's driver does.
    assert leftovers == ["checkpoint.json", "preparer.lock", "simulated-driver-root"]


async def test_a_claim_unprepared_after_a_crash_leaves_nothing(node: Node) -> None:
    """The pod went away while the preparer was down: unprepare, not prepare, comes next."""
    claim = await node.put_claim(make_claim(node.name, [Dev("slice", MIG)], name="gone"))
    uid = ref(claim).uid
    preparer = await node.start_preparer(gates=GATES, env={ENV: "after-mig-create"})
    with pytest.raises(RequestFailed):  # the request dies with the preparer
        await node.request("prepare", [ref(claim)], timeout=3)
    assert preparer.wait(timeout=10) == EXIT_STATUS
    await node.wait_for(  # the crash left a MIG device behind ...
        lambda inv: any(g.minor == 3 and g.mig_devices for g in inv.gpus), "the stray MIG device"
    )
    assert node.checkpoint().claims[uid].state == "PrepareStarted"
    await node.start_preparer(gates=GATES)  # ... which the restart rolls back before serving
    assert await live_migs_on_gpu3(node) == []
    assert dict(node.checkpoint().claims) == {}
    assert (await node.unprepare(claim)).claims[uid].error == ""
    assert node.cdi_files() == []


@pytest.mark.parametrize("step", ["after-cdi-write", "before-prepare-completed"])
async def test_a_claim_without_side_effects_needs_no_started_entry(node: Node, step: str) -> None:
    """A full GPU, no sharing: the crash leaves only its spec, which the restart removes."""
    claim = await node.put_claim(make_claim(node.name, [Dev("gpu", "gpu-1")], name="plain"))
    uid = ref(claim).uid
    preparer = await node.start_preparer(gates=GATES, env={ENV: step})
    with pytest.raises(RequestFailed):
        await node.request("prepare", [ref(claim)], timeout=3)
    assert preparer.wait(timeout=10) == EXIT_STATUS
    assert uid not in node.checkpoint().claims  # nothing recorded before the spec ...
    assert [p.name for p in node.cdi_files()] == [cdi.spec_path(node.paths.cdi_root, uid).name]
    await node.start_preparer(gates=GATES)  # ... which start-up removes as an orphan
    assert node.cdi_files() == []
    reply = await node.request("prepare", [ref(claim)], timeout=20)
    assert reply.claims[uid].error == ""
    assert node.checkpoint().claims[uid].state == "PrepareCompleted"
    assert (await node.unprepare(claim)).claims[uid].error == ""
    assert node.cdi_files() == [] and dict(node.checkpoint().claims) == {}
