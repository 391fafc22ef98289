"""A container runtime's view of our CDI specs, through the official CDI Go library.

``controlplane cdi`` (services/local/controlplane/cdi.go) loads a spec
directory with tags.cncf.io/container-device-interface, as containerd and
CRI-O do, and injects device ids into a sample OCI spec. :func:`inject`
returns what it printed; :class:`Injected` reads the OCI spec's result.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NVIDIA_GPU = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class Injected:
    """The OCI spec after injection, as the container would be created from it."""

    oci: dict[str, Any]

    @property
    def device_paths(self) -> set[str]:
        return {d["path"] for d in self.oci.get("linux", {}).get("devices", [])}

    @property
    def gpu_minors(self) -> set[int]:
        """The N of every /dev/nvidiaN the container gets (its full GPUs and MIG parents)."""
        return {int(m[1]) for p in self.device_paths if (m := _NVIDIA_GPU.match(p))}

    @property
    def env(self) -> list[str]:
        return list(self.oci.get("process", {}).get("env", []))

    @property
    def mounts(self) -> dict[str, str]:
        return {m["destination"]: m.get("source", "") for m in self.oci.get("mounts", [])}

    @property
    def allowed_devices(self) -> set[tuple[str, int, int]]:
        """The cgroup device rules that allow access (type, major, minor)."""
        rules = self.oci.get("linux", {}).get("resources", {}).get("devices", [])
        return {(r["type"], r["major"], r["minor"]) for r in rules if r.get("allow")}

    def device_numbers(self) -> dict[str, tuple[str, int, int]]:
        devices = self.oci.get("linux", {}).get("devices", [])
        return {d["path"]: (d["type"], d["major"], d["minor"]) for d in devices}


def inject(binary: Path, spec_dir: Path, device_ids: list[str]) -> Injected:
    """Load ``spec_dir`` and inject ``device_ids``; fails with the library's own words."""
    proc = subprocess.run(
        [str(binary), "cdi", "--spec-dir", str(spec_dir), "--", *device_ids],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"cdi printed no result: {proc.stderr.strip()}") from None
    assert result["specErrors"] == {}, result["specErrors"]
    assert not result.get("unresolved"), f"unresolved CDI devices: {result['unresolved']}"
    assert not result.get("injectError"), result["injectError"]
    assert proc.returncode == 0, proc.stderr
    return Injected(result["ociSpec"])
