#!/usr/bin/env bash
# Runs every fuzz target of the module, one after the other, each for a
# while, and prints a table of target, package and result.
#
#   scripts/fuzz.sh [FUZZTIME [PACKAGE...]]
#
# FUZZTIME is go test's -fuzztime, such as 30s, 5m or 10000x (or $FUZZTIME;
# 30s when neither is given); the packages default to ./... (the module).
#
# The targets are what `go test -list '^Fuzz'` lists in each package. What
# the fuzzer generates stays in Go's cache, outside the repository; only an
# input that makes a target fail is written, by go test, into the package's
# testdata/fuzz/<target>/ directory, and this script names it. It exits 1
# when any target fails (a failing input, or a target that does not build or
# fails on its seed corpus).
set -uo pipefail
cd "$(dirname "$0")/.."

fuzztime="${1:-${FUZZTIME:-30s}}"
shift || true
patterns=("$@")
[ ${#patterns[@]} -gt 0 ] || patterns=(./...)
if ! command -v go >/dev/null 2>&1; then
	echo "go is not installed: install Go 1.26 or newer (https://go.dev/doc/install)" >&2
	exit 2
fi
export CGO_ENABLED="${CGO_ENABLED:-1}"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"

module=$(go list -m)
logs=$(mktemp -d -t kiln-fuzz-XXXXXX)
trap 'rm -rf "$logs"' EXIT

# Packages with tests, then the fuzz targets go test lists in each.
pkgs=$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' "${patterns[@]}")
# go test prints each package's list, then "ok <package> <time>".
# shellcheck disable=SC2086 # one argument per package
if ! out=$(go test -list '^Fuzz' $pkgs 2>&1); then
	echo "fuzz: listing the fuzz targets failed:" >&2
	echo "$out" >&2
	exit 1
fi
targets=()
names=()
while IFS= read -r line; do
	case "$line" in
	Fuzz*) names+=("$line") ;;
	ok*)
		pkg=$(awk '{print $2}' <<<"$line")
		for name in "${names[@]}"; do
			targets+=("$pkg $name")
		done
		names=()
		;;
	esac
done <<<"$out"
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz target found" >&2
	exit 1
fi
echo "fuzz: ${#targets[@]} targets, $fuzztime each"

results=()
failed=0
for entry in "${targets[@]}"; do
	pkg=${entry% *}
	name=${entry#* }
	dir=${pkg#"$module"}
	dir=${dir#/}
	log="$logs/$(tr '/' '_' <<<"$dir")-$name.log"
	echo "fuzz: $name ($pkg)"
	if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" >"$log" 2>&1; then
		result=ok
	else
		failed=1
		# go test says where it wrote the input, relative to the package.
		input=$(sed -n 's/.*Failing input written to \(testdata\/fuzz\/[^ ]*\).*/\1/p' "$log" | tail -n 1)
		if [ -n "$input" ]; then
			result="FAIL: input in ${dir:+$dir/}$input (go test -run '$name/${input##*/}' ./${dir})"
		else
			result="FAIL: no input written (does not build, or fails on its seed corpus)"
		fi
		echo "---- $name ($pkg)"
		tail -n 40 "$log"
		echo "----"
	fi
	results+=("$(printf '%-34s %-40s %s' "$name" "${dir:-.}" "$result")")
done

echo
printf '%-34s %-40s %s\n' TARGET PACKAGE RESULT
printf '%s\n' "${results[@]}"
exit $failed
