#!/usr/bin/env bash
# Builds a Kubernetes control plane for kiln's DRA tests from the Go module
# proxy: etcd, kube-apiserver, kube-scheduler and kube-controller-manager, at
# the version kiln's client libraries speak, and kubectl (it renders deploy/'s
# kustomize base for the test that dry-runs it). Nothing is downloaded but Go
# modules; the binaries are cached outside the repository, keyed by version,
# and the build is skipped when all five are there.
#
#   scripts/kube.sh            build (or find) the binaries, print their folder
#   KILN_KUBE_VERSION=1.37.2   the Kubernetes release (default below)
#   KILN_KUBE_CACHE=DIR        the cache (default ~/.cache/kiln/kube)
#
# The tests find the binaries through KILN_KUBE_BIN (the folder printed last).
# A cold build takes about 13 minutes on 2 cores and about 2.5 GB of memory
# (kube-apiserver); a warm Go build cache makes it well under a minute.
set -euo pipefail

VERSION="${KILN_KUBE_VERSION:-1.37.2}"
STAGING="v0.${VERSION#1.}"
CACHE="${KILN_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/kube}"
BIN="$CACHE/v$VERSION/bin"
SRC="$CACHE/v$VERSION/src"
BINARIES=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl)

say() { printf 'kube: %s\n' "$*" >&2; }

have_all() {
	local b
	for b in "${BINARIES[@]}"; do
		[ -x "$BIN/$b" ] || return 1
	done
}

if have_all; then
	say "cached: $BIN"
	echo "$BIN"
	exit 0
fi
command -v go >/dev/null 2>&1 || { say "go is not installed"; exit 1; }
START=$(date +%s)
mkdir -p "$BIN" "$SRC"
cd "$SRC"

# The module cache stays outside the scratch module: inside it, go mod tidy
# fails on the cached modules' own go.mod files.
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

# k8s.io/kubernetes maps its staging modules to ./staging/...; outside its
# repository each must be replaced by the same path at the staging version.
gomod=$(go mod download -json "k8s.io/kubernetes@v$VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
[ -f "$gomod" ] || { say "could not download k8s.io/kubernetes@v$VERSION"; exit 1; }
{
	echo "module kiln.dev/kube-control-plane"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/').0"
	echo
	echo "require k8s.io/kubernetes v$VERSION"
	echo
	sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#replace \1 => \1 '"$STAGING"'#p' "$gomod"
} >go.mod
cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
EOF
say "resolving modules for Kubernetes v$VERSION"
go mod tidy -e >/dev/null 2>tidy.log || { cat tidy.log >&2; exit 1; }

MINOR="${VERSION#1.}"
MINOR="${MINOR%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$VERSION"
ldflags="$ldflags -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR"
build() {
	local name=$1 pkg=$2
	[ -x "$BIN/$name" ] && return 0
	say "building $name"
	local t=$(date +%s)
	go build -trimpath -ldflags="$ldflags" -o "$BIN/$name.tmp" "$pkg"
	mv "$BIN/$name.tmp" "$BIN/$name"
	say "$name built in $(($(date +%s) - t)) s"
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kubectl k8s.io/kubernetes/cmd/kubectl
say "done in $(($(date +%s) - START)) s: $BIN"
echo "$BIN"
