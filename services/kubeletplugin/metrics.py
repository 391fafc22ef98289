"""Prometheus metrics of the kubelet plugin front."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CALLS = Counter(
    "gpudra_kubeletplugin_calls_total",
    "Kubelet NodePrepareResources/NodeUnprepareResources calls forwarded to the preparer.",
    ["op"],
)
CLAIM_RESULTS = Counter(
    "gpudra_kubeletplugin_claim_results_total",
    "Per-claim answers given to the kubelet.",
    ["op", "outcome"],
)
FORWARD_SECONDS = Histogram(
    "gpudra_kubeletplugin_forward_seconds",
    "Time from the kubelet's call to the preparer's reply (or the front's own error).",
    ["op"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 45),
)
NO_PREPARER_RETRIES = Counter(
    "gpudra_kubeletplugin_no_preparer_retries_total",
    "Requests sent again because no preparer listened (it was reconnecting to NATS).",
    ["op"],
)
PRESENCE_REPAIRS = Counter(
    "gpudra_kubeletplugin_presence_repairs_total",
    "Presence records found deleted, rewritten or unreadable by someone else, and put back.",
    ["reason"],
)
REGISTERED = Gauge(
    "gpudra_kubeletplugin_registered",
    "1 while the kubelet has this driver's plugin registered (its last NotifyRegistrationStatus "
    "said so), 0 before, after a refusal and from shutdown on.",
    ["driver"],
)
