#!/usr/bin/env bash
# Builds helm from the Go module proxy into a cache outside the repository
# (about 2 minutes cold on 2 cores) and prints the binary's path; the chart
# tests in dra/kubetest render deploy/helm/kiln with it.
set -euo pipefail

VERSION="${KILN_HELM_VERSION:-4.3.2}"
CACHE="${KILN_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/helm}"
BIN="$CACHE/v$VERSION/bin"

say() { printf 'helm: %s\n' "$*" >&2; }

if [ -x "$BIN/helm" ]; then
	say "cached: $BIN/helm"
	echo "$BIN/helm"
	exit 0
fi
command -v go >/dev/null 2>&1 || { say "go is not installed"; exit 1; }
START=$(date +%s)
mkdir -p "$BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say "building helm v$VERSION from the Go module proxy"
(cd "$tmp" && GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$tmp/bin" go install "helm.sh/helm/v4/cmd/helm@v$VERSION")
mv "$tmp/bin/helm" "$BIN/helm"
say "built in $(( $(date +%s) - START )) s: $BIN/helm"
echo "$BIN/helm"
