#!/usr/bin/env bash
# Build (or find in the cache) Jaeger v2 (the all-in-one `jaeger` binary) for
# traced e2e tests and `gpudra up --jaeger`.
#
# usage: services/local/jaeger/build.sh [--force]
#
# Prints progress on stderr and the absolute path of the binary as the last
# line of stdout. `go install github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0`
# (Jaeger v2.13's Go module version) is refused because that module has a
# replace directive; go.mod here is a wrapper module that repeats it and names
# cmd/jaeger as a tool, and go.sum pins every module it builds from.
#
# Cache: $GPUDRA_CACHE/jaeger/<sha256 of go.mod, go.sum, build.sh, ../gobuild/lib.sh>/jaeger
# (see services/local/gobuild/lib.sh for the layout, the lock and the environment).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../gobuild/lib.sh
. "$HERE/../gobuild/lib.sh"

force=0
case "${1:-}" in
--force) force=1 ;;
"") ;;
-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
esac

cd "$HERE"
INPUTS=(go.mod go.sum build.sh)
KEY=$(gobuild_key "${INPUTS[@]}")
BIN="$CACHE/jaeger/$KEY/jaeger"

if [ "$force" = 0 ] && [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
gobuild_lock jaeger
if [ "$force" = 0 ] && [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
gobuild_env
gobuild_snapshot jaeger "${INPUTS[@]}"
BIN="$CACHE/jaeger/$KEY/jaeger"

VERSION=$(cd "$TMP/src" && "$GO" list -m -f '{{.Version}}' github.com/jaegertracing/jaeger)
echo "build.sh: building jaeger ($VERSION, $("$GO" env GOVERSION), -p $JOBS) into $CACHE/jaeger/$KEY" >&2
start=$(date +%s)
(cd "$TMP/src" && nice -n 10 "$GO" build -p "$JOBS" -trimpath -ldflags "-s -w" \
	-o "$TMP/out/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger) >&2
echo "build.sh: built in $(($(date +%s) - start)) s" >&2
gobuild_publish jaeger
echo "$BIN"
