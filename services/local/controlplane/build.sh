#!/usr/bin/env bash
# Build (or find in the cache) the control-plane multi-call binary.
#
# usage: services/local/controlplane/build.sh [--force]
#
# Prints progress on stderr and the absolute path of the binary as the last
# line of stdout. Next to the binary there is one symlink per component
# (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl,
# kubelet-dra, reference-allocator, cdi) and reference-cdi, a binary of its own
# (module referencecdi/: NVIDIA's CDI library needs go-nvml, which needs cgo,
# so it is built with CGO_ENABLED=1 and a C compiler; the control plane
# without). `controlplane reference-cdi ARGS` runs it.
#
# Everything is cached outside the repository, under
# ${GPUDRA_CACHE:-$HOME/.cache/gpudra}:
#   go/mod                       GOMODCACHE (module downloads)
#   go/build                     GOCACHE (compiled packages)
#   controlplane/<sha256>/       the binaries, keyed by the sha256 of go.mod,
#                                go.sum, build.sh and every *.go file here and
#                                in referencecdi/
# A warm call only hashes those files; it does not run the Go toolchain.
#
# Environment: GO (go binary; default: go on PATH, else /usr/local/go/bin/go),
# CC (C compiler for reference-cdi; default: cc), GPUDRA_CACHE,
# GPUDRA_BUILD_JOBS (go build -p; default: number of CPUs),
# GOPROXY and friends are passed through.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GPUDRA_CACHE:-$HOME/.cache/gpudra}
COMPONENTS=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet-dra reference-allocator)

force=0
case "${1:-}" in
--force) force=1 ;;
"") ;;
-h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
esac

cd "$HERE"
inputs() { LC_ALL=C ls -- go.mod go.sum build.sh *.go referencecdi/go.mod referencecdi/go.sum referencecdi/*.go; }
KEY=$(LC_ALL=C sha256sum $(inputs) | sha256sum | cut -c1-64)
OUTDIR="$CACHE/controlplane/$KEY"
BIN="$OUTDIR/controlplane"

complete() {
	[ -x "$BIN" ] && [ -x "$OUTDIR/reference-cdi" ] || return 1
	local c
	for c in "${COMPONENTS[@]}"; do [ -L "$OUTDIR/$c" ] || return 1; done
}

if [ "$force" = 0 ] && complete; then
	echo "$BIN"
	exit 0
fi

mkdir -p "$CACHE/controlplane" "$CACHE/go/mod" "$CACHE/go/build"
# One build at a time (parallel test sessions share the cache).
exec 9>"$CACHE/controlplane/.build.lock"
if command -v flock >/dev/null 2>&1; then
	flock 9
fi
if [ "$force" = 0 ] && complete; then
	echo "$BIN"
	exit 0
fi

GO=${GO:-$(command -v go || true)}
GO=${GO:-/usr/local/go/bin/go}
[ -x "$GO" ] || { echo "build.sh: no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || { echo "build.sh: reference-cdi needs a C compiler (cgo); none at CC=$CC" >&2; exit 1; }
export CC

export GOMODCACHE="$CACHE/go/mod"
export GOCACHE="$CACHE/go/build"
export GOTOOLCHAIN=local
export GOFLAGS=-mod=readonly
export CGO_ENABLED=0
JOBS=${GPUDRA_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}

K8S_VERSION=$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)
MINOR=${K8S_VERSION#v1.}
MINOR=${MINOR%%.*}
LDFLAGS="-s -w"
# What the Kubernetes release build stamps in (hack/lib/version.sh), so that
# /version and `kubectl version` report the real release.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
	LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=$K8S_VERSION"
done

TMP=$(mktemp -d "$CACHE/controlplane/.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# Build from a snapshot, so that edits made while the compiler runs cannot
# end up in a binary cached under the hash of other sources.
mkdir "$TMP/src" "$TMP/out" "$TMP/src/referencecdi"
cp go.mod go.sum build.sh -- *.go "$TMP/src/"
cp referencecdi/go.mod referencecdi/go.sum -- referencecdi/*.go "$TMP/src/referencecdi/"
SNAPSHOT_KEY=$(cd "$TMP/src" && LC_ALL=C sha256sum $(inputs) | sha256sum | cut -c1-64)
if [ "$SNAPSHOT_KEY" != "$KEY" ]; then
	KEY=$SNAPSHOT_KEY
	OUTDIR="$CACHE/controlplane/$KEY"
	BIN="$OUTDIR/controlplane"
fi

echo "build.sh: building control plane ($K8S_VERSION, $("$GO" env GOVERSION), -p $JOBS) into $OUTDIR" >&2
start=$(date +%s)
(cd "$TMP/src" && nice -n 10 "$GO" build -p "$JOBS" -trimpath -ldflags "$LDFLAGS" -o "$TMP/out/controlplane" .) >&2
echo "build.sh: built in $(($(date +%s) - start)) s" >&2
start=$(date +%s)
(cd "$TMP/src/referencecdi" && CGO_ENABLED=1 nice -n 10 "$GO" build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$TMP/out/reference-cdi" .) >&2
echo "build.sh: reference-cdi built in $(($(date +%s) - start)) s" >&2

for c in "${COMPONENTS[@]}"; do
	ln -s controlplane "$TMP/out/$c"
done
rm -rf "$OUTDIR"
mv "$TMP/out" "$OUTDIR"
rm -rf "$TMP"
trap - EXIT
echo "$BIN"
