package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"kiln.dev/kiln/doctor"
)

// A mutation rewrites a capture the way real files arrive: through Windows,
// terminals, collectors, chat windows and truncating copies. Every capture
// of the corpus must give the same findings after each one.
type mutation struct {
	name string
	// applies says whether the mutation makes sense for the file
	// (timestamps only exist in logs).
	applies func(rel string, data []byte) bool
	apply   func(data []byte) []byte
}

func always(string, []byte) bool { return true }

var (
	reMonoTime  = regexp.MustCompile(`(?m)^\[\s*(\d{1,9})\.(\d{1,9})\] `)
	reCtimeTime = regexp.MustCompile(`(?m)^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d \d{4}\] `)
)

func mutations() []mutation {
	isLog := func(rel string, data []byte) bool {
		return strings.HasPrefix(rel, "dmesg/") || strings.HasPrefix(rel, "fabricmanager/")
	}
	eachLine := func(data []byte, f func(i int, line []byte) []byte) []byte {
		var out []byte
		lines := bytes.SplitAfter(data, []byte("\n"))
		for i, l := range lines {
			if len(l) == 0 {
				continue
			}
			body := bytes.TrimSuffix(l, []byte("\n"))
			out = append(out, f(i, body)...)
			if bytes.HasSuffix(l, []byte("\n")) {
				out = append(out, '\n')
			}
		}
		return out
	}
	return []mutation{
		{"crlf", always, func(d []byte) []byte { return bytes.ReplaceAll(d, []byte("\n"), []byte("\r\n")) }},
		{"bom", always, func(d []byte) []byte { return append([]byte("\xef\xbb\xbf"), d...) }},
		{"utf16le", always, func(d []byte) []byte {
			u := utf16.Encode([]rune(strings.ReplaceAll(string(d), "\n", "\r\n")))
			out := []byte{0xff, 0xfe}
			for _, c := range u {
				out = append(out, byte(c), byte(c>>8))
			}
			return out
		}},
		{"ansi-colour", always, func(d []byte) []byte {
			return eachLine(d, func(_ int, l []byte) []byte {
				if len(bytes.TrimSpace(l)) == 0 {
					return l
				}
				return append(append([]byte("\x1b[1;32m"), l...), "\x1b[0m"...)
			})
		}},
		{"blank-lines", always, func(d []byte) []byte {
			d = bytes.ReplaceAll(d, []byte("\n\n"), []byte("\n\n\n"))
			return append(append([]byte("\n\n  \n"), d...), "\n\n"...)
		}},
		{"prompt-and-fence", always, func(d []byte) []byte {
			out := []byte("```\nroot@gpu-node-07:~# cat capture.txt\n")
			out = append(out, d...)
			if !bytes.HasSuffix(out, []byte("\n")) {
				out = append(out, '\n')
			}
			return append(out, "root@gpu-node-07:~# \n```\n"...)
		}},
		{"node-prefix", always, func(d []byte) []byte {
			return eachLine(d, func(_ int, l []byte) []byte { return append([]byte("gpu-node-07: "), l...) })
		}},
		{"cri-prefix", always, func(d []byte) []byte {
			t := time.Date(2025, 2, 27, 15, 10, 2, 0, time.UTC)
			return eachLine(d, func(i int, l []byte) []byte {
				ts := t.Add(time.Duration(i) * 1234567 * time.Nanosecond).Format(time.RFC3339Nano)
				return append([]byte(ts+" stdout F "), l...)
			})
		}},
		{"collector-prefix", isLog, func(d []byte) []byte {
			t := time.Date(2025, 2, 27, 15, 10, 2, 0, time.UTC)
			return eachLine(d, func(i int, l []byte) []byte {
				if len(bytes.TrimSpace(l)) == 0 {
					return l
				}
				ts := t.Add(time.Duration(i) * time.Millisecond).Format("2006-01-02T15:04:05.000000Z07:00")
				return append([]byte(ts+" gpu-node-07 10.0.3.17 kern.warn "), l...)
			})
		}},
		{"timestamp-form", func(rel string, data []byte) bool {
			return isLog(rel, data) && (reMonoTime.Match(data) || reCtimeTime.Match(data))
		}, func(d []byte) []byte {
			// dmesg's seconds since boot become dmesg -T's clock, and -T's
			// clock becomes --time-format iso.
			base := time.Date(2025, 2, 27, 15, 0, 0, 0, time.UTC)
			d = reMonoTime.ReplaceAllFunc(d, func(m []byte) []byte {
				sub := reMonoTime.FindSubmatch(m)
				var sec int64
				fmt.Sscan(string(sub[1]), &sec)
				return []byte("[" + base.Add(time.Duration(sec)*time.Second).Format("Mon Jan _2 15:04:05 2006") + "] ")
			})
			return reCtimeTime.ReplaceAllFunc(d, func(m []byte) []byte {
				t, err := time.Parse("Mon Jan _2 15:04:05 2006", string(bytes.Trim(m, "[] ")))
				if err != nil {
					return m
				}
				return []byte(t.Format("2006-01-02T15:04:05,000000-07:00") + " ")
			})
		}},
		{"truncated-tail", always, func(d []byte) []byte {
			// A copy taken while the file was written: a partial line after
			// the end (half of the first line, no newline).
			first := bytes.TrimSpace(bytes.SplitN(bytes.TrimLeft(d, " \t\r\n"), []byte("\n"), 2)[0])
			out := append([]byte(nil), d...)
			if !bytes.HasSuffix(out, []byte("\n")) {
				out = append(out, '\n')
			}
			return append(out, first[:len(first)*3/5]...)
		}},
		{"cut-closers", func(rel string, data []byte) bool {
			t := bytes.TrimSpace(data)
			return len(t) > 0 && (t[len(t)-1] == '}' || t[len(t)-1] == '>')
		}, func(d []byte) []byte {
			// A JSON or XML document whose end was cut off: its closing
			// brackets or its closing tag are gone.
			t := bytes.TrimRight(d, " \t\r\n")
			if t[len(t)-1] == '>' {
				if i := bytes.LastIndex(t, []byte("</")); i > 0 {
					return t[:i]
				}
				return t
			}
			return bytes.TrimRight(t, "}] \t\r\n")
		}},
	}
}

