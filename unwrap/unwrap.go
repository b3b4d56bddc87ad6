// Package unwrap finds a capture's content inside whatever wraps it. Admins
// hand kiln files that went through terminals, editors, chat windows,
// collectors and Windows shells: UTF-16 from PowerShell, byte-order marks,
// CRLF line ends, ANSI colours, shell prompts, markdown fences and quote
// markers, a node name or a collector's timestamp in front of every line.
// Clean removes what never belongs to any capture format; Prefixes offers the
// text again without a per-line wrapper, for importers that did not
// recognise the text as it came.
//
// Everything here is a pure function of bytes: no I/O, and time and memory
// linear in the input.
package unwrap

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// Result is cleaned text and what was done to get it.
type Result struct {
	Data []byte
	// Notes say what was removed or decoded, for the report ("decoded
	// UTF-16LE", "removed ANSI colour codes").
	Notes []string
}

// Clean decodes UTF-16, drops byte-order marks, ANSI escape sequences and
// other control characters, turns CRLF and lone CR into LF, and drops
// leading blank lines, markdown code fences and shell prompt lines. Text
// without any of these comes back as the same bytes.
func Clean(data []byte) Result {
	var r Result
	if d, ok := decodeUTF16(data); ok {
		data = d
		r.Notes = append(r.Notes, "decoded UTF-16 text")
	}
	if !needsClean(data) {
		r.Data = data
		return r
	}
	out := make([]byte, 0, len(data))
	ansi, ctl := false, false
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == 0x1b:
			n := escapeLen(data[i:])
			i += n
			ansi = true
			continue
		case c == '^' && i+2 < len(data) && data[i+1] == '[' && data[i+2] == '[':
			// "^[[31m": an escape shown in caret notation (cat -v, less).
			if n := escapeLen(data[i+1:]); n > 1 {
				i += 1 + n
				ansi = true
				continue
			}
		case c == '\r':
			if i+1 < len(data) && data[i+1] == '\n' {
				i++
				continue
			}
			out = append(out, '\n')
			i++
			continue
		case c == 0xef && i+2 < len(data) && data[i+1] == 0xbb && data[i+2] == 0xbf:
			i += 3 // BOM, at the start or where files were concatenated
			continue
		case c < 0x20 && c != '\n' && c != '\t', c == 0x7f:
			ctl = true
			i++
			continue
		}
		out = append(out, c)
		i++
	}
	if ansi {
		r.Notes = append(r.Notes, "removed ANSI escape sequences")
	}
	if ctl {
		r.Notes = append(r.Notes, "removed control characters")
	}
	out, dropped := dropFrame(out)
	if dropped > 0 {
		r.Notes = append(r.Notes, "removed shell prompts and code fences")
	}
	r.Data = out
	return r
}

// needsClean is a fast scan for anything Clean would change.
func needsClean(data []byte) bool {
	for i, c := range data {
		if (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f || c == 0xef {
			return true
		}
		if c == '^' && i+1 < len(data) && data[i+1] == '[' {
			return true
		}
	}
	first := firstLine(data)
	if len(bytes.TrimSpace(first)) == 0 && len(data) > 0 {
		return true
	}
	return isFrameLine(first) || isFrameLine(lastLine(data))
}

func firstLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i]
	}
	return b
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n \t")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

// escapeLen is the length of the escape sequence at b[0] == ESC (or '['
// for caret notation, where b[0] is the '[' after '^'): CSI sequences
// ("ESC [ 1 ; 31 m"), OSC strings ending in BEL or ESC \, and two-byte
// escapes. An unterminated sequence runs to the end of its line.
func escapeLen(b []byte) int {
	if len(b) < 2 {
		return len(b)
	}
	switch b[1] {
	case '[':
		for i := 2; i < len(b) && i < 64; i++ {
			c := b[i]
			if c >= 0x40 && c <= 0x7e {
				return i + 1
			}
			if c == '\n' || !(c >= 0x20 && c <= 0x3f) {
				return i
			}
		}
		return min(len(b), 2)
	case ']':
		for i := 2; i < len(b) && i < 4096; i++ {
			switch b[i] {
			case 0x07:
				return i + 1
			case 0x1b:
				if i+1 < len(b) && b[i+1] == '\\' {
					return i + 2
				}
			case '\n':
				return i
			}
		}
		return 2
	}
	return 2
}

// decodeUTF16 turns UTF-16 text (PowerShell's "> file" writes UTF-16LE with
// a byte-order mark) into UTF-8. Without a mark, text where every other
// byte of the first line is NUL is taken as UTF-16 too.
func decodeUTF16(b []byte) ([]byte, bool) {
	le := true
	switch {
	case len(b) >= 2 && b[0] == 0xff && b[1] == 0xfe:
		b = b[2:]
	case len(b) >= 2 && b[0] == 0xfe && b[1] == 0xff:
		b, le = b[2:], false
	case len(b) >= 8 && b[1] == 0 && b[3] == 0 && b[5] == 0 && b[7] == 0 && b[0] != 0:
	case len(b) >= 8 && b[0] == 0 && b[2] == 0 && b[4] == 0 && b[6] == 0 && b[1] != 0:
		le = false
	default:
		return nil, false
	}
	u := make([]uint16, len(b)/2)
	for i := range u {
		if le {
			u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
		} else {
			u[i] = uint16(b[2*i])<<8 | uint16(b[2*i+1])
		}
	}
	runes := utf16.Decode(u)
	out := make([]byte, 0, len(runes))
	for _, r := range runes {
		out = utf8.AppendRune(out, r)
	}
	return out, true
}

