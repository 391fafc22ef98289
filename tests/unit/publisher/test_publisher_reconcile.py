"""The reconciler against the in-memory API server: writes only what differs, never churns."""

from __future__ import annotations

import msgspec
import pytest

from services.core.kube.resource import DeviceTaint, ResourceSlice
from services.core.model import featuregates, shares
from services.core.model.schemas import GpuHealth, NodeInventory, Xid
from services.publisher import metrics
from services.publisher.memoryapi import MemorySliceApi
from services.publisher.poolplan import fingerprint, plan_pool
from services.publisher.reconcile import NodeNotFound, Reconciler, RetryPolicy, SyncFailed
from services.publisher.render import RenderOptions, render_contents
from tests.helpers.inventories import h100, node

FAST = RetryPolicy(attempts=4, initial_s=0.001, max_s=0.01)
# Counter sets and XID taints in one pool. The reference refuses these two gates
# together at start-up (so does featuregates.parse); the reconciler must still
# handle a pool with both, so the gates are built directly.
DYNAMIC = RenderOptions(
    gates=featuregates.FeatureGates(
        {
            **featuregates.DEFAULTS,
            featuregates.DYNAMIC_MIG: True,
            featuregates.NVML_DEVICE_HEALTH_CHECK: True,
        }
    )
)


def _contents(inv: NodeInventory, options: RenderOptions = DYNAMIC):
    return render_contents(inv, options)


def _by_name(api: MemorySliceApi) -> dict[str, ResourceSlice]:
    return {s.metadata.name: s for s in api.stored()}


def _with_xid(inv: NodeInventory, index: int, xid: int) -> NodeInventory:
    gpus = list(inv.gpus)
    gpus[index] = msgspec.structs.replace(gpus[index], health=GpuHealth(xids=[Xid(xid, 1.0)]))
    return msgspec.structs.replace(inv, gpus=gpus)


async def test_first_sync_creates_the_pool_owned_by_its_node() -> None:
    api = MemorySliceApi()
    result = await Reconciler(api, FAST).sync("n1", _contents(node()))
    assert (result.created, result.updated, result.deleted) == (9, 0, 0)
    stored = _by_name(api)
    assert sorted(stored) == sorted(f"n1-gpu.nvidia.com-{i}" for i in range(9))
    uid = api.nodes["n1"]
    for s in stored.values():
        assert (s.spec.pool.generation, s.spec.pool.resource_slice_count) == (1, 9)
        (owner,) = s.metadata.owner_references or []
        assert (owner.kind, owner.name, owner.uid, owner.controller) == ("Node", "n1", uid, True)


async def test_the_same_contents_again_and_a_restart_write_nothing() -> None:
    api = MemorySliceApi()
    await Reconciler(api, FAST).sync("n1", _contents(node()))
    writes = len(api.writes)
    again = await Reconciler(api, FAST).sync("n1", _contents(node()))  # a fresh process
    assert again.writes == 0 and len(api.writes) == writes
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    assert reconciler.is_current("n1", fingerprint(_contents(node())))
    assert len(api.writes) == writes


async def test_one_changed_slice_is_updated_in_place_at_the_same_generation() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    before = _by_name(api)
    result = await reconciler.sync("n1", _contents(_with_xid(node(), 3, 79)))
    assert (result.created, result.updated, result.deleted, result.generation) == (0, 1, 0, 1)
    (write,) = api.writes[-1:]
    assert write.op == "update" and write.name == "n1-gpu.nvidia.com-4"  # GPU 3's devices
    after = _by_name(api)
    changed = after["n1-gpu.nvidia.com-4"]
    assert changed.metadata.uid == before["n1-gpu.nvidia.com-4"].metadata.uid  # same object
    tainted = [d.name for d in changed.spec.devices or [] if d.taints]
    assert tainted == ["gpu-3"]  # an XID without GI/CI lands on the full GPU


async def test_several_changed_slices_bump_the_generation_of_all() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    changed = _with_xid(_with_xid(node(), 3, 79), 5, 48)
    result = await reconciler.sync("n1", _contents(changed))
    assert (result.updated, result.generation) == (9, 2)
    assert {s.spec.pool.generation for s in api.stored()} == {2}


async def test_a_smaller_pool_deletes_obsolete_slices_first() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    result = await reconciler.sync("n1", _contents(node(gpus=[h100(0), h100(1)])))
    assert (result.deleted, result.updated, result.created) == (6, 3, 0)
    assert [w.op for w in api.writes[-9:]] == ["delete"] * 6 + ["update"] * 3
    assert {s.spec.pool.resource_slice_count for s in api.stored()} == {3}


async def test_none_removes_the_pool_and_other_nodes_are_untouched() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    await reconciler.sync("n2", _contents(node("n2")))
    result = await reconciler.sync("n1", None)
    assert result.deleted == 9
    assert {s.spec.node_name for s in api.stored()} == {"n2"}
    assert (await reconciler.sync("n1", None)).writes == 0


