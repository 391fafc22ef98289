#!/usr/bin/env bash
# Build (or find in the cache) containerd, ctr and containerd-shim-runc-v2 for
# the real nodes of services/local/node.py.
#
# usage: services/local/containerd/build.sh [--force]
#
# Prints progress on stderr and the absolute path of the directory holding the
# three binaries as the last line of stdout. go.mod here is a wrapper module
# naming the three commands of github.com/containerd/containerd/v2 as tools;
# go.sum pins every module they are built from. Built as containerd's own
# static release is: CGO off (so no btrfs), and the tags no_btrfs no_devmapper
# no_zfs no_aufs (snapshotters a test node never uses); the shim also no_grpc.
# runc is not built here: the node runner uses Debian's (`make runc`).
#
# Cache: $GPUDRA_CACHE/containerd/<sha256 of go.mod, go.sum, build.sh,
# ../gobuild/lib.sh>/ (see services/local/gobuild/lib.sh for the layout, the
# lock and the environment).
set -euo pipefail

# shellcheck source=../gobuild/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gobuild/lib.sh"
BINARIES=(containerd ctr containerd-shim-runc-v2)
TAGS="no_btrfs no_devmapper no_zfs no_aufs"

gobuild_args "$@"
cd "$HERE"
INPUTS=(go.mod go.sum build.sh)
gobuild_cache containerd "${INPUTS[@]}"

complete() {
	local b
	for b in "${BINARIES[@]}"; do [ -x "$OUTDIR/$b" ] || return 1; done
}

gobuild_reuse containerd "$OUTDIR" complete
gobuild_env
gobuild_snapshot containerd "${INPUTS[@]}"

PKG=github.com/containerd/containerd/v2
VERSION=$(gobuild_version "$PKG")
LDFLAGS="-s -w -X $PKG/version.Version=$VERSION -X $PKG/version.Revision=$VERSION -X $PKG/version.Package=$PKG"
gobuild_building containerd "$VERSION"
gobuild_go "$TMP/src" -tags "$TAGS" -ldflags "$LDFLAGS" -o "$TMP/out/" "$PKG/cmd/containerd" "$PKG/cmd/ctr"
gobuild_go "$TMP/src" -tags "$TAGS no_grpc" -ldflags "$LDFLAGS" -o "$TMP/out/" "$PKG/cmd/containerd-shim-runc-v2"
gobuild_took built
gobuild_publish containerd
echo "$OUTDIR"
