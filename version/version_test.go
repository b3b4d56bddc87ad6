package version

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" means it must not parse
	}{
		{"535.129.03", "535.129.3"},
		{"12.4", "12.4"},
		{"9.0", "9.0"},
		{"12", "12"},
		{" 550.90.07 \n", "550.90.7"},
		{"v12.4.1", "12.4.1"},
		{"R535", "535"},
		{"6.10.5-2084815.24.04", "6.10.5"},
		{"2.1.0+cu121", "2.1.0"},
		{"1.2~rc1", "1.2"},
		{"535.54.03 (beta)", "535.54.3"},
		{"18446744073709551615", "18446744073709551615"},
		{"", ""},
		{"   ", ""},
		{"N/A", ""},
		{"abc", ""},
		{"v", ""},
		{"vv12", ""},
		{"1.x", ""},
		{"12..4", ""},
		{"12.", ""},
		{".5", ""},
		{"-1", ""},
		{"+5", ""},
		{"12.4a", ""},
		{"535.129.03beta", ""},
		{"1.-2", ""},
		{"18446744073709551616", ""},
		{"99999999999999999999999", ""},
	} {
		v, err := Parse(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("Parse(%q) = %s, want an error", tc.in, v)
		case tc.want == "" && !errors.Is(err, ErrInvalid):
			t.Errorf("Parse(%q): error %v does not wrap ErrInvalid", tc.in, err)
		case tc.want != "" && err != nil:
			t.Errorf("Parse(%q): %v", tc.in, err)
		case tc.want != "" && v.String() != tc.want:
			t.Errorf("Parse(%q) = %s, want %s", tc.in, v, tc.want)
		}
	}
}

func TestCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b  string
		want  int
		known bool
	}{
		{"535.129.03", "535.129.03", 0, true},
		{"535.129.03", "535.54.03", 1, true},
		{"570.26", "570.124.06", -1, true},
		{"455.32", "455.23", 1, true},
		{"12.4", "12.4.0", 0, true},
		{"12.10", "12.9", 1, true},
		{"R535", "535", 0, true},
		{" 550.90.07 ", "550.90.07", 0, true},
		{"6.10.5-2084815.24.04", "6.10.5", 0, true},
		{"6.10.5-2084815.24.04", "6.10.6", -1, true},
		{"18446744073709551615", "1", 1, true},
		{"", "0", 0, false},
		{"", "", 0, false},
		{"abc", "1", 0, false},
		{"N/A", "N/A", 0, false},
		{"1.x", "1", 0, false},
		{"99999999999999999999999", "1", 0, false},
	} {
		for _, swap := range []bool{false, true} {
			a, b, want := tc.a, tc.b, tc.want
			if swap {
				a, b, want = b, a, -want
			}
			c, known := Compare(a, b)
			if c != want || known != tc.known {
				t.Errorf("Compare(%q, %q) = %d, %v; want %d, %v", a, b, c, known, want, tc.known)
			}
		}
	}
}

func TestAtLeast(t *testing.T) {
	for _, tc := range []struct {
		have, floor string
		ok, known   bool
	}{
		{"535.129.03", "535.54.03", true, true},
		{"535.54.03", "535.54.03", true, true},
		{"535.54.02", "535.54.03", false, true},
		{"12.4", "12.4.0", true, true},
		{"12.2", "12.4", false, true},
		{"9.0", "8.0", true, true},
		{"", "0", false, false},
		{"N/A", "1", false, false},
		{"unknown", "0", false, false},
		{"12.4", "", false, false},
		{"12.4", "twelve", false, false},
		{"99999999999999999999999", "1", false, false},
	} {
		ok, known := AtLeast(tc.have, tc.floor)
		if ok != tc.ok || known != tc.known {
			t.Errorf("AtLeast(%q, %q) = %v, %v; want %v, %v", tc.have, tc.floor, ok, known, tc.ok, tc.known)
		}
	}
}

func TestZeroV(t *testing.T) {
	var zero V
	v, err := Parse("0.0")
	if err != nil {
		t.Fatal(err)
	}
	if zero.String() != "0" || zero.Compare(v) != 0 {
		t.Errorf("zero V: %s, compares %d with 0.0", zero, zero.Compare(v))
	}
}

// FuzzParse: whatever the input, Parse either fails or gives a version that
// reads back as itself, compares equal to itself, and orders the same way
// as its written-back form against a second input; an unknown version is
// never at least anything.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"535.129.03", "12.4", "v1.2", "R535", "6.10.5-2084815.24.04", "", "N/A", "1..2", "00.01", "18446744073709551616"} {
		f.Add(s, "12.4")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		va, err := Parse(a)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse(%q): %v does not wrap ErrInvalid", a, err)
			}
			if ok, known := AtLeast(a, b); ok || known {
				t.Fatalf("AtLeast(%q, %q) = %v, %v for an unparsable have", a, b, ok, known)
			}
			if ok, known := AtLeast(b, a); ok || known {
				t.Fatalf("AtLeast(%q, %q) = %v, %v for an unparsable floor", b, a, ok, known)
			}
			return
		}
		back, err := Parse(va.String())
		if err != nil || back.Compare(va) != 0 || back.String() != va.String() {
			t.Fatalf("%q -> %s does not read back: %v", a, va, err)
		}
		if va.Compare(va) != 0 {
			t.Fatalf("%q is not equal to itself", a)
		}
		vb, err := Parse(b)
		if err != nil {
			return
		}
		c, known := Compare(a, b)
		if !known || c != va.Compare(vb) || c != -vb.Compare(va) {
			t.Fatalf("Compare(%q, %q) = %d, %v; V.Compare %d, reversed %d", a, b, c, known, va.Compare(vb), vb.Compare(va))
		}
		if c2, _ := Compare(va.String(), vb.String()); c2 != c {
			t.Fatalf("Compare(%q, %q) = %d but on the written-back forms %d", a, b, c, c2)
		}
		if ok, _ := AtLeast(a, b); ok != (c >= 0) {
			t.Fatalf("AtLeast(%q, %q) = %v with Compare %d", a, b, ok, c)
		}
	})
}
