package pkgdb

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// numFields parses "12.4.127" into its numbers. It fails on an empty
// field, a non-digit, or a field of more than 9 digits.
func numFields(s string) ([]int, bool) {
	if s == "" {
		return nil, false
	}
	parts := strings.Split(s, ".")
	out := make([]int, len(parts))
	for i, p := range parts {
		if p == "" || len(p) > 9 {
			return nil, false
		}
		for _, c := range p {
			if c < '0' || c > '9' {
				return nil, false
			}
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, false
		}
		out[i] = n
	}
	return out, true
}

// releaseOK reports whether ns (major, minor[, patch]) can be a CUDA or
// ROCm release: major 1-99, minor and patch 0-99. A minor or patch of 100
// or more is a build number (HIP's 41133, cudart's 127).
func releaseOK(ns []int) bool {
	if len(ns) < 2 || len(ns) > 3 || ns[0] < 1 || ns[0] > 99 {
		return false
	}
	for _, n := range ns[1:] {
		if n < 0 || n > 99 {
			return false
		}
	}
	return true
}

func join(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ".")
}

// stripEpoch drops a package version's "EPOCH:" prefix.
func stripEpoch(v string) string {
	if i := strings.IndexByte(v, ':'); i > 0 {
		if _, ok := numFields(v[:i]); ok {
			return v[i+1:]
		}
	}
	return v
}

// upstream is a package version without its epoch and without the
// packaging revision after the last "-" (dpkg's debian_revision, rpm's
// RELEASE): "6.2.0.60200-66~22.04" -> "6.2.0.60200".
func upstream(v string) string {
	v = stripEpoch(v)
	if i := strings.LastIndexByte(v, '-'); i > 0 {
		return v[:i]
	}
	return v
}

// rocmCode decodes the number AMD appends to its package versions:
// major*10000 + minor*100 + patch, so 60200 is ROCm 6.2.0 and 50701 is
// ROCm 5.7.1. AMD's own packaging scripts build it as
// "${major}$(printf '%02d' $minor $patch)" (seen in the rocm-arch
// PKGBUILDs that repackage repo.radeon.com debs, e.g.
// rocm-arch/rocm-arch rocm-developer-tools/PKGBUILD: 5.2.1 -> 50201).
func rocmCode(s string) ([]int, bool) {
	if len(s) < 5 || len(s) > 6 {
		return nil, false
	}
	ns, ok := numFields(s)
	if !ok || len(ns) != 1 {
		return nil, false
	}
	c := ns[0]
	r := []int{c / 10000, c / 100 % 100, c % 100}
	return r, releaseOK(r)
}

// amdVersion splits an AMD repository version's upstream part,
// "X.Y.Z.NNNNN" (rocm-core 6.2.0.60200, rocblas 4.2.0.60200, rocm-llvm
// 18.0.0.24292.60200), into the fields before the code and the ROCm
// release the code gives.
func amdVersion(up string) (lead, rel []int, ok bool) {
	i := strings.LastIndexByte(up, '.')
	if i < 0 {
		return nil, nil, false
	}
	rel, ok = rocmCode(up[i+1:])
	if !ok {
		return nil, nil, false
	}
	lead, ok = numFields(up[:i])
	if !ok || len(lead) < 3 {
		return nil, nil, false
	}
	return lead, rel, true
}

// distRelease reads the release at the start of a distribution's
// upstream version: "5.3.3+dfsg" -> [5 3 3], "5.2.3" -> [5 2 3].
var distReleaseRe = regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?(?:[+~].*)?$`)

func distRelease(up string) ([]int, bool) {
	m := distReleaseRe.FindStringSubmatch(up)
	if m == nil {
		return nil, false
	}
	s := m[1] + "." + m[2]
	if m[3] != "" {
		s += "." + m[3]
	}
	ns, ok := numFields(s)
	return ns, ok && releaseOK(ns)
}

// cudaRelease turns a CUDA toolkit version string into the release kiln
// reports. NVIDIA writes the toolkit release in two ways: "12.4.1" (the
// version.json of the deb/rpm installs in nvidia/cuda images, the
// cuda-toolkit-X-Y package version) or "11.8.20220929" / "12.2.140" (the
// runfile installer writes a build date, Jetson's L4T a build number;
// version.txt's "10.2.89" is one too). CUDA update numbers are single
// digits (12.4.1, 11.4.4, 12.6.3), so a third field of 10 or more is a
// build and only major.minor is kept.
func cudaRelease(s string) (string, string, bool) {
	ns, ok := numFields(s)
	if !ok || len(ns) < 2 || !releaseOK(ns[:2]) {
		return "", "", false
	}
	if len(ns) == 3 && ns[2] < 10 {
		return join(ns), "", true
	}
	if len(ns) == 2 {
		return join(ns), "", true
	}
	return join(ns[:2]), fmt.Sprintf("%s: %s is a build number, not an update release", s, strings.Join(strings.Split(s, ".")[2:], ".")), true
}

// HIPSoname turns the version suffix of libamdhip64.so.X.Y.Z into the ROCm
// release: "5.2.21153" -> "5.2". HIP's X.Y is the ROCm release it ships
// with (HIP's changelog: "HIP 6.4 (For ROCm 6.4)"); Z is a build number
// (Debian's libamdhip64.so.5.2.21153, AMD's 6.2.41133) or, in recent AMD
// releases, AMD's release code (libamdhip64.so.6.3.60303,
// libamdhip64.so.6.4.60400), never a patch level of its own, so only X.Y
// is returned. "5" (the soname link) gives ok=false.
func HIPSoname(suffix string) (rocm string, ok bool) {
	ns, ok := numFields(suffix)
	if !ok || len(ns) < 2 || len(ns) > 3 || !releaseOK(ns[:2]) {
		return "", false
	}
	return join(ns[:2]), true
}

var rocmInfoVersionRe = regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?(?:[-~+.][0-9A-Za-z.~+-]*)?$`)

// ROCmInfoVersion reads the content of /opt/rocm/.info/version (written
// by the rocm-core package; also version-dev, version-libs, ...):
// "6.2.0-66" -> "6.2.0" (66 is the build of the release), "5.7.1" ->
// "5.7.1". Anything else is an error.
func ROCmInfoVersion(s string) (string, error) {
	line := strings.TrimSpace(s)
	if i := strings.IndexAny(line, "\r\n"); i >= 0 {
		line = line[:i]
	}
	if f := strings.Fields(line); len(f) > 0 {
		line = f[0]
	}
	m := rocmInfoVersionRe.FindStringSubmatch(line)
	if m == nil {
		return "", fmt.Errorf("%w: ROCm version %q", ErrMalformed, clip(line))
	}
	v := m[1] + "." + m[2]
	if m[3] != "" {
		v += "." + m[3]
	}
	ns, ok := numFields(v)
	if !ok || !releaseOK(ns) {
		return "", fmt.Errorf("%w: ROCm version %q has a build number in it", ErrMalformed, clip(line))
	}
	return join(ns), nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
