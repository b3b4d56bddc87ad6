package server

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
)

// A body is read whole, whatever length it declared: a declared length
// that is too short, too long or absent changes neither what is read nor
// the limit.
func TestReadAllSized(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		declared int64
		limit    int64
		want     string
		tooLong  bool
		err      bool
	}{
		{"as declared", "abcdef", 6, 10, "abcdef", false, false},
		{"none declared", "abcdef", -1, 10, "abcdef", false, false},
		{"declared short", "abcdef", 3, 10, "abcdef", false, false},
		{"declared long", "abc", 6, 10, "", false, true},
		{"over the limit, declared within", "abcdefghijkl", 4, 10, "", true, false},
		{"over the limit, declared over", "abcdefghijkl", 12, 10, "", true, false},
		{"empty", "", 0, 10, "", false, false},
		{"at the limit", "abcdefghij", 10, 10, "abcdefghij", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("POST", "/", strings.NewReader(tc.body))
			r.ContentLength = tc.declared
			b, err := readBody(r, tc.limit)
			switch {
			case tc.err:
				if err == nil {
					t.Fatalf("read %q, want an error", b)
				}
			case tc.tooLong:
				if !errors.Is(err, errTooLarge) {
					t.Fatalf("read %q, %v; want errTooLarge", b, err)
				}
			case err != nil:
				t.Fatal(err)
			case string(b) != tc.want:
				t.Fatalf("read %q, want %q", b, tc.want)
			}
		})
	}
}

// A body read ahead of its handler is handed over as it was read, and
// still held to the handler's limit.
func TestReadBodyAhead(t *testing.T) {
	ahead := func(s string) *http.Request {
		r, _ := http.NewRequest("POST", "/", nil)
		r.Body = &readBodyAhead{Reader: bytes.NewReader([]byte(s)), b: []byte(s)}
		return r
	}
	if b, err := readBody(ahead("abcdef"), 10); err != nil || string(b) != "abcdef" {
		t.Fatalf("read %q, %v; want abcdef", b, err)
	}
	if b, err := readBody(ahead("abcdef"), 5); !errors.Is(err, errTooLarge) {
		t.Fatalf("read %q, %v; want errTooLarge", b, err)
	}
	// A handler that read part of it already gets the rest, not the whole.
	r := ahead("abcdef")
	var two [2]byte
	if _, err := r.Body.Read(two[:]); err != nil {
		t.Fatal(err)
	}
	if b, err := readBody(r, 10); err != nil || string(b) != "cdef" {
		t.Fatalf("read %q, %v; want cdef", b, err)
	}
}
