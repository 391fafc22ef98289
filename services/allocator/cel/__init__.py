"""The CEL environment DRA selectors run in: Kubernetes' ``device`` variable, quantity and
semver types, the libraries, cost estimation; compiled programs are cached."""
