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
	for in, want := range map[string]string{"12.4.0": "12.4", "9.0.0": "9.0", "12": "12", "": ""} {
		if got := majorMinor(in); got != want {
			t.Errorf("majorMinor(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"12.4": "12.4.0", "9.0": "9.0.0", "13": "13.0.0", "1.2.3": "1.2.3"} {
		if got := semverOf(in); got != want {
			t.Errorf("semverOf(%q) = %q, want %q", in, got, want)
		}
	}
}
