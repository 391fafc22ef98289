"""What every room of the GPU engine works with: the node's settings, its checkpoint,
inventory, device backend and holds, and how steps are traced and faults injected."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.core.model import featuregates as fg
from services.core.model import nvidia, shares
from services.core.telemetry import tracing
from services.preparer import cdi, metadata
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.devices.base import DeviceOps
from services.preparer.faults import Faults
from services.preparer.holds import Holds
from services.preparer.inventory import InventoryView
from services.preparer.keylocks import KeyedLocks

DRIVER = nvidia.DRIVER_NAME


@dataclass
class Settings:
    node: str
    gates: fg.FeatureGates
    cdi_root: Path
    plugin_dir: Path
    shares: shares.SharesMode = shares.DISABLED


@dataclass
class Context:
    settings: Settings
    store: CheckpointStore
    inventory: InventoryView
    ops: DeviceOps
    holds: Holds
    steps: tracing.Steps
    faults: Faults
    daemon_locks: KeyedLocks = field(default_factory=KeyedLocks)  # shared MPS daemon's start/stop

    def gate(self, name: str) -> bool:
        return self.settings.gates.enabled(name)

    def delete_files(self, uid: str) -> None:
        """The claim's CDI spec and metadata files, wherever it stands."""
        cdi.delete(self.settings.cdi_root, uid)
        metadata.delete_claim(self.settings.plugin_dir, uid)
