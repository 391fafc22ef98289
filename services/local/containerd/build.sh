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

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../gobuild/lib.sh
. "$HERE/../gobuild/lib.sh"
BINARIES=(containerd ctr containerd-shim-runc-v2)
TAGS="no_btrfs no_devmapper no_zfs no_aufs"

force=0
case "${1:-}" in
--force) force=1 ;;
"") ;;
-h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
esac

cd "$HERE"
INPUTS=(go.mod go.sum build.sh)
KEY=$(gobuild_key "${INPUTS[@]}")
OUTDIR="$CACHE/containerd/$KEY"

complete() {
	local b
	for b in "${BINARIES[@]}"; do [ -x "$OUTDIR/$b" ] || return 1; done
}

if [ "$force" = 0 ] && complete; then
	echo "$OUTDIR"
	exit 0
fi
gobuild_lock containerd
if [ "$force" = 0 ] && complete; then
	echo "$OUTDIR"
	exit 0
fi
gobuild_env
gobuild_snapshot containerd "${INPUTS[@]}"
OUTDIR="$CACHE/containerd/$KEY"

PKG=github.com/containerd/containerd/v2
VERSION=$(cd "$TMP/src" && "$GO" list -m -f '{{.Version}}' "$PKG")
LDFLAGS="-s -w -X $PKG/version.Version=$VERSION -X $PKG/version.Revision=$VERSION -X $PKG/version.Package=$PKG"
echo "build.sh: building containerd ($VERSION, $("$GO" env GOVERSION), -p $JOBS) into $OUTDIR" >&2
start=$(date +%s)
(cd "$TMP/src" && nice -n 10 "$GO" build -p "$JOBS" -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" \
	-o "$TMP/out/" "$PKG/cmd/containerd" "$PKG/cmd/ctr") >&2
(cd "$TMP/src" && nice -n 10 "$GO" build -p "$JOBS" -trimpath -tags "$TAGS no_grpc" -ldflags "$LDFLAGS" \
	-o "$TMP/out/" "$PKG/cmd/containerd-shim-runc-v2") >&2
echo "build.sh: built in $(($(date +%s) - start)) s" >&2
gobuild_publish containerd
echo "$OUTDIR"
