// Package version reads and compares dotted numeric versions: drivers
// ("535.129.03"), CUDA and ROCm releases ("12.4", "6.0.2"), compute
// capabilities ("9.0").
//
// A version is one or more runs of decimal digits joined by dots, each run
// a number that fits in 64 bits. Space around it, one leading "v" or "r"
// ("v12.4", "R535") and a build suffix after the numbers that starts with
// "-", "+", "~", "_" or a space ("6.10.5-2084815.24.04", "2.1.0+cu121")
// are allowed and take no part in comparisons. Versions compare field by
// field as numbers, a missing field counting as 0: "570.26" < "570.124.06",
// "12.4" == "12.4.0".
//
// Anything else (an empty string, "N/A", "1.x", "12..4", a field too large
// for 64 bits) does not parse, and an unparsable version is unknown: it is
// equal to, older or newer than nothing, so it is never at least a floor.
package version

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrInvalid is what Parse's errors wrap.
var ErrInvalid = errors.New("not a dotted numeric version")

// V is a parsed version; the zero V is "0".
type V struct {
	fields []uint64
}

// Parse reads a version as the package documentation describes.
func Parse(s string) (V, error) {
	t := strings.TrimSpace(s)
	if t != "" && strings.ContainsRune("vVrR", rune(t[0])) {
		t = t[1:]
	}
	var v V
	for {
		n := 0
		for n < len(t) && t[n] >= '0' && t[n] <= '9' {
			n++
		}
		if n == 0 {
			return V{}, fmt.Errorf("version %q: %w", s, ErrInvalid)
		}
		x, err := strconv.ParseUint(t[:n], 10, 64)
		if err != nil {
			return V{}, fmt.Errorf("version %q: field %s is too large: %w", s, t[:n], ErrInvalid)
		}
		v.fields = append(v.fields, x)
		t = t[n:]
		if t == "" {
			return v, nil
		}
		switch t[0] {
		case '.':
			t = t[1:]
		case '-', '+', '~', '_', ' ', '\t':
			return v, nil
		default:
			return V{}, fmt.Errorf("version %q: %w", s, ErrInvalid)
		}
	}
}

// Compare returns -1, 0 or +1 as v is older than, the same as or newer
// than w.
func (v V) Compare(w V) int {
	for i := 0; i < len(v.fields) || i < len(w.fields); i++ {
		var x, y uint64
		if i < len(v.fields) {
			x = v.fields[i]
		}
		if i < len(w.fields) {
			y = w.fields[i]
		}
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	}
	return 0
}

// Field is the version's i-th number (0 the major), 0 where it has fewer.
func (v V) Field(i int) uint64 {
	if i < 0 || i >= len(v.fields) {
		return 0
	}
	return v.fields[i]
}

// Compare compares two version texts: c is -1, 0 or +1 as a is older than,
// the same as or newer than b, and known is false (c 0) when either does
// not parse.
func Compare(a, b string) (c int, known bool) {
	va, err := Parse(a)
	if err != nil {
		return 0, false
	}
	vb, err := Parse(b)
	if err != nil {
		return 0, false
	}
	return va.Compare(vb), true
}

// AtLeast reports whether have is floor or newer. known is false when
// either does not parse, and then ok is false too: an unknown version is
// never at least a floor.
func AtLeast(have, floor string) (ok, known bool) {
	c, known := Compare(have, floor)
	return known && c >= 0, known
}
