#!/usr/bin/env bash
# Build (or find in the cache) helm v3, which renders, lints and installs the chart
# (deploy/chart/gpudra) in the tests.
#
# usage: services/local/helm/build.sh [--force]
#
# Prints progress on stderr and the absolute path of the binary as the last line of
# stdout. go.mod here is a wrapper module that names helm.sh/helm/v3/cmd/helm as a
# tool and pins the Kubernetes libraries at the control plane's v0.35.8 (helm v3.20
# asks for v0.35.1), so that the compiled k8s.io packages in the shared build cache
# are the control plane's; go.sum pins every module it builds from. The version
# stamps are those of helm's own Makefile: its version, and the Kubernetes version
# (1.35) that `helm template` and `helm lint` assume without --kube-version.
#
# Cache: $GPUDRA_CACHE/helm/<sha256 of go.mod, go.sum, build.sh, ../gobuild/lib.sh>/helm
# (see services/local/gobuild/lib.sh for the layout, the lock and the environment).
set -euo pipefail

# shellcheck source=../gobuild/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gobuild/lib.sh"

gobuild_args "$@"
cd "$HERE"
INPUTS=(go.mod go.sum build.sh)
gobuild_cache helm "${INPUTS[@]}"
gobuild_reuse helm "$OUTDIR/helm" test -x "$OUTDIR/helm"
gobuild_env
gobuild_snapshot helm "${INPUTS[@]}"

VERSION=$(gobuild_version helm.sh/helm/v3)
K8S=$(gobuild_version k8s.io/client-go)  # v0.35.8 -> Kubernetes 1.35
K8S_MINOR=${K8S#v0.}
K8S_MINOR=${K8S_MINOR%%.*}
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION"
LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
	LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
done

gobuild_building helm "$VERSION, Kubernetes libraries $K8S"
gobuild_go "$TMP/src" -ldflags "$LDFLAGS" -o "$TMP/out/helm" helm.sh/helm/v3/cmd/helm
gobuild_took built
gobuild_publish helm
echo "$OUTDIR/helm"
