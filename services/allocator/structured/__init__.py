"""Structured allocation as kube-scheduler 1.35 does it: pools, requests, the per-device
rules, the search, and the explanation of a claim that does not fit (from the same rules).

``snapshot`` runs it over a cluster snapshot, claim after claim: the claim watcher
uses it to explain pending claims, ``gpudra allocate`` (services/offline) on files."""
