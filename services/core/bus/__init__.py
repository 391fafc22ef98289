"""The bus: subjects, identities and their permissions, the NATS client, retention and
the claim trail. It imports telemetry, the model and the layers below."""
