package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// writeStructured writes v as JSON or YAML (YAML keys follow the JSON tags).
func writeStructured(w io.Writer, format string, v any) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return fmt.Errorf("unknown output format %q (want text, json or yaml)", format)
}

func checkFormat(flag, format string, allowed ...string) error {
	for _, a := range allowed {
		if format == a {
			return nil
		}
	}
	return &exitError{code: 3, err: fmt.Errorf("%s %s: want one of %s", flag, format, strings.Join(allowed, ", "))}
}

// colorOK reports whether w is a terminal that wants colour.
func colorOK(w io.Writer) bool {
	if os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return false
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// printable escapes what could drive a terminal in a string that came from
// outside (a capture, an agent, a user): C0 and C1 control characters and
// DEL become \xNN, invalid UTF-8 bytes too; tabs and everything printable
// stay. JSON and YAML output need none of this: their encoders escape.
func printable(s string) string {
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
