package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"kiln.dev/kiln/textsafe"
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
	return isTerminal(w)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// printable escapes what could drive a terminal in a string that came from
// outside (textsafe.Printable); printableLines keeps the line breaks of a
// message of several lines.
func printable(s string) string      { return textsafe.Printable(s) }
func printableLines(s string) string { return textsafe.Lines(s) }

// cell is printable for a table cell: a tab, which would open a column of
// its own, is escaped too.
func cell(s string) string {
	s = printable(s)
	if strings.IndexByte(s, '\t') < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\t", `\t`)
}

// cells is cell of each string, joined with sep.
func cells(ss []string, sep string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = cell(s)
	}
	return strings.Join(out, sep)
}

// termSafe passes a job's output to a terminal: text, newlines, tabs,
// carriage returns and colours (SGR sequences) go through; every other
// control character and escape sequence (titles, clipboard writes, cursor
// moves, C1 controls) is shown escaped, as printable does. A sequence or a
// character cut between two writes waits for the next one; Flush writes
// what is left.
type termSafe struct {
	w       io.Writer
	pending []byte
	out     []byte
}

func (t *termSafe) Write(p []byte) (int, error) {
	data := append(t.pending, p...)
	t.pending = nil
	t.out = t.out[:0]
	i := 0
	for i < len(data) {
		c := data[i]
		switch {
		case c == '\n' || c == '\r' || c == '\t' || c >= 0x20 && c < 0x7f:
			t.out = append(t.out, c)
			i++
		case c == 0x1b:
			n, ok, complete := sgrAt(data[i:])
			if !complete {
				t.pending = append(t.pending, data[i:]...)
				i = len(data)
				break
			}
			if ok {
				t.out = append(t.out, data[i:i+n]...)
				i += n
			} else {
				t.out = append(t.out, `\x1b`...)
				i++
			}
		case c < 0x80:
			t.out = fmt.Appendf(t.out, "\\x%02x", c)
			i++
		default:
			if !utf8.FullRune(data[i:]) {
				t.pending = append(t.pending, data[i:]...)
				i = len(data)
				break
			}
			r, n := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && n <= 1 || r >= 0x80 && r <= 0x9f {
				for _, b := range data[i : i+n] {
					t.out = fmt.Appendf(t.out, "\\x%02x", b)
				}
			} else {
				t.out = append(t.out, data[i:i+n]...)
			}
			i += n
		}
	}
	if _, err := t.w.Write(t.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes, escaped, what waits for the rest of a sequence.
func (t *termSafe) Flush() error {
	if len(t.pending) == 0 {
		return nil
	}
	_, err := io.WriteString(t.w, printable(string(t.pending)))
	t.pending = nil
	return err
}

// sgrAt looks at an escape sequence at the start of b: its length and
// whether it is a colour (SGR: ESC [ digits and ';' m); complete is false
// when b ends before it could tell.
func sgrAt(b []byte) (n int, ok, complete bool) {
	if len(b) < 2 {
		return 0, false, false
	}
	if b[1] != '[' {
		return 0, false, true
	}
	for j := 2; j < len(b) && j < 64; j++ {
		switch c := b[j]; {
		case c >= '0' && c <= '9' || c == ';':
		case c == 'm':
			return j + 1, true, true
		default:
			return 0, false, true
		}
	}
	return 0, false, len(b) >= 64
}
