#!/usr/bin/env bash
# Install (or find in the cache) the official AsyncAPI parser for the tests.
#
# usage: tests/asyncapi/install.sh
#
# Prints the absolute path of the node_modules directory as the last line of
# stdout (use it as NODE_PATH for validate.cjs). It lives outside the repository,
# under ${GPUDRA_CACHE:-$HOME/.cache/gpudra}/asyncapi/<sha256>/, keyed by the
# sha256 of package.json, package-lock.json and this script; `npm ci` runs only
# when that directory is missing (from the npm registry, scripts disabled).
# Environment: NPM (npm binary; default: npm on PATH), GPUDRA_CACHE.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GPUDRA_CACHE:-$HOME/.cache/gpudra}
NPM=${NPM:-npm}

cd "$HERE"
KEY=$(LC_ALL=C sha256sum package.json package-lock.json install.sh | sha256sum | cut -c1-64)
OUTDIR="$CACHE/asyncapi/$KEY"

if [ -f "$OUTDIR/.complete" ]; then
	echo "$OUTDIR/node_modules"
	exit 0
fi

mkdir -p "$CACHE/asyncapi"
exec 9>"$CACHE/asyncapi/.install.lock"  # parallel test sessions share the cache
if command -v flock >/dev/null 2>&1; then
	flock 9
fi
if [ -f "$OUTDIR/.complete" ]; then
	echo "$OUTDIR/node_modules"
	exit 0
fi

WORK=$(mktemp -d "$CACHE/asyncapi/.tmp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cp package.json package-lock.json "$WORK/"
echo "installing @asyncapi/parser into $OUTDIR" >&2
(cd "$WORK" && "$NPM" ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
rm -rf "$OUTDIR"
mv "$WORK" "$OUTDIR"
trap - EXIT
touch "$OUTDIR/.complete"
echo "$OUTDIR/node_modules"
