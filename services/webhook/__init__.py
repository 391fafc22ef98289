"""``gpudra webhook``: the validating admission webhook for our drivers' opaque configs.

A ResourceClaim or ResourceClaimTemplate (resource.k8s.io v1, v1beta2, v1beta1)
whose opaque configs prepare would refuse is refused when it is written, with
prepare's own words (the validator is the kernel's config API,
``services.core.model.configs``: one validator, two callers), instead of minutes
later on the node.
"""
