# Shared by the Go builds of services/local (controlplane, containerd, helm and
# jaeger build.sh): one command line, one cache layout, one lock per artifact,
# one Go environment, one way to say what is built. Sourced, not run, by each
# build.sh right after `set -euo pipefail`; sets HERE (the script's folder).
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
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
SCRIPT="$HERE/$(basename "${BASH_SOURCE[1]}")"

# gobuild_say MESSAGE...: progress, on stderr (stdout is the build's path alone).
gobuild_say() {
	echo "build.sh: $*" >&2
}

# gobuild_args [--versions] ARG...: the build's options. --force (FORCE=1) builds
# even when the cache has it; -h, --help print the script's leading comment; with
# --versions, --version 1.N also (VERSION). Anything else is refused.
gobuild_args() {
	local versions=0
	if [ "${1:-}" = --versions ]; then
		versions=1
		shift
	fi
	FORCE=0
	VERSION=""
	while [ $# -gt 0 ]; do
		case "$versions:$1" in
		*:--force) FORCE=1 ;;
		1:--version) VERSION=${2:-}; shift ;;
		1:--version=*) VERSION=${1#--version=} ;;
		*:-h | *:--help) sed -n '2,/^[^#]/{/^#/p}' "$SCRIPT" | sed 's/^# \{0,1\}//'; exit 0 ;;
		*) gobuild_say "unknown argument $1"; exit 2 ;;
		esac
		shift
	done
}

# gobuild_key FILE...: the cache key of these inputs (and of this library).
gobuild_key() {
	LC_ALL=C sha256sum "$@" "$GOBUILD_LIB" | sed "s|$GOBUILD_LIB|lib.sh|" | sha256sum | cut -c1-64
}

# gobuild_cache ARTIFACT FILE...: KEY of these inputs and OUTDIR, the build's folder.
gobuild_cache() {
	local artifact=$1
	shift
	KEY=$(gobuild_key "$@")
	OUTDIR="$CACHE/$artifact/$KEY"
}

# gobuild_reuse ARTIFACT RESULT CHECK...: unless FORCE, print RESULT and exit when
# the command CHECK finds the build in the cache; asked again once this script
# holds ARTIFACT's lock (another build may have finished it meanwhile).
gobuild_reuse() {
	local artifact=$1 result=$2
	shift 2
	if [ "$FORCE" = 0 ] && "$@"; then
		echo "$result"
		exit 0
	fi
	gobuild_lock "$artifact"
	if [ "$FORCE" = 0 ] && "$@"; then
		echo "$result"
		exit 0
	fi
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
# cached under the hash of other sources; sets TMP, and KEY and OUTDIR (the
# snapshot's).
gobuild_snapshot() {
	local artifact=$1
	shift
	TMP=$(mktemp -d "$CACHE/$artifact/.tmp.XXXXXX")
	trap 'rm -rf "$TMP"' EXIT
	mkdir "$TMP/src" "$TMP/out"
	cp --parents -- "$@" "$TMP/src/"  # relative paths: subfolders keep their place
	KEY=$(cd "$TMP/src" && gobuild_key "$@")
	OUTDIR="$CACHE/$artifact/$KEY"
}

# gobuild_version MODULE [DIR]: the version of MODULE that the go.mod in DIR
# (default: the snapshot's) selects.
gobuild_version() {
	(cd "${2:-$TMP/src}" && "$GO" list -m -f '{{.Version}}' "$1")
}

# gobuild_building NAME DETAIL: say what is built into OUTDIR, and start the clock
# that gobuild_took reads.
gobuild_building() {
	gobuild_say "building $1 ($2, $("$GO" env GOVERSION), -p $JOBS) into $OUTDIR"
	START=$(date +%s)
}

# gobuild_took WHAT: say WHAT took how long since the clock started; restart it.
gobuild_took() {
	gobuild_say "$* in $(($(date +%s) - START)) s"
	START=$(date +%s)
}

# gobuild_go DIR ARG...: go build ARG... in DIR, niced, with -p JOBS and -trimpath;
# the compiler's output goes to stderr.
gobuild_go() {
	local dir=$1
	shift
	(cd "$dir" && nice -n 10 "$GO" build -p "$JOBS" -trimpath "$@") >&2
}

# gobuild_publish ARTIFACT: move $TMP/out to $CACHE/ARTIFACT/$KEY (atomically replacing it).
gobuild_publish() {
	local outdir="$CACHE/$1/$KEY"
	rm -rf "$outdir"
	mv "$TMP/out" "$outdir"
	rm -rf "$TMP"
	trap - EXIT
}
