package admission

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestBoundKeepsUTF8Whole(t *testing.T) {
	s := strings.Repeat("é", maxMessage) // two bytes each
	got := bound(s)
	if len(got) > maxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, " ...") {
		t.Fatalf("bound gave %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if bound("short") != "short" {
		t.Fatal("a short text was changed")
	}
}

func TestVersions(t *testing.T) {
	for in, want := range map[string]string{"12.4": "12.4.0", "9.0": "9.0.0", "13": "13.0.0", "1.2.3": "1.2.3"} {
		if got := semverOf(in); got != want {
			t.Errorf("semverOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestMessagesEscapeOutsideText: an image name or reason with terminal
// control characters (they come from the Pod and the image) reaches the
// user escaped.
func TestMessagesEscapeOutsideText(t *testing.T) {
	d := Pod([]Image{{Ref: "reg/x\x1b[2J:1", Err: errTest("no such image\x1b]0;owned\x07")}}, []Device{{Node: "n", Name: "gpu-0", Vendor: "nvidia"}}, nil)
	for _, w := range d.Warnings {
		if strings.ContainsAny(w, "\x1b\x07") {
			t.Fatalf("warning carries control characters: %q", w)
		}
	}
	if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], `\x1b`) {
		t.Fatalf("warnings %q", d.Warnings)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }
