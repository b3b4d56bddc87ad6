// Package textsafe escapes strings that came from outside (a capture, an
// agent, a user, an image) before they are printed as text, so that they
// cannot drive the reader's terminal. JSON and YAML output need none of
// this: their encoders escape.
package textsafe

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Printable escapes C0 and C1 control characters, DEL and invalid UTF-8
// bytes as \xNN; tabs and everything printable stay.
func Printable(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f || c >= 0x80 {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case r < 0x20 && r != '\t', r == 0x7f, r >= 0x80 && r <= 0x9f:
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Lines is Printable for a message of several lines: each line is escaped,
// the line breaks stay (a CR before a line break goes).
func Lines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Printable(strings.TrimSuffix(l, "\r"))
	}
	return strings.Join(lines, "\n")
}
