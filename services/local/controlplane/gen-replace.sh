#!/usr/bin/env bash
# Pin k8s.io/kubernetes and every k8s.io/* staging module it replaces with
# ./staging/src/k8s.io/* to the matching published v0.X.Y tag.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
# with local directories; a module that imports it has to repeat those
# replaces with real versions (the same approach as
# kubernetes-sigs/scheduler-plugins hack/). The list is taken from the
# kubernetes module's own go.mod, fetched through the module proxy.
#
# usage: gen-replace.sh [v1.35.N]   (default: the version go.mod requires now)
set -euo pipefail
cd "$(dirname "$0")"

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
export GOTOOLCHAIN=local
export GOFLAGS=-mod=mod

K8S_VERSION=${1:-$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)}
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

# Drop replaces of staging modules that kubernetes no longer has, then set the new ones.
for old in $("$GO" mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(k8s.io\/[^"]*\)",*$/\1/p' | sort -u); do
	if ! printf '%s\n' $MODS | grep -qx "$old" && [ "$old" != k8s.io/kubernetes ]; then
		"$GO" mod edit -dropreplace "$old" 2>/dev/null || true
	fi
done
args=(-require "k8s.io/kubernetes@${K8S_VERSION}")
for mod in $MODS; do
	args+=(-replace "${mod}=${mod}@${STAGING_VERSION}")
done
"$GO" mod edit "${args[@]}"
echo "pinned k8s.io/kubernetes@${K8S_VERSION} and $(printf '%s\n' $MODS | wc -l) staging modules at ${STAGING_VERSION}" >&2
echo "now run: $GO mod tidy" >&2
