package snapshot

import "testing"

func TestCanonicalPCI(t *testing.T) {
	cases := []struct{ in, want string }{
		{"00000000:75:00.0", "0000:75:00.0"},
		{"0000:9B:00.0", "0000:9b:00.0"},
		{"9b:00.0", "0000:9b:00.0"},
		{"PCI:0000:10:1c", "0000:10:1c.0"},
		{"0001:00:00.0", "0001:00:00.0"},
		{"000B:00:00.0", "000b:00:00.0"},
		{" 0008:01:00.0 ", "0008:01:00.0"},
	}
	for _, c := range cases {
		got, err := CanonicalPCI(c.in)
		if err != nil || got != c.want {
			t.Errorf("CanonicalPCI(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "zz:00.0", "00:20.0", "00:00.9", "1:2:3:4", "10000:00:00.0"} {
		if got, err := CanonicalPCI(bad); err == nil {
			t.Errorf("CanonicalPCI(%q) = %q, want error", bad, got)
		}
	}
}

func FuzzCanonicalPCI(f *testing.F) {
	f.Add("00000000:75:00.0")
	f.Add("9b:00.0")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := CanonicalPCI(s)
		if err != nil {
			return
		}
		again, err := CanonicalPCI(got)
		if err != nil || again != got {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", s, got, again, err)
		}
	})
}
