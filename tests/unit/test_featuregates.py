from __future__ import annotations

import pytest

from services.core import featuregates as fg


def test_defaults_match_reference() -> None:
    gates = fg.parse("")
    assert not any(gates.enabled(name) for name in fg.DEFAULTS)


def test_parse_and_spec_round_trip() -> None:
    gates = fg.parse("PassthroughSupport=true, DeviceMetadata=TRUE")
    assert gates.enabled(fg.PASSTHROUGH_SUPPORT) and gates.enabled(fg.DEVICE_METADATA)
    assert fg.parse(gates.spec()) == gates


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (
            "Nope=true",
            "unknown feature gate 'Nope'; valid: ConsumableShares, DeviceMetadata, DynamicMIG",
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
