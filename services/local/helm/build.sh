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

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../gobuild/lib.sh
. "$HERE/../gobuild/lib.sh"

force=0
case "${1:-}" in
--force) force=1 ;;
"") ;;
-h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
esac

cd "$HERE"
INPUTS=(go.mod go.sum build.sh)
KEY=$(gobuild_key "${INPUTS[@]}")
BIN="$CACHE/helm/$KEY/helm"

if [ "$force" = 0 ] && [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
gobuild_lock helm
if [ "$force" = 0 ] && [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
gobuild_env
gobuild_snapshot helm "${INPUTS[@]}"
BIN="$CACHE/helm/$KEY/helm"

version() { (cd "$TMP/src" && "$GO" list -m -f '{{.Version}}' "$1"); }
VERSION=$(version helm.sh/helm/v3)
K8S=$(version k8s.io/client-go)  # v0.35.8 -> Kubernetes 1.35
K8S_MINOR=${K8S#v0.}
K8S_MINOR=${K8S_MINOR%%.*}
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION"
LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
	LDFLAGS+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
done

echo "build.sh: building helm ($VERSION, Kubernetes libraries $K8S, $("$GO" env GOVERSION), -p $JOBS) into $CACHE/helm/$KEY" >&2
start=$(date +%s)
(cd "$TMP/src" && nice -n 10 "$GO" build -p "$JOBS" -trimpath -ldflags "$LDFLAGS" \
	-o "$TMP/out/helm" helm.sh/helm/v3/cmd/helm) >&2
echo "build.sh: built in $(($(date +%s) - start)) s" >&2
gobuild_publish helm
echo "$BIN"
