package dra

import (
	"regexp"
	"strconv"
	"strings"
)

// semverRE is the grammar of semver.org 2.0.0, the form the API requires of
// version attributes.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// IsSemver reports whether v is a strict semantic version ("12.4.0").
func IsSemver(v string) bool { return semverRE.MatchString(v) }

// Semver turns a version as a tool prints it into a strict semantic
// version that CEL can compare: "535.183.01" -> "535.183.1", "12.4" ->
// "12.4.0", "6.16.13" stays, "6.0.2-115" -> "6.0.2" (the build number of a
// ROCm release is not a pre-release), "v9.0" -> "9.0.0". Only the leading
// dotted numbers count; ok is false when v does not start with one, or a
// part does not fit in 32 bits.
func Semver(v string) (string, bool) {
	v = strings.TrimSpace(v)
	v = strings.TrimPrefix(strings.TrimPrefix(v, "v"), "V")
	var parts []string
	for len(parts) < 3 {
		i := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
		}
		if i == 0 {
			break
		}
		n, err := strconv.ParseUint(v[:i], 10, 32)
		if err != nil {
			return "", false
		}
		parts = append(parts, strconv.FormatUint(n, 10))
		v = v[i:]
		if len(v) < 2 || v[0] != '.' || v[1] < '0' || v[1] > '9' {
			break
		}
		v = v[1:]
	}
	if len(parts) == 0 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	return strings.Join(parts, "."), true
}
