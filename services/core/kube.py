"""The one way a service gets a Kubernetes API client."""

from __future__ import annotations

from kubernetes_asyncio import client, config


async def connect(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or from the pod's service account when empty."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration=cfg)
