"""Consumable shares: the published policies (as the reference's consumable_shares.go
renders them) and the checks the preparer makes of a share's consumed capacity."""

from __future__ import annotations

from fractions import Fraction

import pytest

from services.core.kube import resource
from services.core.kube.resource import Device, DeviceCapacity
from services.core.model import featuregates as fg
from services.core.model import shares
from services.offline import slicecheck
from services.offline.slices import fleet_inventory
from services.publisher.render import RenderOptions, render_slices

GATES = fg.parse("ConsumableShares=true")
H100 = Device(name="gpu-0", capacity={"memory": DeviceCapacity(value="85520809984")})


def policy(device: Device, name: str) -> dict[str, object]:
    cap = (device.capacity or {})[name]
    return resource.to_builtins(cap)


def test_memory_mode_defaults_to_the_whole_device_in_1mi_steps() -> None:
    out = shares.advertise(H100, shares.parse_mode("memory"))
    assert out.allow_multiple_allocations is True
    assert policy(out, "memory") == {
        "value": "81559Mi",  # 85520809984 bytes rounded down to whole MiB
        "requestPolicy": {
            "default": "81559Mi",
            "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"},
        },
    }
    assert H100.allow_multiple_allocations is None  # the input is not changed


def test_unlimited_mode_defaults_to_no_memory() -> None:
    out = shares.advertise(H100, shares.parse_mode("unlimited"))
    assert policy(out, "memory")["requestPolicy"] == {
        "default": "0",
        "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"},
    }
    assert set(out.capacity or {}) == {"memory"}


def test_a_share_count_adds_a_shares_capacity() -> None:
    out = shares.advertise(H100, shares.parse_mode("4"))
    assert policy(out, "shares") == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }
    assert policy(out, "memory")["requestPolicy"] == {
        "default": "0",
        "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"},
    }


@pytest.mark.parametrize("text", ["0", "-1", "many", "1.5"])
def test_a_bad_mode_names_the_flag_and_the_choices(text: str) -> None:
    with pytest.raises(shares.SharesError, match=r"--consumable-shares: .*'disabled', 'memory'"):
        shares.parse_mode(text)


def test_a_mode_without_its_gate_is_refused() -> None:
    with pytest.raises(shares.SharesError, match="requires feature gate ConsumableShares"):
        shares.require_gate(shares.parse_mode("memory"), fg.parse(""))
    shares.require_gate(shares.DISABLED, fg.parse(""))


@pytest.mark.parametrize(
    ("fleet", "mode"), [("dgx-h100", "memory"), ("dgx-a100", "4"), ("dgx-a100", "unlimited")]
)
def test_rendered_pools_pass_the_api_servers_rules(fleet: str, mode: str) -> None:
    """Every GPU and MIG device is multi-allocatable; the pool passes the slice checks."""
    inv = fleet_inventory(fleet, "n1", 0)
    options = RenderOptions(gates=GATES, shares=shares.parse_mode(mode))
    slices = render_slices(inv, options, generation=1)
    devices = [d for s in slices for d in s.spec.devices or []]
    assert devices and all(d.allow_multiple_allocations for d in devices)
    assert all("memory" in (d.capacity or {}) for d in devices)
    assert slicecheck.check_pool(slices, kube_minor=35) == []


def test_consumed_capacity_is_checked_against_the_policy() -> None:
    device = shares.advertise(H100, shares.parse_mode("memory"))
    got = shares.check_consumed(device, {"memory": "20Gi"}, "r[0]")
    assert got == {"memory": Fraction(20 * 1024**3)}
    assert shares.thread_percentage(device, got) == 26
    assert shares.memory_limit_mib(got) == 20480
    # Absent: the policy's default (the whole device in memory mode).
    assert shares.check_consumed(device, None, "r[0]")["memory"] == 81559 * 1024**2
    wanted = r"r\[0\]\.consumedCapacity\[memory\]: 5 disagrees"
    with pytest.raises(shares.SharesError, match=wanted):
        shares.check_consumed(device, {"memory": "5"}, "r[0]")
    with pytest.raises(shares.SharesError, match=r"outside 0\.\.81559Mi"):
        shares.check_consumed(device, {"memory": "80Gi"}, "r[0]")
    with pytest.raises(shares.SharesError, match="is not a quantity"):
        shares.check_consumed(device, {"memory": "lots"}, "r[0]")


def test_a_share_count_sets_the_compute_share() -> None:
    device = shares.advertise(H100, shares.parse_mode("4"))
    got = shares.check_consumed(device, {"memory": "0", "shares": "1"}, "r")
    assert shares.thread_percentage(device, got) == 25
    assert shares.memory_limit_mib(got) is None  # no memory asked: no pinned limit
