"""The differential CDI comparison: it sorts, it knows two spellings, and it hides nothing else."""

from __future__ import annotations

import copy
from typing import Any

from tests.helpers.cdicompare import Difference, Kept, compare, summary


def _spec() -> dict[str, Any]:
    return {
        "cdiVersion": "1.1.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"],
            "deviceNodes": [
                {"path": "/dev/nvidiactl", "major": 195, "minor": 255, "fileMode": 438},
                {"path": "/dev/nvidia-uvm", "major": 510, "fileMode": 438},
            ],
            "mounts": [
                {
                    "hostPath": "/h/libcuda.so.1",
                    "containerPath": "/libcuda.so.1",
                    "options": ["ro"],
                },
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/hook",
                    "args": [
                        "nvidia-cdi-hook",
                        "create-symlinks",
                        "--link",
                        "a::b",
                        "--link",
                        "c::d",
                    ],
                }
            ],
        },
        "devices": [
            {"name": "u-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
        ],
    }


def test_identical_specs_and_reordered_lists_compare_equal() -> None:
    ours = _spec()
    edits = ours["containerEdits"]
    edits["env"].reverse()
    edits["deviceNodes"].reverse()
    edits["hooks"][0]["args"] = [
        "nvidia-cdi-hook",
        "create-symlinks",
        "--link",
        "c::d",
        "--link",
        "a::b",
    ]
    assert compare(_spec(), ours) == []


def test_go_spellings_of_one_value_compare_equal() -> None:
    ours = _spec()
    ours["containerEdits"]["deviceNodes"][1]["minor"] = 0  # omitempty dropped it
    ours["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = "/dev/nvidia0"
    assert compare(_spec(), ours) == []


def test_every_real_difference_is_reported() -> None:
    ours = copy.deepcopy(_spec())
    edits = ours["containerEdits"]
    edits["deviceNodes"][0]["minor"] = 254
    edits["mounts"][0]["options"] = ["ro", "bind"]
    edits["env"].pop()
    edits["hooks"][0]["args"].pop()
    ours["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = "/root/dev/nvidia0"
    ours["cdiVersion"] = "0.5.0"
    diffs = compare(_spec(), ours)
    assert {(d.where, d.section, d.key) for d in diffs} == {
        ("spec", "cdiVersion", ""),
        ("common", "deviceNodes", "/dev/nvidiactl"),
        ("common", "mounts", "/libcuda.so.1"),
        ("common", "env", "NVIDIA_CTK_LIBCUDA_DIR"),
        ("common", "hooks", "createContainer create-symlinks"),
        ("device u-gpu-0", "deviceNodes", "/dev/nvidia0"),
    }
    assert "1 x common mounts differ in options (/libcuda.so.1)" in summary(diffs)


def test_a_missing_device_is_reported() -> None:
    ours = _spec()
    ours["devices"][0]["name"] = "u-gpu-1"
    keys = {(d.section, d.key) for d in compare(_spec(), ours)}
    assert keys == {("devices", "u-gpu-0"), ("devices", "u-gpu-1")}


def test_kept_covers_only_the_fields_it_names() -> None:
    kept = Kept("deviceNodes", "/dev/x", frozenset({"type"}), "because")
    typed = Difference(
        "common", "deviceNodes", "/dev/x", {"path": "/dev/x"}, {"path": "/dev/x", "type": "c"}
    )
    assert kept.covers(typed)
    renumbered = Difference(
        "common",
        "deviceNodes",
        "/dev/x",
        {"path": "/dev/x"},
        {"path": "/dev/x", "type": "c", "minor": 1},
    )
    assert not kept.covers(renumbered)
    assert not kept.covers(Difference("common", "deviceNodes", "/dev/x", {"path": "/dev/x"}, None))
    assert not kept.covers(
        Difference("common", "deviceNodes", "/dev/y", typed.reference, typed.gpudra)
    )
