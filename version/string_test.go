package version

import (
	"strconv"
	"strings"
)

// String writes the version's numbers back, dot-separated, without the
// prefix, the suffix or leading zeros ("R535.54.03-1" -> "535.54.3"); the
// tests read versions back with it.
func (v V) String() string {
	if len(v.fields) == 0 {
		return "0"
	}
	parts := make([]string, len(v.fields))
	for i, x := range v.fields {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ".")
}
