"""Structured allocation as kube-scheduler 1.34-1.37 does it (the release and its gates
pick the upstream implementation: variant.py): pools, requests, the per-device rules,
the search, and the explanation of a claim that does not fit (from the same rules).

``snapshot`` runs it over a cluster snapshot, claim after claim: the claim watcher
uses it to explain pending claims, ``gpudra allocate`` (services/offline) on files."""
