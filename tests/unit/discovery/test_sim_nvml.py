"""The simulated NVML: MIG rules and errors as NVML has them, UUIDs, faults, events."""

from __future__ import annotations

import pytest

from services.discovery import backend as nv
from services.discovery import mig
from services.discovery.fleet import get_fleet
from services.discovery.sim import SimNvml, SimStateError, check_state
from services.discovery.simstate import copy_state


def boot(fleet: str = "dgx-h100", node: str = "node-a", seed: int = 0) -> SimNvml:
    sim = SimNvml.boot(node, get_fleet(fleet), seed)
    sim.init()
    return sim


def layout(sim: SimNvml, gpu: int) -> list[tuple[str, int, int]]:
    names = {p.id: p.name for p in sim.gpu_instance_profiles(gpu)}
    return [(names[m.gi_profile_id], m.placement.start, m.gi_id) for m in sim.mig_devices(gpu)]


def test_dgx_a100_boots_with_static_layout_on_gpus_4_to_7() -> None:
    sim = boot("dgx-a100")
    assert [sim.mig_mode(i)[0] for i in range(8)] == [False] * 4 + [True] * 4
    assert layout(sim, 4) == [("3g.20gb", 0, 1), ("2g.10gb", 4, 5), ("1g.5gb", 6, 13)]
    assert layout(sim, 5) == [("1g.5gb", s, 7 + s) for s in range(7)]
    assert layout(sim, 6) == [("4g.20gb", 0, 1), ("3g.20gb", 4, 2)]
    assert layout(sim, 7) == [
        ("1g.10gb", 0, 3),
        ("1g.10gb", 2, 4),
        ("2g.10gb", 4, 5),
        ("1g.5gb+me", 6, 13),
    ]
    assert all(len(m.uuid) == 40 and m.uuid.startswith("MIG-") for m in sim.mig_devices(5))


def test_create_and_destroy_follow_nvml() -> None:
    sim = boot()
    sim.set_mig_mode(0, True)
    gi, where = sim.create_gpu_instance(0, 9, 4)  # 3g.40gb at 4
    assert (gi, where) == (2, nv.Placement(4, 4))
    ci, uuid = sim.create_compute_instance(0, gi)
    assert ci == 0 and uuid.startswith("MIG-")
    whole, _ = sim.create_gpu_instance(0, 19, None)  # 1g.10gb: first free start is 0
    assert whole == 7
    with pytest.raises(nv.InUse):
        sim.destroy_gpu_instance(0, gi)  # its compute instance still exists
    sim.destroy_compute_instance(0, gi, ci)
    sim.destroy_gpu_instance(0, gi)
    with pytest.raises(nv.NotFound):
        sim.destroy_gpu_instance(0, gi)
    with pytest.raises(nv.NotFound):
        sim.destroy_compute_instance(0, whole, 0)
    assert [m.gi_id for m in sim.mig_devices(0)] == []  # GI 7 has no CI: not a MIG device


@pytest.mark.parametrize(
    ("setup", "profile", "start", "error", "message"),
    [
        ([], 9, 2, nv.InvalidArgument, "cannot start at 2"),
        ([], 99, None, nv.InvalidArgument, "no GPU instance profile id 99"),
        ([(9, 0)], 9, 0, nv.InsufficientResources, "overlaps"),
        ([(9, 0)], 5, None, nv.InsufficientResources, "overlaps"),
        ([(0, 0)], 19, None, nv.InsufficientResources, "not enough compute slices"),
        ([(20, 0)], 20, 3, nv.InsufficientResources, "at most 1 x 1g.10gb\\+me"),
        ([(15, 0), (15, 2), (15, 4), (15, 6)], 15, None, nv.InsufficientResources, "4 x 1g.20gb"),
    ],
)
def test_placement_conflicts_are_nvml_errors(
    setup: list[tuple[int, int]],
    profile: int,
    start: int | None,
    error: type[nv.NvmlError],
    message: str,
) -> None:
    sim = boot()
    sim.set_mig_mode(0, True)
    for pid, s in setup:
        sim.create_gpu_instance(0, pid, s)
    before = copy_state(sim.state)
    with pytest.raises(error, match=message) as caught:
        sim.create_gpu_instance(0, profile, start)
    assert caught.value.symbol.startswith("NVML_ERROR_")
    assert [g.gpu_instances for g in sim.state.gpus] == [g.gpu_instances for g in before.gpus]


def test_mig_calls_need_mig_mode_and_a_mig_gpu() -> None:
    sim = boot("mixed")
    with pytest.raises(nv.NotSupported, match="MIG mode is disabled"):
        sim.create_gpu_instance(0, 19, None)  # H100 whole
    with pytest.raises(nv.NotSupported, match="no MIG support"):
        sim.mig_mode(3)  # L4
    with pytest.raises(nv.NotSupported):
        sim.gpu_instance_profiles(3)
    with pytest.raises(nv.InUse):
        sim.set_mig_mode(1, False)  # A100 with live GPU instances
    sim.set_mig_mode(0, True)
    sim.set_mig_mode(0, False)
    assert sim.mig_mode(0) == (False, False)


