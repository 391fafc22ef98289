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

# shellcheck source=../gobuild/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gobuild/lib.sh"

gobuild_args "$@"
cd "$HERE"
INPUTS=(go.mod go.sum build.sh)
gobuild_cache jaeger "${INPUTS[@]}"
gobuild_reuse jaeger "$OUTDIR/jaeger" test -x "$OUTDIR/jaeger"
gobuild_env
gobuild_snapshot jaeger "${INPUTS[@]}"

VERSION=$(gobuild_version github.com/jaegertracing/jaeger)
gobuild_building jaeger "$VERSION"
gobuild_go "$TMP/src" -ldflags "-s -w" -o "$TMP/out/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
gobuild_took built
gobuild_publish jaeger
echo "$OUTDIR/jaeger"
