"""Local tools: ``gpudra up`` runs the whole driver on one machine.

Not a service: nothing here is deployed. Like ``services.offline`` it may use
several services, and it also drives the real Kubernetes control plane that
``tests/e2e`` builds (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and the kubelet's own DRA manager). That launcher
lives in ``tests/e2e/cluster.py``, so ``gpudra up`` runs from a source
checkout; :func:`use_checkout` makes it importable.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def use_checkout() -> None:
    """Put the checkout's root on ``sys.path`` (for ``tests.e2e.cluster``).

    Called by the modules that need it rather than here, so that importing the
    ``up`` command (every ``gpudra`` run does) changes nothing."""
    if (REPO / "tests" / "e2e" / "cluster.py").is_file() and str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
