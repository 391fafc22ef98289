#!/usr/bin/env bash
# Find (or unpack into the cache) Debian's Prometheus: the `prometheus` server and
# `promtool`, which check and evaluate the chart's alert rules in the tests
# (deploy/chart/gpudra/files/alerts.yaml).
#
# usage: services/local/prometheus/build.sh [--force]
#
# Prints progress on stderr and the absolute path of `prometheus` as the last line of
# stdout; `promtool` lies beside it. Nothing is installed on the host: `apt-get
# download` fetches Debian 12's package (the version pinned below; the candidate of
# `apt-cache policy prometheus` if the mirror no longer has it, said on stderr) into a
# temporary folder and `dpkg-deb -x` unpacks its two binaries (Go, linked against libc
# alone) into the cache. Without apt lists, `apt-get update` runs first when root.
#
# Cache: $GPUDRA_CACHE/prometheus/<sha256 of build.sh, ../gobuild/lib.sh>/{prometheus,promtool,VERSION}
# (the layout and the lock of services/local/gobuild/lib.sh; no Go toolchain is used).
set -euo pipefail

PINNED=2.42.0+ds-5+deb12u1

# shellcheck source=../gobuild/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gobuild/lib.sh"

gobuild_args "$@"
cd "$HERE"
INPUTS=(build.sh)
gobuild_cache prometheus "${INPUTS[@]}"
gobuild_reuse prometheus "$OUTDIR/prometheus" test -x "$OUTDIR/prometheus" -a -x "$OUTDIR/promtool"
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
	|| { gobuild_say "no apt-get/dpkg-deb: Debian's prometheus package cannot be had here"; exit 1; }
gobuild_snapshot prometheus "${INPUTS[@]}"

candidate() {
	apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p'
}
known() {
	apt-cache show "prometheus=$1" >/dev/null 2>&1
}
if ! known "$PINNED" && [ "$(id -u)" = 0 ]; then
	gobuild_say "prometheus $PINNED not in the apt lists; apt-get update"
	apt-get update -qq >&2 || true
fi
VERSION=$PINNED
if ! known "$VERSION"; then
	VERSION=$(candidate)
	if [ -z "$VERSION" ] || [ "$VERSION" = "(none)" ]; then
		gobuild_say "apt knows no prometheus package (run apt-get update as root)"
		exit 1
	fi
	gobuild_say "prometheus $PINNED is gone from the mirror; taking the candidate $VERSION"
fi

gobuild_say "unpacking Debian's prometheus $VERSION into $OUTDIR"
mkdir "$TMP/deb"
# -o APT::Sandbox::User=root: as root, the _apt user could not write into $TMP.
(cd "$TMP/deb" && apt-get download -qq -o APT::Sandbox::User=root "prometheus=$VERSION") >&2
dpkg-deb -x "$TMP"/deb/prometheus_*.deb "$TMP/root"
mv "$TMP/root/usr/bin/prometheus" "$TMP/root/usr/bin/promtool" "$TMP/out/"
echo "$VERSION" >"$TMP/out/VERSION"
"$TMP/out/promtool" --version >&2
gobuild_publish prometheus
echo "$OUTDIR/prometheus"
