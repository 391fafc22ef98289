"""PCI device names from a ``pci.ids`` database, read the way the reference driver reads it.

The reference names a VFIO device after its PCI ID database entry
(``productName: "GH100 [H100 SXM5 80GB]"``), not after NVML's name: go-nvlib's
nvpci looks the vendor and device id up with its pciids package, which takes
the first of these files that exists, else a copy of the database compiled
into the binary (go-nvlib v0.12.0 embeds pci.ids version 2025.07.11; the
reference's container image has none of the files, so that copy is what it
publishes)::

    /usr/share/misc/pci.ids      Debian, Ubuntu (package pci.ids)
    /usr/local/share/pci.ids
    /usr/share/hwdata/pci.ids    RHEL, Fedora (package hwdata)
    /usr/share/pci.ids           SUSE

gpudra's NVML backend does the same, with ``--pci-ids FILE`` (``GPUDRA_PCI_IDS``)
in front, and :data:`BUILTIN` (a few entries of version 2025.07.11, the GPUs
the simulated fleets have) as the fallback. The simulated backend always reads
:data:`BUILTIN`, so simulated slices do not depend on the machine they are
rendered on. A device the database lacks is ``UNKNOWN_DEVICE``, as in go-nvlib.

The parser follows go-nvlib's: a vendor line starts with a lower-case hex
digit, a device line with one tab, a subsystem line with two; ids are the
first four characters, names the rest, trimmed; the class section (``C xx``)
ends the vendors.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

SYSTEM_PATHS: Sequence[Path] = (
    Path("/usr/share/misc/pci.ids"),
    Path("/usr/local/share/pci.ids"),
    Path("/usr/share/hwdata/pci.ids"),
    Path("/usr/share/pci.ids"),
)
BUILTIN_PACKAGE = "services.discovery.profiles"
BUILTIN_NAME = "pci.ids"
BUILTIN = f"builtin:{BUILTIN_PACKAGE}/{BUILTIN_NAME}"
UNKNOWN_DEVICE = "UNKNOWN_DEVICE"  # go-nvlib nvpci.UnknownDeviceString
_VERSION = re.compile(r"^#\s*Version:\s*(\S+)")
_HEX = frozenset("0123456789abcdef")


class PciIdsError(ValueError):
    """A pci.ids file that was asked for by name and cannot be read."""


@dataclass(frozen=True)
class PciIds:
    """Vendor and device names of one database file."""

    source: str  # the path, or BUILTIN
    version: str  # the file's "Version:" header ("2025.07.11"); "" when it has none
    vendors: Mapping[int, str]
    devices: Mapping[tuple[int, int], str]  # (vendor id, device id) -> name

    def device_name(self, vendor_id: int, device_id: int) -> str:
        """The device's name, or ``UNKNOWN_DEVICE`` (go-nvlib's answer when it has none)."""
        return self.devices.get((vendor_id, device_id), UNKNOWN_DEVICE)


def parse(text: str, source: str) -> PciIds:
    vendors: dict[int, str] = {}
    devices: dict[tuple[int, int], str] = {}
    version = ""
    vendor: int | None = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            if not version and (m := _VERSION.match(line)):
                version = m[1]
            continue
        if line.startswith("C "):
            break  # classes follow the vendors; no device is named there
        if line[0] in _HEX:
            vendor = _hex_id(line)
            if vendor is not None:
                vendors[vendor] = line[4:].strip()
        elif line.startswith("\t") and not line.startswith("\t\t") and vendor is not None:
            entry = line.strip()
            device = _hex_id(entry)
            if device is not None:
                devices[(vendor, device)] = entry[4:].strip()
    return PciIds(source=source, version=version, vendors=vendors, devices=devices)


def _hex_id(text: str) -> int | None:
    try:
        return int(text[:4], 16)
    except ValueError:
        return None


@functools.cache
def builtin() -> PciIds:
    """The checked-in subset: the same names on every machine."""
    text = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_NAME).read_text()
    return parse(text, BUILTIN)


@functools.cache
def from_file(path: Path) -> PciIds:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise PciIdsError(f"pci.ids database {path}: {exc.strerror or exc}") from exc
    return parse(text, str(path))


def load(path: Path | None = None, search: Sequence[Path] = SYSTEM_PATHS) -> PciIds:
    """``path`` if given (an error when unreadable), else go-nvlib's search, else BUILTIN."""
    if path is not None:
        return from_file(path)
    for candidate in search:
        if candidate.is_file():
            try:
                return from_file(candidate)
            except PciIdsError as exc:
                log.warning("unreadable pci.ids; trying the next", extra={"error": str(exc)})
    return builtin()
