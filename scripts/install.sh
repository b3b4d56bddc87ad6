#!/usr/bin/env bash
# Builds kiln from this source tree into ./kiln, or DIR/kiln:
#
#   scripts/install.sh [DIR]
#
# kiln reads NVIDIA GPUs through NVML, which it loads with cgo: the build
# needs a C compiler and the C library's headers. Where they are missing this
# script installs gcc and libc6-dev with apt-get when it may (as root, or with
# sudo that asks no password); otherwise it builds kiln without cgo and says
# what that kiln cannot do. It prints one line of what it built.
set -euo pipefail

case "${1:-}" in
-h | --help)
	sed -n '2,10s/^# \{0,1\}//p' "$0"
	exit 0
	;;
esac
dest=${1:-.}
src=$(cd "$(dirname "$0")/.." && pwd)

say() { printf 'install.sh: %s\n' "$*" >&2; }

# Go.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	PATH=$PATH:/usr/local/go/bin
fi
if ! command -v go >/dev/null 2>&1; then
	want=$(sed -n 's/^go \([0-9][0-9.]*\).*/\1/p' "$src/go.mod")
	say "Go is not installed: kiln needs Go ${want:-1.26} or newer. Get it from https://go.dev/dl/ (unpack it into /usr/local, then add /usr/local/go/bin to PATH) and run scripts/install.sh again."
	exit 1
fi

# A C compiler that can build against the C library: go-nvml includes
# dlfcn.h and links with libdl.
read -ra cc <<<"$(go env CC)"
cc_works() {
	printf '#include <dlfcn.h>\n#include <stdlib.h>\nint main(void) { return dlopen("", RTLD_LAZY) == NULL; }\n' |
		"${cc[@]}" -x c -o /dev/null - -ldl >/dev/null 2>&1
}
as_root() {
	if [ "$(id -u)" = 0 ]; then
		env DEBIAN_FRONTEND=noninteractive "$@"
	else
		sudo -n env DEBIAN_FRONTEND=noninteractive "$@"
	fi
}
cgo=1
if ! cc_works; then
	if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
		say "no working C compiler (${cc[*]}): installing gcc and libc6-dev with apt-get"
		log=$(mktemp)
		trap 'rm -f "$log"' EXIT
		if ! { as_root apt-get install -y -qq --no-install-recommends gcc libc6-dev ||
			{ as_root apt-get update -qq && as_root apt-get install -y -qq --no-install-recommends gcc libc6-dev; }; } >"$log" 2>&1; then
			tail -n 5 "$log" >&2
			say "apt-get could not install gcc and libc6-dev"
		fi
	fi
	if ! cc_works; then
		cgo=0
		say "no working C compiler (${cc[*]}) with the C library's headers: building kiln WITHOUT cgo."
		say "Such a kiln cannot read NVIDIA GPUs through NVML (health, clocks, ECC, NVLink) nor run kiln bench;"
		say "the rest works. Install gcc and libc6-dev (Debian, Ubuntu) or gcc and glibc-devel (Fedora, RHEL)"
		say "and run scripts/install.sh again."
	fi
fi

# The build. go-nvml's header marks many NVML calls deprecated and every cgo
# build would print a warning for each; the first build on a machine would
# also name every module it downloads.
mkdir -p "$dest"
out=$(cd "$dest" && pwd)/kiln
ver=$(git -C "$src" describe --tags --always --dirty 2>/dev/null || echo dev)
# kiln-agent is the same program built with only 'agent' and 'join'
# (-tags agentonly): what GPU nodes run, kept small.
for tags in "" agentonly; do
	bin=$out
	[ -n "$tags" ] && bin=$out-agent
	(
		cd "$src"
		CGO_ENABLED=$cgo CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
			go build -tags "$tags" -ldflags "-X main.version=$ver" -o "$bin" ./cmd/kiln 2>&1 |
			{ grep -Ev '^go: downloading [^ ]+ v[0-9]' || true; } >&2
	)
done
if [ "$cgo" = 1 ]; then
	what="with cgo: reads NVIDIA GPUs through NVML"
else
	what="WITHOUT cgo: cannot read NVIDIA GPUs through NVML"
fi
echo "built ${dest%/}/kiln (kiln $ver, $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH), $what)"
echo "built ${dest%/}/kiln-agent (only 'agent' and 'join', for GPU nodes)"
