"""The Kubernetes gates per minor (services/allocator/structured/features.py): defaults,
locks and dependencies as each release's components apply them. The tables themselves
are checked against each release's own reference-allocator in
tests/e2e/local/test_kube_versions.py."""

from __future__ import annotations

import pytest

from services.allocator.structured import features as f


@pytest.mark.parametrize("minor", f.MINORS)
def test_every_minor_starts_from_its_own_defaults_and_accepts_them(minor: int) -> None:
    defaults = f.defaults(minor)
    assert defaults.minor == minor
    assert f.parse("", minor) == defaults
    assert defaults.spec() == ""


def test_the_default_features_are_the_newest_minors() -> None:
    assert f.Features() == f.defaults(f.DEFAULT_MINOR)
    assert f.DEFAULT_MINOR == f.MINORS[-1]


def test_what_changed_between_1_35_and_1_37_defaults() -> None:
    old, new = f.defaults(35), f.defaults(37)
    turned_on = {
        "partitionable_devices",
        "device_taints",
        "device_taint_rules",
        "consumable_capacity",
        "binding_conditions",
        "extended_resource",
    }
    for name in turned_on:
        assert not getattr(old, name) and getattr(new, name), name
    assert not new.list_type_attributes and not new.derived_attributes
    assert not new.fractional_capacity_range  # on only from min. compatibility version 1.37


def test_a_gate_is_known_only_from_the_release_that_has_it() -> None:
    with pytest.raises(f.FeatureGateError, match=r"exists from Kubernetes 1\.37"):
        f.parse("DRADerivedAttributes=true", 36)
    assert f.parse("DRADerivedAttributes=true", 37).derived_attributes


def test_a_gate_stays_off_only_with_what_depends_on_it() -> None:
    with pytest.raises(f.FeatureGateError, match=r"\[DRADeviceTaints\]"):
        f.parse("DRADeviceTaints=false", 37)  # DRADeviceTaintRules is on by default
    off = f.parse("DRADeviceTaints=false,DRADeviceTaintRules=false", 37)
    assert not off.device_taints and not off.device_taint_rules
    with pytest.raises(f.FeatureGateError, match="DRAPartitionableDevices"):
        f.parse("DRAPartitionableDevices=false,DRADeviceCompatibilityGroups=true", 37)


def test_1_34_has_no_dependency_table() -> None:
    assert f.parse("DRADeviceBindingConditions=true,DRAResourceClaimDeviceStatus=false", 34)
    with pytest.raises(f.FeatureGateError, match="DRAResourceClaimDeviceStatus"):
        f.parse("DRADeviceBindingConditions=true,DRAResourceClaimDeviceStatus=false", 35)


def test_binding_and_status_needs_both_gates() -> None:
    assert f.defaults(37).binding_and_status
    assert f.parse("DRADeviceBindingConditions=true", 35).binding_and_status
    assert not f.parse(
        "DRADeviceBindingConditions=true,DRAResourceClaimDeviceStatus=false", 34
    ).binding_and_status
    assert not f.defaults(35).binding_and_status


@pytest.mark.parametrize("minor", f.MINORS)
def test_accepted_sets_are_all_accepted_distinct_and_keep_locked_gates(minor: int) -> None:
    sets = f.accepted_sets(minor)
    assert len(sets) == len(set(sets)) > 1
    parsed = [f.parse(spec, minor) for spec in sets]
    assert len(set(parsed)) == len(parsed)
    for gate, spec in f.GATES[minor].items():
        if spec.locked:
            assert all(gate not in s for s in sets), gate


def test_accepted_sets_of_1_37_turn_taint_rules_off_with_taints() -> None:
    sets = f.accepted_sets(37)
    without = [s for s in sets if "DRADeviceTaints=false" in s]
    assert without and all("DRADeviceTaintRules=false" in s for s in without)
    assert not any("DRAFractionalCapacityRange=true" in s and "DRAConsumableCapacity=false" in s
                   for s in sets)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "minor"),
    [("1.37", 37), ("v1.37.2", 37), ("v1.36.0-rc.1", 36), ("35", 35), (" v1.34.4+k3s1 ", 34)],
)
def test_versions_are_read_as_kubernetes_writes_them(text: str, minor: int) -> None:
    assert f.minor_of(text) == minor


@pytest.mark.parametrize("text", ["1.33", "v1.38.0", "2.1", "latest", ""])
def test_versions_gpudra_does_not_follow_are_refused(text: str) -> None:
    with pytest.raises(f.FeatureGateError):
        f.minor_of(text)
