package unwrap

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
)

func TestClean(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain text is left alone", "a\nb\n", "a\nb\n"},
		{"CRLF", "a\r\nb\r\n", "a\nb\n"},
		{"lone CR", "a\rb\n", "a\nb\n"},
		{"BOM", "\xef\xbb\xbfGPU 0\n", "GPU 0\n"},
		{"BOM of a second file", "a\n\xef\xbb\xbfb\n", "a\nb\n"},
		{"ANSI colours", "\x1b[1;31mXid\x1b[0m 79\n", "Xid 79\n"},
		{"OSC title", "\x1b]0;root@gpu: ~\x07dmesg line\n", "dmesg line\n"},
		{"caret notation", "^[[33mwarn^[[0m\n", "warn\n"},
		{"leading blank lines", "\n\n  \nGPU\n", "GPU\n"},
		{"prompt and fence", "```\n$ nvidia-smi -q\nGPU\nroot@gpu-01:~# \n```\n", "GPU\n"},
		{"bracket prompt", "[admin@node3 ~]$ sudo dmesg -T\n[x] y\n", "[x] y\n"},
		{"windows prompt", "PS C:\\Users\\lab> nvidia-smi\nGPU\nC:\\Users\\lab>\n", "GPU\n"},
		{"NUL and BEL", "a\x00b\x07\n", "ab\n"},
		{"non-ASCII kept", "Température: 45 °C\n", "Température: 45 °C\n"},
		{"hash comment is not a prompt", "# comment\nx\n", "# comment\nx\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Clean([]byte(tt.in))
			if string(got.Data) != tt.want {
				t.Errorf("Clean(%q) = %q, want %q", tt.in, got.Data, tt.want)
			}
		})
	}
}

func TestCleanUTF16(t *testing.T) {
	text := "==============NVSMI LOG==============\r\nDriver Version : 536.40\r\n"
	u := utf16.Encode([]rune(text))
	le := []byte{0xff, 0xfe}
	for _, c := range u {
		le = append(le, byte(c), byte(c>>8))
	}
	got := Clean(le)
	if want := strings.ReplaceAll(text, "\r\n", "\n"); string(got.Data) != want {
		t.Errorf("UTF-16LE: got %q, want %q", got.Data, want)
	}
	if len(got.Notes) == 0 {
		t.Error("no note says the text was decoded")
	}
}

