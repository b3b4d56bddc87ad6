package unwrap

import (
	"bytes"
	"regexp"
	"sync"
)

// A line wrapper is what a collector, a terminal multiplexer or a chat
// window put in front of every line: "gpu-node-07: ", "> ", "[pod/x/c] ",
// a container runtime's "2025-01-17T15:36:15.123456789Z stdout F ", a
// syslog header when a program's output went through the journal.
var wrappers = sync.OnceValue(func() []*regexp.Regexp {
	const iso = `\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?`
	const month = `[^\s\d:]{2,12}\.?`
	return []*regexp.Regexp{
		// CRI log files (containerd, CRI-O): time, stream, tag.
		regexp.MustCompile(`^` + iso + ` (?:stdout|stderr) [FP] `),
		// kubectl logs --prefix.
		regexp.MustCompile(`^\[pod/[^\]\s]+\] `),
		// docker logs --timestamps, ts(1), many collectors: a time first,
		// optionally a host and a level or stream.
		regexp.MustCompile(`^\[?` + iso + `\]? (?:(?:stdout|stderr):? )?`),
		// a syslog or journal header around a program's output.
		regexp.MustCompile(`^(?:` + month + ` {1,2}\d{1,2}|` + iso + `) \d\d:\d\d:\d\d(?:\.\d+)? \S+ [\w./@-]+(?:\[\d+\])?: ?`),
		regexp.MustCompile(`^` + iso + ` \S+ [\w./@-]+(?:\[\d+\])?: ?`),
		// docker compose: "service-1  | ".
		regexp.MustCompile(`^[\w.-]+ +\| `),
	}
})

// sampleLines is how many lines decide whether a file has a wrapper.
const sampleLines = 400

// nthLine is the offset just past the n-th line, or 0 when data has fewer.
func nthLine(data []byte, n int) int {
	off := 0
	for i := 0; i < n; i++ {
		j := bytes.IndexByte(data[off:], '\n')
		if j < 0 {
			return 0
		}
		off += j + 1
	}
	return off
}

// mayHaveWrapper: every wrapper of a known shape starts with a digit (a
// time), '[' (kubectl's pod, a bracketed time), a letter (a month, a
// service name) and holds a clock or a '|' early in the line; most lines of
// a file must.
func mayHaveWrapper(sample []byte) bool {
	n, hit := 0, 0
	forLines(sample, func(line []byte) {
		if len(bytes.TrimSpace(line)) == 0 {
			return
		}
		n++
		head := line[:min(len(line), 48)]
		if bytes.Contains(head, []byte("[pod/")) || bytes.Contains(head, []byte(" | ")) || hasClock(head) {
			hit++
		}
	})
	return n > 0 && float64(hit) >= minShare*float64(n)
}

func hasClock(b []byte) bool {
	for i := 2; i+2 < len(b); i++ {
		if b[i] == ':' && isDigit(b[i-1]) && isDigit(b[i-2]) && isDigit(b[i+1]) && isDigit(b[i+2]) {
			return true
		}
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// minShare is the share of non-empty lines a wrapper must start for kiln to
// take it as the file's wrapper.
const minShare = 0.9

// StripPrefix returns data without the wrapper in front of its lines, and
// says what it removed; ok is false when no wrapper starts (nearly) every
// line. It removes a constant prefix ("node1: ", "> ", a shared indent) or
// a wrapper of a known shape whose text varies (a timestamp).
func StripPrefix(data []byte) (out []byte, what string, ok bool) {
	// The decision is made on the first lines; only a file that has a
	// wrapper is copied.
	sample := data
	if n := nthLine(data, sampleLines); n > 0 {
		sample = data[:n]
	}
	if p := commonPrefix(sample); len(p) > 0 {
		return cut(data, func(line []byte) int {
			if bytes.HasPrefix(line, p) {
				return len(p)
			}
			return 0
		}), "removed the prefix " + quote(p) + " from every line", true
	}
	if !mayHaveWrapper(sample) {
		return data, "", false
	}
	for _, re := range wrappers() {
		n, hit := 0, 0
		forLines(sample, func(line []byte) {
			if len(bytes.TrimSpace(line)) == 0 {
				return
			}
			n++
			if loc := re.FindIndex(line); loc != nil && loc[1] > 0 {
				hit++
			}
		})
		if n == 0 || float64(hit) < minShare*float64(n) {
			continue
		}
		return cut(data, func(line []byte) int {
			if loc := re.FindIndex(line); loc != nil {
				return loc[1]
			}
			return 0
		}), "removed a per-line header (time, host or stream) from every line", true
	}
	return data, "", false
}

func quote(p []byte) string {
	s := string(p)
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return "\"" + s + "\""
}

func forLines(data []byte, f func(line []byte)) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			f(data)
			return
		}
		f(data[:i])
		data = data[i+1:]
	}
}

func cut(data []byte, n func(line []byte) int) []byte {
	out := make([]byte, 0, len(data))
	forLines(data, func(line []byte) {
		out = append(out, line[n(line):]...)
		out = append(out, '\n')
	})
	return out
}

// commonPrefix is the longest prefix that at least minShare of the
// non-empty lines start with, cut back to a boundary after ": ", "| ", "] ",
// "> " or a space. A prefix of blanks only counts when every line has it
// (an indented paste), since formats indent their own lines.
func commonPrefix(data []byte) []byte {
	var lines [][]byte
	forLines(data, func(line []byte) {
		if len(bytes.TrimSpace(line)) > 0 {
			lines = append(lines, line)
		}
	})
	if len(lines) < 3 {
		return nil
	}
	// The candidate comes from the first line; it is shortened until
	// enough lines share it.
	cand := lines[0]
	if len(cand) > 128 {
		cand = cand[:128]
	}
	for len(cand) > 0 {
		cand = toBoundary(cand)
		if len(cand) == 0 {
			return nil
		}
		hit := 0
		for _, l := range lines {
			if bytes.HasPrefix(l, cand) {
				hit++
			}
		}
		blank := len(bytes.TrimSpace(cand)) == 0
		if ((blank && hit == len(lines)) || (!blank && float64(hit) >= minShare*float64(len(lines)))) && (blank || isWrapperWord(cand)) {
			return cand
		}
		cand = cand[:len(cand)-1]
	}
	return nil
}

// toBoundary shortens p to end just after a separator: ": ", "| ", "] ",
// "> ", "\t", or a run of spaces after a word.
func toBoundary(p []byte) []byte {
	for i := len(p); i > 0; i-- {
		c := p[i-1]
		if c == ' ' || c == '\t' {
			if i == 1 || p[i-2] == ':' || p[i-2] == '|' || p[i-2] == ']' || p[i-2] == '>' || p[i-2] == ' ' || p[i-2] == '\t' || allBlank(p[:i]) {
				return p[:i]
			}
			continue
		}
		if c == '>' && i == len(p) && allBlank(p[:i-1]) {
			return p[:i]
		}
	}
	return nil
}

func allBlank(b []byte) bool { return len(bytes.Trim(b, " \t")) == 0 }

// isWrapperWord keeps a shared start of real content from being taken for a
// wrapper: "GPU 00000000:3B:00.0" lines of one nvidia-smi report, "pci "
// lines of a boot log. A wrapper ends in one of the separators and holds
// no more than a few words.
func isWrapperWord(p []byte) bool {
	t := bytes.TrimRight(p, " \t")
	if len(t) == 0 {
		return true
	}
	last := t[len(t)-1]
	if last != ':' && last != '|' && last != ']' && last != '>' {
		return false
	}
	return bytes.Count(t, []byte(" ")) <= 3
}