// dropFrame removes leading blank lines and the lines that frame a pasted
// output: markdown code fences and shell prompts (with or without the
// command after them), wherever they are. It returns how many lines went.
func dropFrame(b []byte) ([]byte, int) {
	dropped := 0
	out := b[:0:0]
	start := true
	for len(b) > 0 {
		line := b
		rest := []byte(nil)
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, rest = b[:i+1], b[i+1:]
		}
		b = rest
		content := bytes.TrimRight(line, "\n")
		if start && len(bytes.TrimSpace(content)) == 0 {
			dropped++
			continue
		}
		if isFrameLine(content) {
			dropped++
			continue
		}
		start = false
		out = append(out, line...)
	}
	if dropped == 0 {
		return out, 0
	}
	return out, dropped
}

// isFrameLine: "```", "```text", "$ nvidia-smi -q", "root@gpu-01:~# dmesg",
// "[user@host ~]$ lspci -vvv", "PS C:\> nvidia-smi", "C:\Users\x>nvidia-smi".
func isFrameLine(line []byte) bool {
	t := bytes.TrimSpace(line)
	if len(t) == 0 {
		return false
	}
	if bytes.HasPrefix(t, []byte("```")) || bytes.HasPrefix(t, []byte("~~~")) {
		return len(t) < 24 && bytes.IndexByte(t[3:], '`') < 0
	}
	return isPrompt(t)
}

// commands are the programs whose output kiln reads; a prompt line names
// one (or ends at the prompt sign).
var commands = [][]byte{
	[]byte("nvidia-smi"), []byte("nvidia-bug-report"), []byte("lspci"), []byte("dmesg"), []byte("journalctl"),
	[]byte("rocm-smi"), []byte("amd-smi"), []byte("rocminfo"), []byte("cat "), []byte("sudo "), []byte("tail "),
	[]byte("grep "), []byte("zcat "), []byte("less "), []byte("kubectl "), []byte("docker "), []byte("podman "),
	[]byte("nvidia-container-cli"), []byte("lshw"), []byte("tar "), []byte("ls "), []byte("sos "), []byte("sosreport"),
}

func isPrompt(t []byte) bool {
	// Windows: "PS C:\Users\me> cmd", "C:\Users\me>cmd".
	if bytes.HasPrefix(t, []byte("PS ")) && len(t) > 5 && t[4] == ':' && t[5] == '\\' {
		return bytes.IndexByte(t, '>') > 0
	}
	if len(t) > 3 && t[1] == ':' && t[2] == '\\' && t[0] >= 'A' && t[0] <= 'Z' {
		if i := bytes.IndexByte(t, '>'); i > 0 {
			return namesCommand(t[i+1:]) || len(bytes.TrimSpace(t[i+1:])) == 0
		}
		return false
	}
	// "$ cmd", "# cmd".
	if (t[0] == '$' || t[0] == '#') && (len(t) == 1 || t[1] == ' ') {
		return len(t) == 1 || namesCommand(t[2:])
	}
	// "user@host:~$ cmd", "[user@host dir]# cmd", "(venv) user@host:/x$ cmd".
	at := bytes.IndexByte(t, '@')
	if at <= 0 || at > 64 {
		return false
	}
	for i := at + 1; i < len(t) && i < 256; i++ {
		c := t[i]
		if (c == '$' || c == '#' || c == '%' || c == '>') && (i+1 == len(t) || t[i+1] == ' ') {
			head := t[:i]
			if bytes.ContainsAny(head, "\t") || bytes.Count(head, []byte(" ")) > 3 {
				return false
			}
			rest := bytes.TrimSpace(t[i+1:])
			return len(rest) == 0 || namesCommand(rest)
		}
	}
	return false
}

func namesCommand(s []byte) bool {
	s = bytes.TrimSpace(s)
	for _, c := range commands {
		if bytes.HasPrefix(s, c) {
			return true
		}
	}
	if bytes.HasPrefix(s, []byte("/")) {
		// "/usr/bin/nvidia-smi -q"
		for _, c := range commands {
			if bytes.Contains(s[:min(len(s), 64)], append([]byte("/"), c...)) {
				return true
			}
		}
	}
	return false
}

// Line cleans one line of a stream (the kernel log reader's): it drops ANSI
// escape sequences, a byte-order mark, a CR and other control characters.
func Line(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 && c != '\t' || c == 0x7f || c == 0xef || c == '^' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	r := Clean([]byte(s))
	return string(bytes.TrimRight(r.Data, "\n"))
}

// ASCIILower lowers A-Z and leaves every other byte as it is, so that an
// index found in the result is an index into s. (strings.ToLower changes
// the length of some runes, "İ" for one, and of invalid UTF-8.)
func ASCIILower(s string) string {
	i := 0
	for i < len(s) && !(s[i] >= 'A' && s[i] <= 'Z') {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s)
	for ; i < len(b); i++ {
		if c := b[i]; c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
