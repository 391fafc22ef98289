"""The kernel's bottom layer: small tools with no knowledge of Kubernetes, NVIDIA or the
bus (backoff, size limits on what users send, rate limits, supervised tasks, the
environment's settings). It imports nothing of gpudra."""
