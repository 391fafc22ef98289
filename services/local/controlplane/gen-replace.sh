#!/usr/bin/env bash
# Pin k8s.io/kubernetes and every k8s.io/* staging module it replaces with
# ./staging/src/k8s.io/* to the matching published v0.X.Y tag, then tidy.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
# with local directories; a module that imports it has to repeat those
# replaces with real versions (the same approach as
# kubernetes-sigs/scheduler-plugins hack/). The list is taken from the
# kubernetes module's own go.mod, fetched through the module proxy.
#
# usage: gen-replace.sh [v1.N.P [DIR]]
#   DIR: the module folder whose go.mod and go.sum to write: . (default, the
#   release the control plane builds by default) or versions/v1.N (a release
#   of the compatibility tier, created from ./go.mod when new; see build.sh).
#   The version defaults to the one DIR's go.mod requires now. Tidying runs on
#   a copy of the sources with DIR's go.mod (go mod tidy counts every build
#   tag, so each compat_*.go file's imports are kept).
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
export GOTOOLCHAIN=local
export GOFLAGS=-mod=mod

DIR=${2:-.}
mkdir -p "$DIR"
[ -f "$DIR/go.mod" ] || cp go.mod go.sum "$DIR/"
K8S_VERSION=${1:-$(cd "$DIR" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)}
case "$K8S_VERSION" in
v1.*) ;;
*) echo "gen-replace.sh: expected a v1.X.Y kubernetes version, got '$K8S_VERSION'" >&2; exit 2 ;;
esac
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

GOMOD_FILE=$("$GO" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$GOMOD_FILE" ] || { echo "gen-replace.sh: cannot find go.mod of k8s.io/kubernetes@${K8S_VERSION}" >&2; exit 1; }

MODS=$(sed -n 's|^[[:space:]]*\(k8s.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*|\1|p' "$GOMOD_FILE")
[ -n "$MODS" ] || { echo "gen-replace.sh: no staging replaces found in $GOMOD_FILE" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -- *.go "$WORK/"
cp "$DIR/go.mod" "$DIR/go.sum" "$WORK/"
cd "$WORK"
# Drop replaces of staging modules that kubernetes no longer has, then set the new ones.
for old in $("$GO" mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(k8s.io\/[^"]*\)",*$/\1/p' | sort -u); do
	if ! printf '%s\n' $MODS | grep -qx "$old" && [ "$old" != k8s.io/kubernetes ]; then
		"$GO" mod edit -dropreplace "$old" 2>/dev/null || true
	fi
done
# available MOD VERSION: whether the module proxy serves MOD at VERSION.
available() {
	"$GO" mod download -json "$1@$2" 2>/dev/null | grep -q '"GoMod":'
}

args=(-require "k8s.io/kubernetes@${K8S_VERSION}")
for mod in $MODS; do
	version=$STAGING_VERSION
	if ! available "$mod" "$version"; then
		# A staging module the proxy lacks at this patch (the sample-* ones, never
		# built here) takes the nearest older patch of the same minor: only its
		# go.mod joins the module graph.
		patch=${STAGING_VERSION##*.}
		while [ "$patch" -gt 0 ]; do
			patch=$((patch - 1))
			version=${STAGING_VERSION%.*}.$patch
			available "$mod" "$version" && break
		done
		available "$mod" "$version" || { echo "gen-replace.sh: the proxy has no ${mod} of ${STAGING_VERSION%.*}" >&2; exit 1; }
		echo "gen-replace.sh: ${mod}@${STAGING_VERSION} is not on the proxy; using ${version}" >&2
	fi
	args+=(-replace "${mod}=${mod}@${version}")
	# The staging modules the sources import directly are required at that version too.
	if "$GO" mod edit -json | grep -q "\"Path\": \"$mod\""; then
		args+=(-require "${mod}@${version}")
	fi
done
"$GO" mod edit "${args[@]}"
"$GO" mod tidy
cp go.mod go.sum "$HERE/$DIR/"
echo "pinned k8s.io/kubernetes@${K8S_VERSION} and $(printf '%s\n' $MODS | wc -l) staging modules at ${STAGING_VERSION} in $DIR/go.mod" >&2