async def test_server_set_taint_times_and_quantity_spelling_are_not_differences() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    tainted = _contents(_with_xid(node(), 0, 79))
    await reconciler.sync("n1", tainted)
    # The server stamps taints and may spell quantities its own way.
    for s in api.stored():
        for d in s.spec.devices or []:
            d.taints = [
                msgspec.structs.replace(t, time_added="2026-01-01T00:00:00Z")
                for t in d.taints or []
            ] or None
            if d.capacity and "memory" in d.capacity and d.capacity["memory"].value == "81559Mi":
                d.capacity["memory"].value = "85520809984"
        await api._put(s, s.metadata.uid or "")  # stored as the server would have it
    assert (await Reconciler(api, FAST).sync("n1", tainted)).writes == 0
    # A real change keeps the time of the taints that stayed.
    changed = _contents(_with_xid(_with_xid(node(), 0, 79), 1, 48))
    await Reconciler(api, FAST).sync("n1", changed)
    gpu0 = _by_name(api)["n1-gpu.nvidia.com-1"].spec.devices or []
    assert {t.time_added for d in gpu0 for t in d.taints or []} == {"2026-01-01T00:00:00Z"}


async def test_conflicts_are_retried_from_a_fresh_list() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    retries = metrics.API_RETRIES.labels(reason="409")._value.get()
    api.fail_next("replace", 409, "the object has been modified")
    api.fail_next("list", 500, "etcd leader changed")
    result = await reconciler.sync("n1", _contents(_with_xid(node(), 2, 79)))
    assert result.updated == 1
    assert metrics.API_RETRIES.labels(reason="409")._value.get() == retries + 1
    assert api.calls["list"] >= 3


async def test_a_concurrent_writer_makes_us_reread_not_overwrite() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    await api.mutate("n1-gpu.nvidia.com-3")  # someone else's edit between our list and write
    reconciler.forget("n1")
    result = await reconciler.sync("n1", _contents(_with_xid(node(), 2, 79)))
    assert result.updated == 1  # the annotation does not count, the taint does
    assert _by_name(api)["n1-gpu.nvidia.com-3"].metadata.annotations == {"touched-by": "external"}


async def test_invalid_slices_fail_without_retrying() -> None:
    api = MemorySliceApi()
    api.fail_next("create", 422, "spec.devices: Too many")
    with pytest.raises(SyncFailed, match="422"):
        await Reconciler(api, FAST).sync("n1", _contents(node()))
    assert api.calls["list"] == 1


async def test_retries_give_up_after_the_policy_allows() -> None:
    api = MemorySliceApi()
    for _ in range(FAST.attempts):
        api.fail_next("list", 503, "unavailable")
    with pytest.raises(SyncFailed, match="503"):
        await Reconciler(api, FAST).sync("n1", _contents(node()))


async def test_no_slices_for_a_node_without_a_node_object() -> None:
    api = MemorySliceApi(missing_nodes={"ghost"})
    with pytest.raises(NodeNotFound, match="ghost"):
        await Reconciler(api, FAST).sync("ghost", _contents(node("ghost")))
    assert api.writes == []


def test_plan_keeps_generation_for_one_update_and_bumps_for_creates() -> None:
    contents = _contents(node())
    fresh = plan_pool("n1", contents, [], owner=None)
    assert (len(fresh.create), fresh.generation) == (9, 1)
    slices = fresh.create
    for s in slices:
        s.metadata.resource_version = "1"
    assert plan_pool("n1", contents, slices, owner=None).empty
    one = _contents(_with_xid(node(), 0, 79))
    plan = plan_pool("n1", one, slices, owner=None)
    assert (len(plan.update), plan.generation, plan.update[0].metadata.resource_version) == (
        1,
        1,
        "1",
    )
    stray = msgspec.structs.replace(
        slices[0],
        metadata=msgspec.structs.replace(slices[0].metadata, name="n1-gpu.nvidia.com-old"),
    )
    plan = plan_pool("n1", contents, [*slices, stray], owner=None)
    assert [s.metadata.name for s in plan.delete] == ["n1-gpu.nvidia.com-old"]
    assert plan.update == [] and plan.create == []


def test_taint_model_round_trips() -> None:
    taint = DeviceTaint(key="gpu.nvidia.com/xid", value="79", effect="NoSchedule")
    assert msgspec.json.decode(msgspec.json.encode(taint), type=DeviceTaint) == taint


async def test_a_recreated_node_becomes_the_only_owner() -> None:
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node()))
    api.nodes["n1"] = "0f0f0f0f-0000-4000-8000-000000000001"  # deleted and created again
    reconciler.forget("n1")
    result = await reconciler.sync("n1", _contents(node()))
    assert result.updated == 9
    for s in api.stored():
        assert [o.uid for o in s.metadata.owner_references or []] == [api.nodes["n1"]]


