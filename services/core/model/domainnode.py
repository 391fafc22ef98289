"""Whether a node can serve ``compute-domain.nvidia.com`` claims, and why not.

Where the reference's compute-domain plugin refuses to start (so the node publishes
no pool and prepares nothing), gpudra withdraws the node's pool (the publisher) and
refuses its claims naming the reason (the preparer), with the same words in both:

- the node's GPUs name no one NVLink clique: GPUs of two cliques, or, with
  CrashOnNVLinkFabricErrors (the reference's default), a GPU whose fabric did not
  register (services.core.model.cliques.node_clique_id);
- IMEXDaemonsWithDNSNames (the reference's default) with an NVIDIA driver older than
  570.158.01, whose IMEX cannot take DNS names (the reference's
  validateDriverVersionForIMEXDaemonsWithDNSNames). The reference refuses on every
  node; gpudra only on a node in a fabric, the only kind whose daemon runs IMEX.
"""

from __future__ import annotations

import re

from services.core.model import cliques
from services.core.model import featuregates as fg
from services.core.model.schemas import NodeInventory

DNS_NAMES_MIN_DRIVER = "570.158.01"
MIN_VERSION = (570, 158, 1)


def refusal(inv: NodeInventory, gates: fg.FeatureGates) -> str:
    """Why the node cannot serve the driver; "" when it can."""
    strict = gates.enabled(fg.CRASH_ON_NVLINK_FABRIC_ERRORS)
    try:
        clique = cliques.node_clique_id(inv.gpus, strict=strict)
    except cliques.CliqueError as exc:
        gate = f" ({fg.CRASH_ON_NVLINK_FABRIC_ERRORS})" if strict else ""
        return f"the node's NVLink fabric{gate}: {exc}"
    if clique and gates.enabled(fg.IMEX_DAEMONS_WITH_DNS_NAMES):
        have = _version(inv.driver_version)
        if have is None or have < MIN_VERSION:
            return (
                f"{fg.IMEX_DAEMONS_WITH_DNS_NAMES} needs NVIDIA driver {DNS_NAMES_MIN_DRIVER} "
                f"or later, the node has {inv.driver_version or 'none'}; set "
                f"{fg.IMEX_DAEMONS_WITH_DNS_NAMES}=false (and {fg.COMPUTE_DOMAIN_CLIQUES}=false, "
                "which needs it)"
            )
    return ""


def _version(text: str) -> tuple[int, ...] | None:
    """``570.158.01`` -> (570, 158, 1); None for what is not dotted numbers."""
    if not re.fullmatch(r"\d+(\.\d+)*", text.strip()):
        return None
    return tuple(int(part) for part in text.strip().split("."))