def test_compute_instance_takes_the_whole_gpu_instance() -> None:
    sim = boot()
    sim.set_mig_mode(0, True)
    gi, _ = sim.create_gpu_instance(0, 14, 2)
    sim.create_compute_instance(0, gi)
    with pytest.raises(nv.InsufficientResources, match="compute slices are taken"):
        sim.create_compute_instance(0, gi)
    with pytest.raises(nv.NotFound):
        sim.create_compute_instance(0, 6)


def test_uuids_are_stable_per_seed_and_node_and_new_for_recreated_mig() -> None:
    a, b = boot("dgx-a100"), boot("dgx-a100")
    assert [a.uuid(i) for i in range(8)] == [b.uuid(i) for i in range(8)]
    assert a.mig_devices(5) == b.mig_devices(5)
    other_seed, other_node = boot("dgx-a100", seed=1), boot("dgx-a100", node="node-b")
    other_fleet = boot("dgx-h100")
    assert len({a.uuid(0), other_seed.uuid(0), other_node.uuid(0), other_fleet.uuid(0)}) == 4
    assert all(a.uuid(i).startswith("GPU-") and len(a.uuid(i)) == 40 for i in range(8))
    assert len({a.uuid(i) for i in range(8)}) == 8

    first = mig.create(a, 0, "1g.5gb", 3)
    mig.destroy(a, 0, first.gi_id, first.ci_id)
    again = mig.create(a, 0, "1g.5gb", 3)
    assert (again.gi_id, again.placement) == (first.gi_id, first.placement)
    assert again.uuid != first.uuid  # NVML gives a re-created MIG device a new UUID


def test_mig_create_enables_mig_and_rolls_back_on_failure() -> None:
    sim = boot()
    dev = mig.create(sim, 1, "2g.20gb", None)
    assert sim.mig_mode(1) == (True, True)
    assert (dev.profile, dev.gi_profile_id, dev.gi_id, dev.placement.start) == ("2g.20gb", 14, 3, 0)

    class FailingCi(SimNvml):
        def create_compute_instance(self, index: int, gi_id: int) -> tuple[int, str]:
            raise nv.InsufficientResources("no CI today")

    failing = FailingCi(copy_state(sim.state))
    failing.init()
    with pytest.raises(nv.InsufficientResources):
        mig.create(failing, 1, "1g.10gb", 6)
    assert [g.id for g in failing.state.gpus[1].gpu_instances] == [3]  # the new GI was removed
    with pytest.raises(nv.InvalidArgument, match=r"no MIG profile '9g\.1gb'; valid: 1g\.10gb"):
        mig.create(sim, 1, "9g.1gb", None)


def test_lost_gpu_fails_every_query_but_not_the_others() -> None:
    sim = boot()
    sim.set_lost(3, True)
    with pytest.raises(nv.GpuLost):
        sim.uuid(3)
    with pytest.raises(nv.GpuLost):
        sim.mig_devices(3)
    assert sim.product_name(2) == "NVIDIA H100 80GB HBM3"
    sim.set_lost(3, False)
    assert sim.uuid(3).startswith("GPU-")


def test_xids_become_events_for_processes_that_load_the_state_later() -> None:
    writer, reader = boot("dgx-a100"), SimNvml(copy_state(boot("dgx-a100").state))
    reader.init()
    assert reader.wait_event(0) is None
    writer.inject_xid(2, 79, None, None)
    writer.inject_xid(5, 31, 9, 0)
    with pytest.raises(nv.NotFound):
        writer.inject_xid(5, 31, 9, 1)
    with pytest.raises(nv.InvalidArgument):
        writer.inject_xid(5, 31, 9, None)
    reader.load(copy_state(writer.state))
    first, second = reader.wait_event(0), reader.wait_event(0)
    assert first is not None and second is not None
    assert (first.gpu_uuid, first.xid, first.gi_id) == (writer.uuid(2), 79, None)
    assert (second.xid, second.gi_id, second.ci_id) == (31, 9, 0)
    reader.load(copy_state(writer.state))  # the same events are not delivered twice
    assert reader.wait_event(0) is None


def test_unusable_states_are_rejected() -> None:
    state = copy_state(boot().state)
    state.gpus[2].model = "B300"
    with pytest.raises(SimStateError, match=r"gpus\[2\].*B300"):
        check_state(state)
    state = copy_state(boot().state)
    state.schema_version = 99
    with pytest.raises(SimStateError, match="schema version 99"):
        SimNvml(state)
