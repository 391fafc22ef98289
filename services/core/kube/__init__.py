"""Kubernetes: the API client and informer, kubeconfig, the resource.k8s.io objects and
versions, quantities, names, pods, claim status. It imports only the kit."""
