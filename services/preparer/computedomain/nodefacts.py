"""What the node's NVIDIA driver says that a ComputeDomain claim's CDI edits need.

On a real node: the ``nvidia-caps-imex-channels`` and ``nvidia-caps`` majors from
``/proc/devices`` and the ``fabric-imex-mgmt`` capability's minor and mode from
``/proc/driver/nvidia/capabilities/fabric-imex-mgmt``, read at each prepare (the
driver may be reloaded while the preparer runs). A simulated node has no such
files: it answers fixed numbers, so a simulated claim's spec has the same shape
as a real one's (the container runtime creates the nodes; nothing on the host
needs to exist).
"""

from __future__ import annotations

from pathlib import Path

from services.preparer.computedomain.edits import (
    CAPS_DEVICE,
    IMEX_CHANNELS_DEVICE,
    CapFile,
    EditsError,
    char_major,
    parse_cap_file,
)

FABRIC_IMEX_MGMT = "driver/nvidia/capabilities/fabric-imex-mgmt"
# Simulated: majors in the dynamic range real drivers get, the capability's minor as
# nv-caps numbers it (fabric-imex-mgmt is the first node of its static table).
SIMULATED_IMEX_MAJOR = 509
SIMULATED_CAPS_MAJOR = 508
SIMULATED_CAP = CapFile(minor=0, mode=0o400)


class NodeFacts:
    """``proc``: the host's /proc (a driver root's, in a container); None: simulated."""

    def __init__(self, proc: Path | None) -> None:
        self.proc = proc

    def imex_major(self) -> int:
        if self.proc is None:
            return SIMULATED_IMEX_MAJOR
        return char_major(self._read("devices"), IMEX_CHANNELS_DEVICE)

    def caps_major(self) -> int:
        if self.proc is None:
            return SIMULATED_CAPS_MAJOR
        return char_major(self._read("devices"), CAPS_DEVICE)

    def fabric_cap(self) -> CapFile:
        if self.proc is None:
            return SIMULATED_CAP
        return parse_cap_file(self._read(FABRIC_IMEX_MGMT))

    def _read(self, name: str) -> str:
        assert self.proc is not None
        try:
            return (self.proc / name).read_text()
        except OSError as exc:
            raise EditsError(f"cannot read {self.proc / name}: {exc.strerror or exc}") from exc
