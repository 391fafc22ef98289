"""The webhook's metrics: what it answered (``gpudra_webhook_``)."""

from __future__ import annotations

from prometheus_client import Counter

REVIEWS = Counter(
    "gpudra_webhook_reviews_total",
    "Admission reviews answered: allowed, denied (a config prepare would refuse, or a "
    "request it cannot judge), or refused as HTTP errors (http_400, http_413, http_415).",
    ["outcome"],
)
