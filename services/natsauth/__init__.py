"""``gpudra nats-auth``: the bus's auth callout in a cluster (docs/security.md)."""
