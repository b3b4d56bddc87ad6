#!/usr/bin/env bash
# Checks kiln's API description, api/openapi.yaml, with standard tools:
#   1. Redocly CLI lints it with its recommended rules (api/redocly.yaml):
#      any problem, error or warning, fails;
#   2. the client that oapi-codegen generates from it must be the one
#      committed in api/openapitest (so description and client cannot
#      drift), and it must talk to a real kiln server (the live tests there);
#   3. the description lists exactly the server's routes with their
#      authentication (server's TestOpenAPIMatchesRoutes).
# Redocly CLI is installed from npm at a pinned version into a cache outside
# the repository, ${KILN_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/npm},
# and reused; the generator is fetched by the go command at the version
# api/openapitest/doc.go pins.
#
# Exits 1 when a check fails, 2 when a tool cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."

REDOCLY_VERSION=2.77.0

for cmd in node npm go; do
	if ! command -v "$cmd" >/dev/null 2>&1; then
		echo "openapi: $cmd is not installed (Node.js 20.19 or newer with npm, Go 1.26 or newer)" >&2
		exit 2
	fi
done
export CGO_ENABLED="${CGO_ENABLED:-1}"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
# Redocly CLI sends usage figures and looks for updates unless told not to.
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true

# 1. Redocly CLI, installed once per version.
dir="${KILN_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/npm}/redocly-cli-$REDOCLY_VERSION"
redocly="$dir/node_modules/.bin/redocly"
if [ ! -x "$redocly" ]; then
	echo "openapi: installing @redocly/cli@$REDOCLY_VERSION into $dir" >&2
	rm -rf "$dir.part"
	mkdir -p "$dir.part"
	if ! npm install --prefix "$dir.part" --no-audit --no-fund --ignore-scripts --loglevel=error "@redocly/cli@$REDOCLY_VERSION" >&2; then
		echo "openapi: could not install @redocly/cli@$REDOCLY_VERSION" >&2
		exit 2
	fi
	rm -rf "$dir"
	mv "$dir.part" "$dir"
fi
if ! have=$("$redocly" --version 2>/dev/null) || [ "$have" != "$REDOCLY_VERSION" ]; then
	echo "openapi: $redocly is not Redocly CLI $REDOCLY_VERSION (${have:-it does not run}); delete $dir to reinstall" >&2
	exit 2
fi
# Its framed notices (Node.js versions) are left out of the report.
status=0
report=$("$redocly" lint --config api/redocly.yaml --format=stylish 2>&1) || status=$?
grep -v '[╔║╚]' <<<"$report" | grep -v '^\s*$' || true
if [ "$status" != 0 ]; then
	echo "openapi: api/openapi.yaml fails Redocly CLI's recommended rules" >&2
	exit 1
fi

# 2. The generated client: current, and working against a real server. The
# generator is fetched (and built) here, so that the drift test finds it in
# the module cache; that test skips otherwise, so it must be seen to pass.
gen=$(sed -n 's|^//go:generate go run \([^ ]*@v[^ ]*\) .*|\1|p' api/openapitest/doc.go)
if [ -z "$gen" ]; then
	echo "openapi: api/openapitest/doc.go has no go:generate line with a pinned generator" >&2
	exit 2
fi
if ! go run "$gen" -version >/dev/null; then
	echo "openapi: could not fetch $gen" >&2
	exit 2
fi
status=0
out=$(go test -count=1 -v -run '^(TestGeneratedClientCurrent|TestLive.*)$' ./api/openapitest 2>&1) || status=$?
grep -E -- '^(---|ok|FAIL|\s)' <<<"$out" || true
if [ "$status" != 0 ]; then
	echo "openapi: the generated client is stale or does not work against the server" >&2
	exit 1
fi
if ! grep -q -- '^--- PASS: TestGeneratedClientCurrent' <<<"$out"; then
	echo "openapi: the drift test of the generated client did not run" >&2
	exit 1
fi

# 3. The routes.
go test -count=1 -run '^TestOpenAPIMatchesRoutes$' ./server
echo "openapi: api/openapi.yaml passes"
