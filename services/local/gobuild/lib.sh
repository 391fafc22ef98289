# Shared by the Go builds of services/local (controlplane/build.sh, jaeger/build.sh):
# one cache layout, one lock per artifact, one Go environment. Sourced, not run.
#
# Everything lives outside the repository, under ${GPUDRA_CACHE:-$HOME/.cache/gpudra}:
#   go/mod            GOMODCACHE (module downloads, shared by every build)
#   go/build          GOCACHE (compiled packages, shared by every build)
#   <artifact>/<key>/ one finished build, keyed by the sha256 of its inputs
# A warm call only hashes the inputs; it does not run the Go toolchain.
#
# Environment: GO (go binary; default: go on PATH, else /usr/local/go/bin/go),
# GPUDRA_CACHE, GPUDRA_BUILD_JOBS (go build -p; default: number of CPUs),
# GOPROXY and friends are passed through.

GOBUILD_LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
CACHE=${GPUDRA_CACHE:-$HOME/.cache/gpudra}

# gobuild_key FILE...: the cache key of these inputs (and of this library).
gobuild_key() {
	LC_ALL=C sha256sum "$@" "$GOBUILD_LIB" | sed "s|$GOBUILD_LIB|lib.sh|" | sha256sum | cut -c1-64
}

# gobuild_lock ARTIFACT: hold $CACHE/ARTIFACT/.build.lock until the script exits
# (parallel test sessions share the cache: one build of an artifact at a time).
gobuild_lock() {
	mkdir -p "$CACHE/$1" "$CACHE/go/mod" "$CACHE/go/build"
	exec 9>"$CACHE/$1/.build.lock"
	if command -v flock >/dev/null 2>&1; then
		flock 9
	fi
}

# gobuild_env: export the Go settings every build uses; sets GO and JOBS.
gobuild_env() {
	GO=${GO:-$(command -v go || true)}
	GO=${GO:-/usr/local/go/bin/go}
	[ -x "$GO" ] || { echo "$(basename "$0"): no Go toolchain (set GO=/path/to/go)" >&2; exit 1; }
	export GOMODCACHE="$CACHE/go/mod"
	export GOCACHE="$CACHE/go/build"
	export GOTOOLCHAIN=local
	export GOFLAGS=-mod=readonly
	export CGO_ENABLED=0
	JOBS=${GPUDRA_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
}

# gobuild_snapshot ARTIFACT FILE...: copy the inputs into a fresh $TMP/src (removed
# on exit), so that edits made while the compiler runs cannot end up in a binary
# cached under the hash of other sources; sets TMP and KEY (the snapshot's).
gobuild_snapshot() {
	local artifact=$1
	shift
	TMP=$(mktemp -d "$CACHE/$artifact/.tmp.XXXXXX")
	trap 'rm -rf "$TMP"' EXIT
	mkdir "$TMP/src" "$TMP/out"
	cp --parents -- "$@" "$TMP/src/"  # relative paths: subfolders keep their place
	KEY=$(cd "$TMP/src" && gobuild_key "$@")
}

# gobuild_publish ARTIFACT: move $TMP/out to $CACHE/ARTIFACT/$KEY (atomically replacing it).
gobuild_publish() {
	local outdir="$CACHE/$1/$KEY"
	rm -rf "$outdir"
	mv "$TMP/out" "$outdir"
	rm -rf "$TMP"
	trap - EXIT
}
