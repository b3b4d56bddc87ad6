package kb

import (
	"slices"
	"testing"
)

func TestToolkitTargets(t *testing.T) {
	k := Default()
	for _, tc := range []struct {
		cuda, cc  string
		ok, known bool
	}{
		{"13.0", "7.0", false, true},  // Volta dropped in 13.0
		{"12.9", "7.0", true, true},   // still in 12.x
		{"13.2", "7.5", true, true},   // Turing stays
		{"11.7", "9.0", false, true},  // Hopper needs 11.8
		{"11.8", "9.0", true, true},   // first toolkit for Hopper
		{"12.4.1", "8.6", true, true}, // patch releases count as their minor
		{"12.0", "3.7", false, true},  // Kepler dropped in 12.0
		{"12.6", "10.0", false, true}, // Blackwell builds start at 12.8
		{"12.8", "12.0", true, true},
		{"12.4", "10.3", false, false}, // no first toolkit in the sources
		{"12.4", "4.2", false, false},  // not in the table
	} {
		ok, known := k.ToolkitTargets(tc.cuda, tc.cc)
		if ok != tc.ok || known != tc.known {
			t.Errorf("ToolkitTargets(%s, %s) = %v, %v; want %v, %v", tc.cuda, tc.cc, ok, known, tc.ok, tc.known)
		}
	}
}

func TestForwardCompatRules(t *testing.T) {
	k := Default()
	dc, ok := k.ForwardCompatFor("datacenter")
	if !ok || !dc.ForwardCompat || !slices.Contains(dc.Brands, "tesla") {
		t.Errorf("datacenter rule %+v", dc)
	}
	for _, c := range []string{"consumer", "workstation"} {
		r, ok := k.ForwardCompatFor(c)
		if !ok || r.ForwardCompat {
			t.Errorf("%s may not use forward compatibility: %+v", c, r)
		}
	}
	cons, _ := k.ForwardCompatFor("consumer")
	if !slices.Contains(cons.Brands, "geforce") {
		t.Errorf("consumer brands %v", cons.Brands)
	}
	// Every GPU class in the catalog has a rule.
	for _, g := range k.GPUs {
		if g.Vendor != "nvidia" {
			continue
		}
		if _, ok := k.ForwardCompatFor(g.Class); !ok {
			t.Errorf("%s: class %q has no forward-compatibility rule", g.Name, g.Class)
		}
	}
	// The compute capabilities of NVIDIA GPUs in the catalog are in the arch table.
	for _, g := range k.GPUs {
		if g.Vendor == "nvidia" && g.ComputeCapability != "" {
			if _, ok := k.CUDAArchInfo(g.ComputeCapability); !ok {
				t.Errorf("%s: compute capability %s not in cuda-arch.yaml", g.Name, g.ComputeCapability)
			}
		}
	}
}

func TestFrameworkBuildFor(t *testing.T) {
	k := Default()
	b, ok := k.FrameworkBuildFor("pytorch", "2.8.0+cu128", "12.8", "")
	if !ok || !slices.Equal(b.Archs, []string{"7.5", "8.0", "8.6", "9.0", "10.0", "12.0"}) || b.PTX != "" {
		t.Errorf("2.8 cu128: %+v", b)
	}
	b, ok = k.FrameworkBuildFor("pytorch", "2.8.1", "12.9", "")
	if !ok || b.PTX != "12.0" || b.Status != "experimental" {
		t.Errorf("2.8 cu129: %+v", b)
	}
	b, ok = k.FrameworkBuildFor("pytorch", "2.14.0", "13.0", "")
	if !ok || b.Archs[0] != "7.5" || b.CuDNN != "9.24.0.43" {
		t.Errorf("2.14 cu130: %+v", b)
	}
	b, ok = k.FrameworkBuildFor("pytorch", "2.6.0", "", "6.2.4")
	if !ok || b.ROCm != "6.2.4" {
		t.Errorf("2.6 rocm: %+v", b)
	}
	if _, ok := k.FrameworkBuildFor("pytorch", "2.80", "12.8", ""); ok {
		t.Error("2.80 matched the 2.8 rows")
	}
	if b, ok := k.FrameworkBuildFor("pytorch", "2.1.0+cu118", "11.8", ""); !ok || len(b.Archs) != 0 {
		t.Errorf("2.1 cu118 has no published arch list in the sources: %+v", b)
	}
}

func TestROCmTables(t *testing.T) {
	k := Default()
	r, ok := k.ROCmFor("6.2.4")
	if !ok || !slices.Contains(r.GFX, "gfx942") || slices.Contains(r.GFX, "gfx906") {
		t.Errorf("6.2.4: %+v", r)
	}
	if r, ok := k.ROCmFor("5.7.1"); !ok || !slices.Contains(r.GFX, "gfx906") || slices.Contains(r.GFX, "gfx942") {
		t.Errorf("5.7.1: %+v", r)
	}
	if _, ok := k.ROCmFor("7.0.1"); ok {
		t.Error("ROCm 7.0 has no table in the sources")
	}
	for mod, want := range map[string]string{"6.3.6": "6.0", "6.14.14": "7.0", "6.16.6": "7.1", "30.10.1": "30.10", "6.8.5": "", "": ""} {
		if got := k.KMDRelease(mod); got != want {
			t.Errorf("KMDRelease(%q) = %q, want %q", mod, got, want)
		}
	}
	us, ok := k.KMDUserspace("6.0")
	if !ok || !slices.Equal(us, []string{"5.6", "5.7", "6.0", "6.1", "6.2"}) {
		t.Errorf("KMD 6.0 user space %v", us)
	}
	if us, _ := k.KMDUserspace("6.4"); !slices.Contains(us, "7.0") || slices.Contains(us, "6.0") {
		t.Errorf("KMD 6.4 user space %v", us)
	}
}

func TestCompatTablesValidate(t *testing.T) {
	k := &KB{ROCmKMD: []ROCmKMD{{KMD: "6.0", Module: "6.3.6", Userspace: []string{"6.0"}, Source: "x"}},
		CUDAArchs: []CUDAArch{{CC: "9.0"}}}
	if err := k.validateCompat(); err == nil {
		t.Error("a row with both module and userspace, and a row without source, passed")
	}
}

// TestCompatTablesLoad: the tables read on first use load and validate
// (a broken file fails here, not in a user's kiln compat run).
func TestCompatTablesLoad(t *testing.T) {
	k := Default()
	if err := k.compat(); err != nil {
		t.Fatal(err)
	}
	if len(k.CUDAArchs) == 0 || len(k.ForwardCompat) == 0 || len(k.Frameworks) == 0 || len(k.ROCm) == 0 || len(k.ROCmKMD) == 0 {
		t.Errorf("empty table: %d %d %d %d %d", len(k.CUDAArchs), len(k.ForwardCompat), len(k.Frameworks), len(k.ROCm), len(k.ROCmKMD))
	}
}
