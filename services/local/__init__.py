"""Local tools: ``gpudra up`` runs the whole driver on one machine.

Not a service: nothing here is deployed. Like ``services.offline`` it may use
several services, and it also drives the real Kubernetes control plane that
``tests/e2e`` builds (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and the kubelet's own DRA manager). That launcher
lives in ``tests/e2e/cluster.py``, so ``gpudra up`` runs from a source
checkout: the checkout's root is put on ``sys.path`` here, before the
submodules import it.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

if (REPO / "tests" / "e2e" / "cluster.py").is_file() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
