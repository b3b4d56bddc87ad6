#!/usr/bin/env bash
# Runs kiln's linters and prints what they find:
#   staticcheck  over every package, tests included;
#   deadcode     over the module's programs and their tests (-test): a
#                function that no kiln program reaches is reported, unless it
#                lives in a package made for tests (one whose non-test files
#                import "testing", such as compat/imagetest or testenv),
#                where serving other packages' tests is the point, and
#                unless it is in deadcode_keep below (test API of a package
#                that tests of other packages use, each with its reason).
# Each tool is built once at a pinned version with `go install` into a
# cache outside the repository (by tool version and Go version) and reused.
#
#   scripts/lint.sh [staticcheck] [deadcode]    # both when none is named
#
# Exits 1 when a tool reports anything, 2 when a tool cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2 # honnef.co/go/tools 2026.2.2
DEADCODE_VERSION=v0.52.0   # golang.org/x/tools

if ! command -v go >/dev/null 2>&1; then
	echo "go is not installed: install Go 1.26 or newer (https://go.dev/doc/install)" >&2
	exit 2
fi
export CGO_ENABLED="${CGO_ENABLED:-1}"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
TOOLS="${KILN_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/tools}"
GOVERSION=$(go env GOVERSION)

# tool NAME PACKAGE VERSION prints the path of NAME built from PACKAGE at
# VERSION, building it first when the cache lacks it.
tool() {
	local dir="$TOOLS/$1-$3/$GOVERSION"
	if [ ! -x "$dir/$1" ]; then
		echo "lint: installing $2@$3 into $dir" >&2
		mkdir -p "$dir"
		if ! GOBIN="$dir" go install "$2@$3" >&2; then
			echo "lint: could not install $2@$3" >&2
			exit 2
		fi
	fi
	echo "$dir/$1"
}

run_staticcheck() {
	local bin
	bin=$(tool staticcheck honnef.co/go/tools/cmd/staticcheck "$STATICCHECK_VERSION")
	"$bin" -tags e2e ./...
}

# Test API that tests of other packages use and no kiln program needs, kept
# on purpose (a _test.go file cannot serve another package): DIR:FUNC and why.
deadcode_keep=(
	capture:Load # the tests of topo, doctor, sched, cdi and server load recorded machines with it (commands go through source)
	compat/offload:BuildBundle     # HIP-shaped binaries for compat's and offload's tests,
	compat/offload:BuildCompressed # the counterpart of compat/fatbin's builders
	compat/offload:BuildCodeObject
	compat/offload:BuildELF
	compat/fatbin:ParseTarget # compat's matrix tests name GPU code by target ("sm_90a")
	sched/frag:Score          # FGD as the paper states it: the oracle sched's FragScore
	sched/frag:ChooseGPUs     # is tested against (sim and sched use the memoised form)
)

run_deadcode() {
	local bin mains support out
	bin=$(tool deadcode golang.org/x/tools/cmd/deadcode "$DEADCODE_VERSION")
	mains=$(go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./...)
	# Directories (relative to the module) of the packages made for tests.
	support=$(go list -f '{{$p := .}}{{range .Imports}}{{if eq . "testing"}}{{$p.Dir}}{{end}}{{end}}' ./... |
		sed "s|^$PWD/||")
	# shellcheck disable=SC2086 # one argument per package
	out=$("$bin" -test -tags e2e $mains) || {
		echo "$out"
		return 2
	}
	local line dir name found=0
	while IFS= read -r line; do
		[ -n "$line" ] || continue
		dir=$(dirname "${line%%:*}")
		name=${line##*: }
		if grep -qxF "$dir" <<<"$support" || [[ " ${deadcode_keep[*]} " == *" $dir:$name "* ]]; then
			continue
		fi
		echo "$line"
		found=1
	done <<<"$out"
	return $found
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(staticcheck deadcode)
status=0
for t in "${tools[@]}"; do
	case "$t" in
	staticcheck | deadcode) ;;
	*)
		echo "lint: unknown tool $t (staticcheck or deadcode)" >&2
		exit 2
		;;
	esac
	echo "== $t"
	rc=0
	"run_$t" || rc=$?
	if [ $rc -gt $status ]; then
		status=$rc
	fi
	[ $rc -ne 0 ] || echo "(nothing)"
done
exit $status
