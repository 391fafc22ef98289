"""Local tools: ``gpudra up`` runs the whole driver on one machine.

Not a service: nothing here is deployed. Like ``services.offline`` it may use
several services. It drives a real Kubernetes control plane (:mod:`.cluster`:
etcd, kube-apiserver, kube-scheduler, kube-controller-manager and the
kubelet's own DRA manager) built from the Go module proxy by
``controlplane/build.sh`` beside this file, so it runs from a source checkout;
the tests start the same control plane through the same module. Real nodes
(:mod:`.node`: containerd, runc and the real kubelet in a private mount
namespace over a simulated driver root) run pods in real containers.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
