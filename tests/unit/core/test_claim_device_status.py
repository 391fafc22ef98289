"""status.devices entries (KEP-4817): what gpudra writes, and how it keeps others' entries.

The writes themselves, their authorization and their preconditions are tried against a
real API server in tests/integration/core/test_claim_device_status.py and
tests/integration/domains/test_domains_binding.py; here the pure parts: merging one driver's
entries into a list, condition times, what a prepared GPU claim's entries say, and how
the controller reads a channel claim and judges its node.
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.core.kube import claimstatus
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainMember
from services.domains import binding
from services.preparer import devicestatus
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    ClaimEntry,
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    ShareState,
)

T0, T1 = "2026-11-27T10:00:00Z", "2026-11-27T11:00:00Z"


def ready(status: bool, since: str, reason: str = "R") -> dict[str, str]:
    return claimstatus.condition("Ready", status, reason, "", since)


def test_a_driver_replaces_its_own_entries_and_keeps_every_other_drivers() -> None:
    nic = claimstatus.entry("nic.example.com", "n1", "eth-0", [ready(True, T0)], data={"ip": "x"})
    old_gpu = claimstatus.entry("gpu.nvidia.com", "n1", "gpu-0", [ready(True, T0)])
    stale = claimstatus.entry("gpu.nvidia.com", "n1", "gpu-9", [ready(True, T0)])
    new_gpu = claimstatus.entry("gpu.nvidia.com", "n1", "gpu-0", [ready(True, T1, "Again")])
    out = claimstatus.merged([nic, old_gpu, stale], "gpu.nvidia.com", [new_gpu])
    assert [claimstatus.key(e) for e in out] == [
        ("nic.example.com", "n1", "eth-0", ""),
        ("gpu.nvidia.com", "n1", "gpu-0", ""),
    ]
    assert out[0] == nic
    # The status did not change: the condition keeps the time it first said so.
    assert out[1]["conditions"][0]["lastTransitionTime"] == T0
    assert out[1]["conditions"][0]["reason"] == "Again"
    assert not claimstatus.same([nic, old_gpu, stale], out)
    assert claimstatus.same(list(reversed(out)), out)  # order does not count


def test_a_condition_that_changes_status_gets_a_new_time() -> None:
    old = claimstatus.entry("d", "p", "x", [ready(False, T0)])
    new = claimstatus.entry("d", "p", "x", [ready(True, T1)])
    (out,) = claimstatus.merged([old], "d", [new])
    assert out["conditions"][0] == {**ready(True, T1)}
    assert claimstatus.same([out], claimstatus.merged([out], "d", [new]))  # nothing more to say


def test_shares_are_entries_of_their_own() -> None:
    a = claimstatus.entry("d", "p", "gpu-0", [], share_id="11111111-1111-4111-8111-111111111111")
    b = claimstatus.entry("d", "p", "gpu-0", [], share_id="22222222-2222-4222-8222-222222222222")
    assert claimstatus.key(a) != claimstatus.key(b)
    assert len(claimstatus.merged([a], "d", [a, b])) == 2


def test_writes_are_wanted_from_1_36_unless_told() -> None:
    assert [claimstatus.wanted("auto", m) for m in (34, 35, 36, 37)] == [False, False, True, True]
    assert claimstatus.wanted("on", 34) and not claimstatus.wanted("off", 37)


# ------------------------------------------------------------------ the preparer's entries


def _entry(*devices: PreparedDeviceState, groups: list[GroupState] | None = None) -> ClaimEntry:
    return ClaimEntry(state=PREPARE_COMPLETED, namespace="ns", name="c", started_at=1.0,
                      completed_at=1_795_000_000.0, devices=list(devices),
                      groups=groups or [])  # fmt: skip


def test_a_prepared_gpu_says_ready_with_its_uuid_pci_address_and_sharing() -> None:
    gpu = PreparedDeviceState(name="gpu-3", kind="gpu", requests=["r"], pool="n1",
                              gpu_uuid="GPU-aaa", pci_bus_id="0000:3b:00.0",
                              cdi_device_ids=["k8s.gpu.nvidia.com/claim=u-gpu-3"])  # fmt: skip
    group = GroupState(kind="GpuConfig", origin="config[0] (FromClaim)",
                       config={"sharing": {"strategy": "TimeSlicing"}})  # fmt: skip
    (e,) = devicestatus.entries(_entry(gpu, groups=[group]))
    assert claimstatus.key(e) == ("gpu.nvidia.com", "n1", "gpu-3", "")
    assert e["conditions"] == [
        {"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
         "lastTransitionTime": claimstatus.stamp(1_795_000_000.0)}
    ]  # fmt: skip
    assert e["data"] == {"uuid": "GPU-aaa", "pciBusID": "0000:3b:00.0",
                         "sharing": "TimeSlicing",
                         "cdiDeviceIDs": ["k8s.gpu.nvidia.com/claim=u-gpu-3"]}  # fmt: skip


def test_a_mig_device_names_its_own_uuid_its_gpu_and_its_profile() -> None:
    mig = MigState(uuid="MIG-bbb", parent_uuid="GPU-aaa", parent_minor=0, profile="3g.40gb",
                   gi_profile_id=2, placement_start=0, gi_id=1, ci_id=0, created=True)  # fmt: skip
    device = PreparedDeviceState(name="gpu-0-mig-3g40gb-0", kind="mig", requests=["r"],
                                 pool="n1", gpu_uuid="GPU-aaa", pci_bus_id="0000:3b:00.0",
                                 mig=mig)  # fmt: skip
    (e,) = devicestatus.entries(_entry(device))
    assert e["data"] == {"uuid": "MIG-bbb", "parentUUID": "GPU-aaa", "migProfile": "3g.40gb",
                         "pciBusID": "0000:3b:00.0"}  # fmt: skip


def test_an_mps_device_says_the_pinned_limit_its_daemon_enforces() -> None:
    """A limit above the device's memory is capped at prepare: the user reads here what
    was applied (81559, not the 1Ti the config asked)."""
    mps = MpsState(
        daemon_id="u-1",
        root_dir="/r",
        pipe_dir="/p",
        shm_dir="/s",
        log_dir="/l",
        device_uuids=["GPU-aaa"],
        pinned_memory_limits_mib={"GPU-aaa": 81559},
    )
    group = GroupState(
        kind="GpuConfig",
        origin="config[0] (FromClaim)",
        config={"sharing": {"strategy": "MPS"}},
        mps=mps,
    )
    gpu = PreparedDeviceState(name="gpu-0", kind="gpu", requests=["r"], pool="n1",
                              gpu_uuid="GPU-aaa")  # fmt: skip
    (e,) = devicestatus.entries(_entry(gpu, groups=[group]))
    assert e["data"] == {"uuid": "GPU-aaa", "sharing": "MPS", "pinnedMemoryLimitMiB": 81559}


def test_a_consumable_share_is_keyed_by_its_share_id_and_says_its_limits() -> None:
    share = ShareState(share_id="33333333-3333-4333-8333-333333333333", device_uuid="GPU-aaa",
                       consumed={"memory": "10Gi"}, daemon_id="d", memory_limit_mib=10240,
                       thread_percentage=13)  # fmt: skip
    device = PreparedDeviceState(name="gpu-0", kind="gpu", requests=["r"], pool="n1",
                                 gpu_uuid="GPU-aaa", share=share)  # fmt: skip
    (e,) = devicestatus.entries(_entry(device))
    assert e["shareID"] == share.share_id
    assert e["data"]["sharing"] == "Shares"
    assert (e["data"]["memoryLimitMiB"], e["data"]["threadPercentage"]) == (10240, 13)


# ------------------------------------------------------------------ the controller's view


def _claim(results: list[dict[str, Any]], config_uid: str = "dom-1", **status: Any) -> Any:
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
              "domainID": config_uid}  # fmt: skip
    config = [{"source": "FromClaim", "requests": ["channel"],
               "opaque": {"driver": cd.CD_DRIVER, "parameters": params}}]  # fmt: skip
    selector = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]}  # fmt: skip
    body = {"metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "5"},
            "status": {"allocation": {"devices": {"results": results, "config": config},
                                      "nodeSelector": selector}, **status}}  # fmt: skip
    return msgspec.convert(body, binding.BoundClaim)


CONDITIONED = {"request": "channel", "driver": cd.CD_DRIVER, "pool": "n7", "device": "channel-0",
               "bindingConditions": [cd.IMEX_DOMAIN_READY],
               "bindingFailureConditions": [cd.IMEX_DOMAIN_FAILED]}  # fmt: skip


def test_a_channel_claim_is_read_for_its_node_domain_and_conditioned_devices() -> None:
    channel = binding.channel_of(_claim([CONDITIONED]))
    assert channel is not None
    assert (channel.node, channel.domain_uid, channel.problem) == ("n7", "dom-1", "")
    assert channel.devices == (("n7", "channel-0", None),)
    plain = {k: v for k, v in CONDITIONED.items() if not k.startswith("binding")}
    unconditioned = binding.channel_of(_claim([plain]))
    assert unconditioned is not None and not unconditioned.conditioned  # placed, never written
    gpu = {**plain, "driver": "gpu.nvidia.com", "device": "gpu-0"}
    assert binding.channel_of(_claim([gpu])) is None
    bad = binding.channel_of(_claim([CONDITIONED], config_uid=""))
    assert bad is not None and "domainID: must not be empty" in bad.problem


def test_a_claim_is_settled_once_its_ready_condition_is_true() -> None:
    channel = binding.channel_of(_claim([CONDITIONED]))
    assert channel is not None
    for state, settled in (
        (binding.WAITING, False),
        (binding.FAILED, False),
        (binding.READY, True),
    ):
        verdict = binding.Verdict(state, "Why", "because")
        devices = binding.entries_for(channel, verdict, T0)
        assert binding.settled(_claim([CONDITIONED], devices=devices), channel) is settled
        types = {c["type"]: c["status"] for c in devices[0]["conditions"]}
        expected = {cd.IMEX_DOMAIN_READY: "True" if settled else "False"}
        if state == binding.FAILED:
            expected[cd.IMEX_DOMAIN_FAILED] = "True"
        assert types == expected


def test_the_member_key_says_what_the_condition_says() -> None:
    def member(status: Any, reason: str = "") -> DomainMember:
        return DomainMember(domain_uid="dom-1", node="n7", ip_address="10.0.0.7",
                            clique_id="c.1", status=status, reason=reason)  # fmt: skip

    assert binding.member_verdict(None, "n7").reason == "IMEXDaemonNotJoined"
    assert binding.member_verdict(member("Ready"), "n7").state == binding.READY
    failed = binding.member_verdict(member("Failed", "nvidia-imex: not found"), "n7")
    assert (failed.state, failed.reason) == (binding.FAILED, "IMEXDaemonFailed")
    assert "nvidia-imex: not found" in failed.message
    waiting = binding.member_verdict(member("NotReady", "peers unreachable"), "n7")
    assert (waiting.state, waiting.reason) == (binding.WAITING, "IMEXDaemonNotReady")


def test_only_channel_devices_carry_binding_conditions() -> None:
    devices = cd.with_binding_conditions(cd.node_devices())
    by_name = {d.name: d for d in devices}
    assert by_name["channel-0"].binding_conditions == [cd.IMEX_DOMAIN_READY]
    assert by_name["channel-0"].binding_failure_conditions == [cd.IMEX_DOMAIN_FAILED]
    assert by_name[cd.DAEMON_DEVICE].binding_conditions is None  # its pod makes the domain Ready
    assert cd.node_devices()[0].binding_conditions is None  # copies: the model is untouched
