"""The environment's word on a setting: ``GPUDRA_FOO_BAR`` for the setting ``foo-bar``.

Every flag ``--foo-bar`` falls back to it (services.core.process.config), and the
few settings read below the flags (the bus's replicas, retention limits) read it
here, so a chart configures every component by environment alone.
"""

from __future__ import annotations

import os


def env(name: str, default: str = "") -> str:
    return os.environ.get(f"GPUDRA_{name.upper().replace('-', '_')}", default)
