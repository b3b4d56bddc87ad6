#!/usr/bin/env bash
# Runs kiln's whole test suite: vet, then every test with the race detector.
# It installs what the tests need on a fresh Debian machine (Go must be
# there already; gcc is needed for the race detector and the NVML binding,
# docker-registry for the compat and container tests, containerd and runc
# for the container executor's tests).
# Here a test that needs a program from outside fails when it is missing
# (KILN_REQUIRE_TOOLS=1, package testenv), where a plain `go test ./...`
# skips it with how to install it.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
# The compat integration tests push images to a real registry: Debian's
# docker-registry (the CNCF distribution registry), started by the tests
# themselves on a loopback port.
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
# The container executor's tests run jobs through Debian's containerd and
# runc, started by the tests with their own root, state and socket.
[ -x /usr/bin/containerd ] || need_apt+=(containerd)
[ -x /usr/sbin/runc ] || need_apt+=(runc)
# The AMD code reader's tests check it against clang-offload-bundler, llc,
# clang and lld from Debian's LLVM 15.
[ -x /usr/bin/clang-offload-bundler-15 ] && [ -x /usr/bin/llc-15 ] || need_apt+=(clang-tools-15 llvm-15)
[ -x /usr/bin/clang-15 ] && [ -x /usr/bin/ld.lld-15 ] || need_apt+=(clang-15 lld-15)
# The interactive session test (kiln shell, kiln run -it) drives a real
# terminal: tmux, whose pane it reads.
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
# The server's /metrics is scraped by a real Prometheus and checked with
# promtool, both from Debian's prometheus.
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || need_apt+=(prometheus)
# The web page's browser test drives Debian's Chromium (headless) through
# chromedp.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# The API description's linter (Redocly CLI, scripts/openapi.sh) comes from
# npm and wants Node.js 20.19 or newer.
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
if [ ${#need_apt[@]} -gt 0 ]; then
	echo "installing ${need_apt[*]}"
	if [ "$(id -u)" = 0 ]; then
		apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
	else
		sudo apt-get update -qq && sudo apt-get install -y -qq "${need_apt[@]}"
	fi
fi
if ! command -v go >/dev/null 2>&1; then
	echo "go is not installed: install Go 1.26 or newer (https://go.dev/doc/install)" >&2
	exit 1
fi

# go-nvml's header marks calls kiln does not use as deprecated; keep the
# build output readable.
export CGO_ENABLED=1
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
# A test that needs a program from outside fails here when it is missing,
# instead of skipping (package testenv).
export KILN_REQUIRE_TOOLS=1

go mod download
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi
# The end-to-end tests that run for seconds are tagged e2e (a plain go test
# leaves them out); here every tool and test sees them.
go vet -tags e2e ./...
# kiln-agent, the agent-only build of cmd/kiln (scripts/install.sh).
go build -tags agentonly -o /dev/null ./cmd/kiln
# staticcheck and deadcode, at pinned versions (scripts/lint.sh lists the
# findings alone).
scripts/lint.sh
# The API description against Redocly's recommended rules, and a client
# generated from it by oapi-codegen against a real server (tools pinned,
# cached outside the repository).
scripts/openapi.sh
# go test prints why a test skipped only with -v: say here whether the
# container tests can run on this machine, and if not, why.
go test -count=1 -run '^TestContainerSupport$' -v ./executor/containerd | grep -E -- '^(---|\s)' || true
# Real GPU binaries nobody here built (Debian's CUDA 11.8 libraries and
# CUDA-built programs, llama.cpp's CUDA 12.4 and 13.1 backends from npm,
# Debian's ROCm 5 libraries) and what cuobjdump and clang-offload-bundler say
# they hold: kiln's readers must agree exactly (testdata/realbin/SOURCES.md).
# Downloads are cached between runs, outside the repository.
scripts/realbin.sh
export KILN_REALBIN="${KILN_REALBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/realbin}"
# A real Kubernetes control plane for the DRA tests (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager built from the Go module proxy;
# cached by version, about 13 minutes cold on 2 cores, under a minute warm).
KILN_KUBE_BIN="$(scripts/kube.sh)"
export KILN_KUBE_BIN
# helm, built from the Go module proxy, for the chart in deploy/helm/kiln.
KILN_HELM="$(scripts/helm.sh)"
export KILN_HELM
go test -race -count=1 -tags e2e ./...
# The lease benchmark, small (100 agents, 200 grants), so that its agent
# process and both of its runs keep working; the figures come from the
# full run in the README.
go test -count=1 -run '^$' -bench LeaseGrantRelease -benchtime 200x -short ./server