func TestStripPrefix(t *testing.T) {
	tests := []struct {
		name, in, want string
		ok             bool
	}{
		{"node name", "node1: GPU 0\nnode1:     Fan : 30 %\nnode1: x\n", "GPU 0\n    Fan : 30 %\nx\n", true},
		{"quote markers", "> a\n> b\n> c\n", "a\nb\nc\n", true},
		{"shared indent", "    a\n      b\n    c\n", "a\n  b\nc\n", true},
		{"CRI", "2025-01-17T15:36:15.123456789Z stdout F GPU 0\n2025-01-17T15:36:15.2Z stdout F     Fan : 30 %\n2025-01-17T15:36:16Z stderr F x\n",
			"GPU 0\n    Fan : 30 %\nx\n", true},
		{"kubectl prefix", "[pod/smi-x/c] a\n[pod/smi-x/c]   b\n[pod/smi-x/c] c\n", "a\n  b\nc\n", true},
		{"journal header", "Feb 27 15:10:02 gpu01 nvidia-smi[881]: Attached GPUs : 8\nFeb 27 15:10:02 gpu01 nvidia-smi[881]: GPU 1\nFeb 27 15:10:03 gpu01 nvidia-smi[881]:     Fan : N/A\n",
			"Attached GPUs : 8\nGPU 1\n    Fan : N/A\n", true},
		{"content that shares a start is not a wrapper", "GPU 00000000:01:00.0\nGPU 00000000:02:00.0\nGPU 00000000:03:00.0\n", "", false},
		{"no wrapper", "a\nb\nc\n", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, ok := StripPrefix([]byte(tt.in))
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (got %q)", ok, tt.ok, got)
			}
			if ok && string(got) != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCloseJSON(t *testing.T) {
	doc := `{"card0": {"GPU ID": "0x740f", "PCI Bus": "0000:05:00.0"}, "card1": {"GPU ID": "0x740f", "PCI Bus": "0000:26:00.0"}}`
	for cut := len(doc) - 1; cut > 1; cut-- {
		got, ok := CloseJSON([]byte(doc[:cut]))
		if !ok {
			t.Fatalf("cut at %d: not mended", cut)
		}
		var v map[string]map[string]string
		if err := json.Unmarshal(got, &v); err != nil {
			t.Fatalf("cut at %d: %q does not parse: %v", cut, got, err)
		}
		// No value may come out cut short.
		for _, c := range v {
			for k, val := range c {
				if !strings.Contains(doc, `"`+k+`": "`+val+`"`) {
					t.Errorf("cut at %d: %s=%q is not a whole value of the document", cut, k, val)
				}
			}
		}
	}
	if _, ok := CloseJSON([]byte(doc)); ok {
		t.Error("a whole document was mended")
	}
	got, ok := CloseJSON([]byte(doc + "\nroot@x:~# "))
	if !ok || string(got) != doc {
		t.Errorf("trailing text: got %q, %v", got, ok)
	}
}

func TestCloseJSONKeepsWhatIsWhole(t *testing.T) {
	// Only the closing brackets are gone: the last card stays.
	got, ok := CloseJSON([]byte(`{"card0": {"x": "1"}, "card1": {"x": "2"`))
	if !ok || string(got) != `{"card0": {"x": "1"}, "card1": {"x": "2"}}` {
		t.Errorf("got %q, %v", got, ok)
	}
	// Two documents (amd-smi list --json, then metric --json), the second
	// cut: both kept, the second mended.
	got, ok = CloseJSON([]byte(`[{"gpu": 0}]` + "\n" + `[{"gpu": 0, "power": {"value": 182`))
	if !ok || !validStream(got) || !bytes.HasPrefix(got, []byte(`[{"gpu": 0}]`)) || !bytes.Contains(got, []byte(`182`)) {
		t.Errorf("stream: got %q, %v", got, ok)
	}
	// Two whole documents need nothing.
	if _, ok := CloseJSON([]byte(`{"a": 1}` + "\n" + `{"b": 2}` + "\n")); ok {
		t.Error("a whole stream was mended")
	}
}

func TestCloseXML(t *testing.T) {
	doc := "<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<gpu id=\"00000000:01:00.0\">\n<max_link_width>16x</max_link_width>\n<fan_speed>30 %</fan_speed>\n</gpu>\n</nvidia_smi_log>\n"
	for cut := len(doc) - 2; cut > 40; cut-- {
		got, ok := CloseXML([]byte(doc[:cut]))
		if !ok {
			continue // cut inside the declaration or before the root
		}
		var v struct {
			GPU []struct {
				Width string `xml:"max_link_width"`
			} `xml:"gpu"`
		}
		if err := xml.Unmarshal(got, &v); err != nil {
			t.Fatalf("cut at %d: %q does not parse: %v", cut, got, err)
		}
		for _, g := range v.GPU {
			if g.Width != "" && g.Width != "16x" {
				t.Errorf("cut at %d: width read as %q", cut, g.Width)
			}
		}
	}
	if _, ok := CloseXML([]byte(doc)); ok {
		t.Error("a whole document was mended")
	}
}

// FuzzUnwrap: no input makes Clean, StripPrefix or the closers panic or run
// long, and Clean is idempotent.
func FuzzUnwrap(f *testing.F) {
	for _, s := range []string{"a\r\nb", "\x1b[31mx", "> a\n> b\n> c\n", `{"a": [1, {"b": "c`, "<a><b>x</b><c>", "\xff\xfe\x41\x00", "$ nvidia-smi\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		start := time.Now()
		c := Clean(b)
		if _, utf16 := decodeUTF16(c.Data); utf16 || bytes.ContainsAny(b, "^\x1b") {
			// Text that still looks like UTF-16 after cleaning is decoded
			// again, and removing an escape can join a new one: not a
			// fixed point, by design.
		} else if again := Clean(c.Data); !bytes.Equal(again.Data, c.Data) {
			t.Errorf("Clean is not idempotent: %q -> %q -> %q", b, c.Data, again.Data)
		}
		StripPrefix(c.Data)
		CloseJSON(c.Data)
		CloseXML(c.Data)
		if d := time.Since(start); d > time.Second && len(b) < 1<<20 {
			t.Errorf("took %v on %d bytes", d, len(b))
		}
	})
}

func TestASCIILower(t *testing.T) {
	for _, s := range []string{"Unable to Determine", "İstanbul GPU İS LOST", "\xff\xfeNVRM", ""} {
		l := ASCIILower(s)
		if len(l) != len(s) {
			t.Errorf("ASCIILower(%q) = %q: length changed", s, l)
		}
	}
	if ASCIILower("NVIDIA-SMI Has FAILED") != "nvidia-smi has failed" {
		t.Error("ASCII letters not lowered")
	}
}
