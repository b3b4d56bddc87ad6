package kb

import (
	"strings"
	"testing"
)

func TestCompareDriver(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"535.129.03", "535.129.03", 0},
		{"535.129.03", "535.54.03", 1},
		{"570.26", "570.124.06", -1},
		{"455.32", "455.23", 1},
		{"12.4", "12.4.0", 0},
		{"12.10", "12.9", 1},
		{"R535", "535", 0},
		{" 550.90.07 ", "550.90.07", 0},
		{"6.10.5-2084815.24.04", "6.10.5", 0},
		// An unparsable version is unknown: below every version, so never
		// at least a floor, not even "0" (it used to count as 0, and an
		// overflowing field as the largest number).
		{"", "0", -1},
		{"N/A", "0", -1},
		{"1.x", "1", -1},
		{"abc", "1", -1},
		{"99999999999999999999999", "1", -1},
		{"", "N/A", 0},
	} {
		if got := CompareDriver(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareDriver(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := CompareDriver(tc.b, tc.a); got != -tc.want {
			t.Errorf("CompareDriver(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

func TestMaxCUDAForDriver(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ driver, want string }{
		{"535.129.03", "12.2"},
		{"535.54.03", "12.2"},
		{"535.54.02", "12.1"},
		{"550.90.07", "12.4"},  // capture nvidia-smi-summary/h100x8-550.90.07 prints CUDA 12.4
		{"525.125.06", "12.0"}, // capture geforce-525.125.06 prints CUDA 12.0
		{"515.105.01", "11.7"}, // capture a10g-aws-515.105.01 prints CUDA 11.7
		{"560.35.03", "12.6"},  // capture titanv-560.35.03 prints CUDA 12.6
		{"590.44.01", "13.1"},  // capture rtx-a5000 590.44.01 prints CUDA 13.1
		{"460.32.03", "11.2"},
		{"580.65.06", "13.0"},
		{"570.26", "12.8"},
		{"450.51.05", "11.0"},
		{"418.39", "10.1"},
		{"400.1", ""},
		{"", ""},
	} {
		if got := k.MaxCUDAForDriver(tc.driver); got != tc.want {
			t.Errorf("MaxCUDAForDriver(%q) = %q, want %q", tc.driver, got, tc.want)
		}
	}
}

// The CUDA version each nvidia-smi capture prints is the one the table gives
// for its driver.
func TestMaxCUDAMatchesCaptures(t *testing.T) {
	k := Default()
	for _, f := range []string{
		"nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml",
		"nvidia-smi-q-xml/a10g-aws-515.105.01.xml",
		"nvidia-smi-q-xml/quadro-p2000-525.125.06.xml",
		"nvidia-smi-q-xml/rtx-a5000-x2-590.44.01.xml",
		"nvidia-smi-q-xml/rtx3090-590.44.01.xml",
	} {
		text := readCapture(t, f)
		driver := between(text, "<driver_version>", "</driver_version>")
		cuda := between(text, "<cuda_version>", "</cuda_version>")
		if driver == "" || cuda == "" {
			t.Fatalf("%s: no driver or CUDA version", f)
		}
		if got := k.MaxCUDAForDriver(driver); got != cuda {
			t.Errorf("%s: driver %s: MaxCUDAForDriver = %q, nvidia-smi says %q", f, driver, got, cuda)
		}
	}
}

func between(s, a, b string) string {
	_, after, ok := strings.Cut(s, a)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, b)
	return strings.TrimSpace(v)
}

func TestMinDriverForCUDA(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ cuda, driver, compat string }{
		{"12.4", "550.54.14", "525.60.13"},
		{"12.4.0", "550.54.14", "525.60.13"},
		{"12.4.1", "550.54.15", "525.60.13"},
		{"11.0", "450.51.05", "450.80.02"},
		{"11.8", "520.61.05", "450.80.02"},
		{"12.8", "570.26", "525.60.13"},
		{"13.0", "580.65.06", "580"},
		{"13.2.2", "595.71.05", "580"},
		{"10.2", "440.33", ""},
		{"13", "580.65.06", "580"}, // a bare major is its .0 release
	} {
		c, ok := k.MinDriverForCUDA(tc.cuda)
		if !ok || c.MinDriverLinux != tc.driver || c.MinorCompatDriver != tc.compat {
			t.Errorf("MinDriverForCUDA(%q) = %+v, %v; want %s (compat %s)", tc.cuda, c, ok, tc.driver, tc.compat)
		}
	}
	for _, v := range []string{"12.7", "9.0", "", "12.4.9", "14"} {
		if c, ok := k.MinDriverForCUDA(v); ok {
			t.Errorf("MinDriverForCUDA(%q) = %+v; want none", v, c)
		}
	}
}

func TestLowestDriver(t *testing.T) {
	k := Default()
	c, _ := k.MinDriverForCUDA("12.4")
	if got := c.LowestDriver(); got != "525.60.13" {
		t.Errorf("12.4 lowest driver %s", got)
	}
	c, _ = k.MinDriverForCUDA("11.0")
	if got := c.LowestDriver(); got != "450.51.05" {
		t.Errorf("11.0 lowest driver %s", got)
	}
}

// Every 11.x, 12.x and 13.x minor release is present, minimum drivers never
// go down as releases go up, and each family carries its compat floor.
func TestCUDATableShape(t *testing.T) {
	k := Default()
	have := map[string]bool{}
	for _, c := range k.CUDA {
		have[majorMinor(c.Version)] = true
	}
	for _, v := range []string{"11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8",
		"12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9",
		"13.0", "13.1", "13.2", "13.3", "13.4"} {
		if !have[v] {
			t.Errorf("CUDA %s missing", v)
		}
	}
	if have["12.7"] {
		t.Error("there is no CUDA 12.7")
	}
	seen := map[string]bool{}
	for i, c := range k.CUDA {
		if seen[c.Version] {
			t.Errorf("duplicate CUDA %s", c.Version)
		}
		seen[c.Version] = true
		if i > 0 {
			prev := k.CUDA[i-1]
			if CompareDriver(prev.Version, c.Version) >= 0 {
				t.Errorf("rows out of order: %s then %s", prev.Version, c.Version)
			}
			if CompareDriver(prev.MinDriverLinux, c.MinDriverLinux) > 0 {
				t.Errorf("driver goes down: %s needs %s, %s needs %s", prev.Version, prev.MinDriverLinux, c.Version, c.MinDriverLinux)
			}
		}
		want := map[string]string{"10": "", "11": "450.80.02", "12": "525.60.13", "13": "580"}[strings.SplitN(c.Version, ".", 2)[0]]
		if c.MinorCompatDriver != want {
			t.Errorf("CUDA %s minor compat %q, want %q", c.Version, c.MinorCompatDriver, want)
		}
	}
}

func FuzzCompareDriver(f *testing.F) {
	for _, s := range []string{"535.129.03", "570.26", "455.32", "12.4", "R535", "", "abc", "1..2", "v12.4.1", "99999999999999999999999.1"} {
		f.Add(s, "535.54.03")
	}
	k := Default()
	f.Fuzz(func(t *testing.T, a, b string) {
		ab, ba := CompareDriver(a, b), CompareDriver(b, a)
		if ab != -ba || ab < -1 || ab > 1 {
			t.Fatalf("CompareDriver(%q,%q)=%d, reverse %d", a, b, ab, ba)
		}
		if CompareDriver(a, a) != 0 {
			t.Fatalf("CompareDriver(%q,%q) != 0", a, a)
		}
		if v := k.MaxCUDAForDriver(a); v != "" {
			c, ok := k.MinDriverForCUDA(v)
			if !ok || CompareDriver(c.MinDriverLinux, a) > 0 {
				t.Fatalf("MaxCUDAForDriver(%q) = %q whose GA needs %s", a, v, c.MinDriverLinux)
			}
		}
		_, _ = k.MinDriverForCUDA(a)
	})
}