// findingSet is what a mutation must keep: ids, severities, devices and
// codes of the findings, and whether the input was read.
func findingSet(rep *doctor.Report) []string {
	var out []string
	for _, f := range rep.Findings {
		d := append([]string(nil), f.Devices...)
		sort.Strings(d)
		out = append(out, fmt.Sprintf("%s %s %d %s", f.Severity, f.ID, f.Code, strings.Join(d, ",")))
	}
	sort.Strings(out)
	return out
}

func doctorJSON(t *testing.T, path string) (*doctor.Report, int) {
	t.Helper()
	out, stderr, code := kiln(t, "doctor", "--from", path, "-o", "json")
	var rep doctor.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("doctor -o json on %s: %v (exit %d, %s)\n%s", path, err, code, stderr, out)
	}
	return &rep, code
}

// TestMutations: every capture of the corpus, rewritten by every mutation
// that applies to it, gives the same findings as the original.
func TestMutations(t *testing.T) {
	files := loadExpected(t)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	ms := mutations()
	tmp := t.TempDir()
	runs := 0
	for _, name := range names {
		path := filepath.Join(capturesDir, filepath.FromSlash(name))
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.IsDir() {
			continue // a directory capture (KFD topology) is not text
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(data[:min(len(data), 512)], 0) >= 0 || (len(data) > 1 && data[0] == 0x1f && data[1] == 0x8b) {
			continue // compressed archives are not rewritten as text
		}
		t.Run(name, func(t *testing.T) {
			orig, code := doctorJSON(t, path)
			want := findingSet(orig)
			for _, m := range ms {
				if !m.applies(name, data) {
					continue
				}
				runs++
				p := filepath.Join(tmp, strings.ReplaceAll(name, "/", "_")+"."+m.name)
				if err := os.WriteFile(p, m.apply(data), 0o644); err != nil {
					t.Fatal(err)
				}
				rep, mcode := doctorJSON(t, p)
				got := findingSet(rep)
				if mcode != code || strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Errorf("%s: exit %d, findings\n  %s\nwant exit %d, findings\n  %s\n(errors: %v)", m.name, mcode,
						strings.Join(got, "\n  "), code, strings.Join(want, "\n  "), rep.Errors)
				}
			}
		})
	}
	t.Logf("%d mutated captures checked", runs)
}
