#!/usr/bin/env bash
# Build (or find in the cache) the control-plane multi-call binary.
#
# usage: services/local/controlplane/build.sh [--version 1.N] [--force]
#
# Without --version (or with the version go.mod requires, 1.37) it builds the
# default release from go.mod. --version 1.34, 1.35 or 1.36 builds that
# release from versions/v1.N/go.mod (and go.sum) with the build tag k8s1N,
# which selects compat_*.go's code for that release's Go API; such a build
# holds the control plane only (no reference-cdi, nvidia-cdi-hook, nvidia-ctk:
# they do not depend on the Kubernetes release and come with the default).
#
# Prints progress on stderr and the absolute path of the binary as the last
# line of stdout; the file kubernetes-version beside it holds the release
# (v1.37.2). Next to the binary there is one symlink per component
# (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl,
# kubelet, kubelet-dra, reference-allocator, cdi) and three binaries of module
# referencecdi/ (NVIDIA's toolkit needs go-nvml, which needs cgo, so they are
# built with CGO_ENABLED=1 and a C compiler; the control plane without):
# reference-cdi (`controlplane reference-cdi ARGS` runs it), and the toolkit's
# own nvidia-cdi-hook and nvidia-ctk (the version referencecdi/go.mod pins),
# which the real nodes (services/local/node.py) put in their driver root so
# that the hooks of our CDI specs really run.
#
# Cache: $GPUDRA_CACHE/controlplane/<sha256 of go.mod, go.sum, build.sh,
# ../gobuild/lib.sh, every *.go file here and referencecdi/'s module>/ (see
# services/local/gobuild/lib.sh for the layout, the lock and the environment:
# GO, GPUDRA_CACHE, GPUDRA_BUILD_JOBS; CC is the C compiler for reference-cdi,
# default cc).
set -euo pipefail

# shellcheck source=../gobuild/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gobuild/lib.sh"
COMPONENTS=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kubelet-dra reference-allocator)

gobuild_args --versions "$@"
cd "$HERE"
DEFAULT_MINOR=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes v1\.\([0-9]*\)\..*/\1/p' go.mod | head -1)
MINOR=${VERSION#v}
MINOR=${MINOR#1.}
MINOR=${MINOR%%[!0-9]*}
[ -n "$MINOR" ] || MINOR=$DEFAULT_MINOR
if [ "$MINOR" = "$DEFAULT_MINOR" ]; then
	MODDIR=.
	TAGS=""
	INPUTS=(go.mod go.sum build.sh $(LC_ALL=C ls -- *.go)
		referencecdi/go.mod referencecdi/go.sum $(LC_ALL=C ls -- referencecdi/*.go))
else
	MODDIR=versions/v1.$MINOR
	[ -f "$MODDIR/go.mod" ] || {
		gobuild_say "no Kubernetes 1.$MINOR here (have: 1.$DEFAULT_MINOR$(ls versions 2>/dev/null | sed 's/^v/, /' | tr -d '\n'))"
		exit 2
	}
	TAGS="k8s1$MINOR"
	INPUTS=("$MODDIR/go.mod" "$MODDIR/go.sum" build.sh $(LC_ALL=C ls -- *.go))
fi
gobuild_cache controlplane "${INPUTS[@]}"

complete() {
	[ -x "$OUTDIR/controlplane" ] && [ -s "$OUTDIR/kubernetes-version" ] || return 1
	if [ "$MODDIR" = . ]; then
		[ -x "$OUTDIR/reference-cdi" ] && [ -x "$OUTDIR/nvidia-cdi-hook" ] && [ -x "$OUTDIR/nvidia-ctk" ] || return 1
	fi
	local c
	for c in "${COMPONENTS[@]}"; do [ -L "$OUTDIR/$c" ] || return 1; done
}

gobuild_reuse controlplane "$OUTDIR/controlplane" complete
gobuild_env
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || { gobuild_say "reference-cdi needs a C compiler (cgo); none at CC=$CC"; exit 1; }
export CC

K8S_VERSION=$(gobuild_version k8s.io/kubernetes "$MODDIR")
LDFLAGS="-s -w"
# What the Kubernetes release build stamps in (hack/lib/version.sh), so that
# /version and `kubectl version` report the real release.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
	LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=$K8S_VERSION"
done

gobuild_snapshot controlplane "${INPUTS[@]}"
[ "$MODDIR" = . ] || cp "$TMP/src/$MODDIR/go.mod" "$TMP/src/$MODDIR/go.sum" "$TMP/src/"

gobuild_building "control plane" "$K8S_VERSION"
gobuild_go "$TMP/src" -tags "$TAGS" -ldflags "$LDFLAGS" -o "$TMP/out/controlplane" .
gobuild_took built
echo "$K8S_VERSION" >"$TMP/out/kubernetes-version"
if [ "$MODDIR" = . ]; then
	CGO_ENABLED=1 gobuild_go "$TMP/src/referencecdi" -ldflags "-s -w" -o "$TMP/out/reference-cdi" .
	gobuild_took "reference-cdi built"
	TOOLKIT=github.com/NVIDIA/nvidia-container-toolkit
	TOOLKIT_VERSION=$(gobuild_version "$TOOLKIT" "$TMP/src/referencecdi")
	CGO_ENABLED=1 gobuild_go "$TMP/src/referencecdi" \
		-ldflags "-s -w -X $TOOLKIT/internal/info.version=${TOOLKIT_VERSION#v}" \
		-o "$TMP/out/" "$TOOLKIT/cmd/nvidia-cdi-hook" "$TOOLKIT/cmd/nvidia-ctk"
	gobuild_took "nvidia-cdi-hook, nvidia-ctk ($TOOLKIT_VERSION) built"
fi
for c in "${COMPONENTS[@]}"; do
	ln -s controlplane "$TMP/out/$c"
done
gobuild_publish controlplane
echo "$OUTDIR/controlplane"
