from __future__ import annotations

import pytest

from services.core.model import featuregates as fg

# The reference's defaults (pkg/featuregates/featuregates.go, defaultFeatureGates).
REFERENCE_ON = {
    fg.IMEX_DAEMONS_WITH_DNS_NAMES,
    fg.COMPUTE_DOMAIN_CLIQUES,
    fg.CRASH_ON_NVLINK_FABRIC_ERRORS,
}


def test_defaults_match_reference() -> None:
    gates = fg.parse("")
    assert {name for name in fg.DEFAULTS if gates.enabled(name)} == REFERENCE_ON
    assert gates.spec() == ""


@pytest.mark.parametrize(
    "spec",
    [
        "CrashOnNVLinkFabricErrors=false",
        "ComputeDomainCliques=false",
        "ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false",
    ],
)
def test_a_gate_on_by_default_can_be_turned_off(spec: str) -> None:
    gates = fg.parse(spec)
    assert all(not gates.enabled(item.split("=")[0]) for item in spec.split(","))
    assert gates.spec() == spec
    assert fg.parse(gates.spec()) == gates


@pytest.mark.parametrize(
    "command",
    [["domains"], ["imex-daemon", "run"], ["preparer", "--fleet", "gb200-nvl72"], ["publisher"]],
    ids=lambda c: c[0],
)
def test_dns_names_off_needs_cliques_off_as_in_the_reference(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference's first rule: ComputeDomainCliques needs IMEXDaemonsWithDNSNames, so
    turning the names off alone is refused at start-up, before any other mix."""
    from services.cli import main

    with pytest.raises(SystemExit) as exited:
        main([*command, "--feature-gates", "IMEXDaemonsWithDNSNames=false"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (
        "feature gate ComputeDomainCliques requires IMEXDaemonsWithDNSNames to also be enabled"
    ) in err, err
    with pytest.raises(fg.FeatureGateError, match="ComputeDomainCliques requires"):
        fg.parse("DynamicMIG=true,MPSSupport=true,IMEXDaemonsWithDNSNames=false")


@pytest.mark.parametrize(
    ("gate", "reason"),
    [
        ("FabricManagerPartitioning", "gpudra has no Fabric Manager client"),
        ("HostManagedIMEXDaemon", "gpudra runs each ComputeDomain's IMEX daemons itself"),
    ],
)
@pytest.mark.parametrize("command", [["preparer", "--fleet", "dgx-h100"], ["publisher"]])
def test_a_gate_gpudra_cannot_honour_is_accepted_off_and_refused_on(
    gate: str, reason: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Off (the reference's default) parses; on, every command refuses it, naming why."""
    from services.cli import main

    assert not fg.parse(f"{gate}=false").enabled(gate)
    with pytest.raises(SystemExit) as exited:
        main([*command, "--feature-gates", f"{gate}=true"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"feature gate {gate}=true is not supported by gpudra: " in err, err
    assert reason in err and f"leave {gate}=false" in err


def test_parse_and_spec_round_trip() -> None:
    gates = fg.parse("PassthroughSupport=true, DeviceMetadata=TRUE")
    assert gates.enabled(fg.PASSTHROUGH_SUPPORT) and gates.enabled(fg.DEVICE_METADATA)
    assert fg.parse(gates.spec()) == gates


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (
            "Nope=true",
            "unknown feature gate 'Nope'; valid: ComputeDomainCliques, ConsumableShares, "
            "CrashOnNVLinkFabricErrors, DRAListTypeAttributes, DeviceMetadata, DynamicMIG, "
            "FabricManagerPartitioning, HostManagedIMEXDaemon, IMEXDaemonsWithDNSNames",
        ),
        ("DynamicMIG=yes", "expected DynamicMIG=true|false"),
        ("DynamicMIG", "expected DynamicMIG=true|false"),
        ("DynamicMIG=true,MPSSupport=true", "DynamicMIG is currently mutually exclusive with MPS"),
        ("DynamicMIG=true,PassthroughSupport=true", "DynamicMIG .* exclusive with Passthrough"),
    ],
)
def test_bad_gates_say_what_is_wrong(spec: str, needle: str) -> None:
    with pytest.raises(fg.FeatureGateError, match=needle.replace("|", r"\|")):
        fg.parse(spec)


# The three combinations the reference refuses besides the two DynamicMIG ones above.
REFUSED = [
    (
        "DynamicMIG=true,NVMLDeviceHealthCheck=true",
        "feature gate DynamicMIG is currently mutually exclusive with NVMLDeviceHealthCheck",
    ),
    (
        "NVMLDeviceHealthCheck=true,PassthroughSupport=true",
        "feature gate PassthroughSupport is currently mutually exclusive with "
        "NVMLDeviceHealthCheck",
    ),
    ("DeviceMetadata=true", "feature gate DeviceMetadata requires PassthroughSupport"),
    (
        "DeviceMetadata=true,PassthroughSupport=false,MPSSupport=true",
        "feature gate DeviceMetadata requires PassthroughSupport",
    ),
]

# Every command that takes the driver's --feature-gates, with what else it needs to parse.
COMMANDS = [
    ["discovery", "--fleet", "dgx-h100"],
    ["preparer", "--fleet", "dgx-h100"],
    ["kubeletplugin"],
    ["publisher"],
    ["allocator"],
    ["slices", "--fleet", "dgx-h100", "--node", "n1"],
    ["up"],
]


@pytest.mark.parametrize(("spec", "message"), REFUSED)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_every_command_refuses_the_reference_s_forbidden_mixes_at_start_up(
    command: list[str], spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit status 2 before anything starts, with an error naming both gates."""
    from services.cli import main

    with pytest.raises(SystemExit) as exited:
        main([*command, "--feature-gates", spec])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "--feature-gates" in err


def test_the_same_mix_from_the_environment_is_refused_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    monkeypatch.setenv("GPUDRA_FEATURE_GATES", "NVMLDeviceHealthCheck=true,PassthroughSupport=true")
    with pytest.raises(SystemExit) as exited:
        main(["publisher"])
    assert exited.value.code == 2
    assert "PassthroughSupport is currently mutually exclusive" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec",
    [
        "PassthroughSupport=true,DeviceMetadata=true",
        "NVMLDeviceHealthCheck=true,MPSSupport=true,TimeSlicingSettings=true",
        "DynamicMIG=true,TimeSlicingSettings=true",
    ],
)
def test_allowed_mixes_still_parse(spec: str) -> None:
    assert fg.parse(spec).spec()