async def test_fields_the_server_drops_are_reported_once_and_not_rewritten() -> None:
    api = MemorySliceApi(drops=frozenset({"sharedCounters", "consumesCounters", "taints"}))
    reconciler = Reconciler(api, FAST)
    counted = metrics.DROPPED_FIELDS.labels(field="sharedCounters")
    before = counted._value.get()
    await reconciler.sync("n1", _contents(node()))
    assert not any(s.spec.shared_counters for s in api.stored())
    assert reconciler.dropped == {"sharedCounters", "consumesCounters"}
    assert counted._value.get() == before + 1
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node()))).writes == 0
    tainted = _contents(_with_xid(node(), 0, 79))
    await reconciler.sync("n1", tainted)  # the first taint shows taints are dropped too
    assert "taints" in reconciler.dropped
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", tainted)).writes == 0


async def test_shares_on_a_server_without_consumable_capacity_are_not_rewritten() -> None:
    """Without DRAConsumableCapacity the server keeps neither allowMultipleAllocations nor
    the request policies: reported once, and the slices are compared without them."""
    options = RenderOptions(
        gates=featuregates.parse("ConsumableShares=true"), shares=shares.parse_mode("memory")
    )
    api = MemorySliceApi(drops=frozenset({"allowMultipleAllocations"}))
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node(), options))
    stored = [d for s in api.stored() for d in s.spec.devices or []]
    assert stored and not any(d.allow_multiple_allocations for d in stored)
    assert not any(c.request_policy for d in stored for c in (d.capacity or {}).values())
    assert reconciler.dropped == {"allowMultipleAllocations"}
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node(), options))).writes == 0


LISTS = RenderOptions(gates=featuregates.parse("DRAListTypeAttributes=true"), kube_minor=37)
NUMA = "resource.kubernetes.io/numaNode"


def _numa_forms(api: MemorySliceApi) -> set[str]:
    return {
        "ints" if d.attributes[NUMA].is_list else "int"
        for s in api.stored()
        for d in s.spec.devices or []
        if d.attributes and NUMA in d.attributes
    }


async def test_a_server_that_refuses_list_attributes_gets_the_int_once_and_no_churn() -> None:
    """kube-apiserver without DRAListTypeAttributes drops ``ints`` and refuses the slice
    (the attribute is left without a value, 422): the publisher writes the int instead,
    says so once (log, metric), and later syncs write nothing."""
    api = MemorySliceApi(refuses_lists=True)
    reconciler = Reconciler(api, FAST)
    counted = metrics.DROPPED_FIELDS.labels(field="listTypeAttributes")
    before = counted._value.get()
    first = await reconciler.sync("n1", _contents(node(), LISTS))
    assert first.created == 1 and _numa_forms(api) == {"int"}
    assert reconciler.dropped == {"listTypeAttributes"}
    assert counted._value.get() == before + 1
    assert metrics.LIST_ATTRIBUTES_REFUSED._value.get() == 1
    assert api.calls["create"] == 2  # the refused one, then the int
    for _ in range(3):
        reconciler.forget("n1")
        assert (await reconciler.sync("n1", _contents(node(), LISTS))).writes == 0
    assert api.calls["create"] == 2 and "replace" not in api.calls
    assert counted._value.get() == before + 1  # said once

    # A full resync tries the lists again: one refused write, nothing changes.
    reconciler.retry_list_attributes()
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node(), LISTS))).writes == 0
    assert api.calls["replace"] == 1 and _numa_forms(api) == {"int"}

    # Once the server stores lists, the next resync writes them.
    api.refuses_lists = False
    reconciler.retry_list_attributes()
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node(), LISTS))).updated == 1
    assert _numa_forms(api) == {"ints"} and reconciler.dropped == set()
    assert metrics.LIST_ATTRIBUTES_REFUSED._value.get() == 0
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node(), LISTS))).writes == 0


async def test_list_attributes_a_server_drops_without_a_word_are_not_rewritten() -> None:
    api = MemorySliceApi(drops=frozenset({"listTypeAttributes"}))
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node(), LISTS))
    assert reconciler.dropped == {"listTypeAttributes"} and _numa_forms(api) == {"int"}
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node(), LISTS))).writes == 0


async def test_another_422_is_not_taken_for_refused_lists() -> None:
    api = MemorySliceApi()
    api.fail_next("create", 422, 'spec.devices[0].name: Invalid value: "GPU_0": a DNS label')
    with pytest.raises(SyncFailed, match="DNS label"):
        await Reconciler(api, FAST).sync("n1", _contents(node(), LISTS))


async def test_skip_node_operations_someone_put_on_our_slice_is_taken_off() -> None:
    """A slice of ours never skips prepare: every gpudra device needs its CDI spec."""
    api = MemorySliceApi()
    reconciler = Reconciler(api, FAST)
    await reconciler.sync("n1", _contents(node(), RenderOptions()))
    (stored,) = api.stored()
    spec = msgspec.structs.replace(stored.spec, skip_node_operations=["*"])
    await api.replace(msgspec.structs.replace(stored, spec=spec))
    reconciler.forget("n1")
    assert (await reconciler.sync("n1", _contents(node(), RenderOptions()))).updated == 1
    assert [s.spec.skip_node_operations for s in api.stored()] == [None]
