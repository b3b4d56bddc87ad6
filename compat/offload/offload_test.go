package offload

import (
	"slices"
	"testing"
)

func TestParseTarget(t *testing.T) {
	cases := []struct {
		in   string
		want Target
	}{
		{"gfx90a", Target{Processor: "gfx90a"}},
		{"gfx90a:xnack-", Target{Processor: "gfx90a", Features: "xnack-"}},
		// Non-canonical order comes back canonical.
		{"gfx90a:xnack-:sramecc+", Target{Processor: "gfx90a", Features: "sramecc+:xnack-"}},
		{"gfx10-3-generic", Target{Processor: "gfx10-3-generic"}},
		// Code object V2/V3 bundle ids list the features that are on.
		{"gfx906+xnack", Target{Processor: "gfx906", Features: "xnack+"}},
		{"gfx906+xnack+sramecc", Target{Processor: "gfx906", Features: "sramecc+:xnack+"}},
		// rocminfo's ISA names.
		{"amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-", Target{Triple: TripleAMDHSA, Processor: "gfx90a", Features: "sramecc+:xnack-"}},
		{"amdgcn-amd-amdhsa--gfx1100", Target{Triple: TripleAMDHSA, Processor: "gfx1100"}},
		// Bundle entry ids.
		{"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-", Target{Kind: "hipv4", Triple: TripleAMDHSA, Processor: "gfx90a", Features: "xnack-"}},
		{"hip-amdgcn-amd-amdhsa-gfx906", Target{Kind: "hip", Triple: TripleAMDHSA, Processor: "gfx906"}},
		{"openmp-amdgcn-amd-amdhsa--gfx90a", Target{Kind: "openmp", Triple: TripleAMDHSA, Processor: "gfx90a"}},
		{"hipv4-amdgcn-amd-amdhsa--gfx11-generic", Target{Kind: "hipv4", Triple: TripleAMDHSA, Processor: "gfx11-generic"}},
		{"hipv4-amdgcn-amd-amdhsa-unknown-gfx942:sramecc+", Target{Kind: "hipv4", Triple: TripleAMDHSA, Processor: "gfx942", Features: "sramecc+"}},
	}
	for _, c := range cases {
		got, err := ParseTarget(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	if got, _ := ParseTarget("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-:sramecc+"); got.Name() != "gfx90a:sramecc+:xnack-" {
		t.Errorf("Name = %q", got.Name())
	}

	for _, bad := range []string{
		"", "gfx", "gfxzzz", "gfx90a:", "gfx90a:xnack", "gfx90a:xnack*", "gfx90a:xnack+:xnack-",
		"gfx90a::xnack+", "gfx90a+", "gfx9-", "gfx9--generic", "GFX90A", "gfx90a xnack+",
		"host-x86_64-unknown-linux-gnu-",              // a host entry names no GPU
		"hip-nvptx64-nvidia-cuda-sm_70",               // not AMD
		"hipv4-amdgcn-amd-amdhsa--",                   // no processor
		"hipv4-amdgcn-amd",                            // short triple
		"hipv4-amdgcn-amd-amdhsa--sm_80",              // not a gfx processor
		"Hip-amdgcn-amd-amdhsa--gfx90a",               // kind is not a word
		"amdgcn",                                      // bare arch
		"hipv4-amdgcn-amd-amd hsa--gfx90a",            // space
		"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-\x00",  // NUL
		"hipv4-amdgcn-amd-amdhsa-env!-gfx90a:xnack-",  // junk environment
		"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-:junk", // feature without a setting
	} {
		if got, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) = %+v, want an error", bad, got)
		}
	}
}

func TestTargetFromFlags(t *testing.T) {
	cases := []struct {
		name        string
		class, abi  uint8
		flags       uint32
		want        string
		wantGeneric int
	}{
		// llc -mcpu=gfx90a -mattr=-xnack (code object V4): 0x63f.
		{"gfx90a xnack- sramecc any", 2, abiVersionV4, 0x63f, "gfx90a:xnack-", 0},
		{"gfx90a both any", 2, abiVersionV4, 0x53f, "gfx90a", 0},
		{"gfx90a both set", 2, 3, 0xf3f, "gfx90a:sramecc+:xnack+", 0},
		{"gfx942 sramecc+ xnack-", 2, 3, 0xe4c, "gfx942:sramecc+:xnack-", 0},
		{"gfx1100 unsupported", 2, 3, 0x041, "gfx1100", 0},
		{"gfx1201", 2, abiVersionV6, 0x04e, "gfx1201", 0},
		{"gfx11-generic v1", 2, abiVersionV6, 0x01000054, "gfx11-generic", 1},
		{"gfx9-4-generic v2 sramecc-", 2, abiVersionV6, 0x0200095f, "gfx9-4-generic:sramecc-", 2},
		{"gfx10-1-generic xnack+", 2, abiVersionV6, 0x01000352, "gfx10-1-generic:xnack+", 1},
		// Code object V3: a feature the processor supports is off unless
		// its bit is set.
		{"v3 gfx906 xnack on", 2, abiVersionV3, 0x12f, "gfx906:sramecc-:xnack+", 0},
		{"v3 gfx908 none", 2, abiVersionV3, 0x030, "gfx908:sramecc-:xnack-", 0},
		{"v3 gfx1030", 2, abiVersionV3, 0x036, "gfx1030", 0},
		// Unknown and reserved values are not guessed.
		{"reserved 0x49", 2, 3, 0x049, "unknown-mach-0x49", 0},
		{"none", 2, 3, 0x000, "unknown-mach-0x00", 0},
		{"r600", 1, 0, 0x001, "unknown-mach-0x01", 0},
	}
	for _, c := range cases {
		got, gv := TargetFromFlags(c.class, osABIAMDGPUHSA, c.abi, c.flags)
		if got.Name() != c.want || gv != c.wantGeneric || got.Kind != KindCodeObject {
			t.Errorf("%s: TargetFromFlags(0x%x) = %+v (%q) generic %d; want %q generic %d", c.name, c.flags, got, got.Name(), gv, c.want, c.wantGeneric)
		}
	}
	if got, _ := TargetFromFlags(2, osABIAMDGPUHSA, 3, 0x63f); got.Triple != TripleAMDHSA {
		t.Errorf("triple %q", got.Triple)
	}
	// Other OS ABIs: the processor only.
	if got, _ := TargetFromFlags(2, osABIAMDGPUPAL, 0, 0x73f); got.Name() != "gfx90a" || got.Triple != "amdgcn-amd-amdpal" {
		t.Errorf("amdpal: %+v", got)
	}
}

func TestMachTable(t *testing.T) {
	seen := map[uint8]bool{}
	for _, m := range machs {
		if seen[m.value] {
			t.Errorf("value 0x%02x twice", m.value)
		}
		seen[m.value] = true
		if !isProcessor(m.name) {
			t.Errorf("%q is not a processor name", m.name)
		}
		if ProcessorName(m.value) != m.name {
			t.Errorf("ProcessorName(0x%02x) = %q", m.value, ProcessorName(m.value))
		}
	}
	// Spot checks against AMDGPUUsage's EF_AMDGPU_MACH table.
	for v, n := range map[uint8]string{0x22: "gfx700", 0x2f: "gfx906", 0x3f: "gfx90a", 0x4c: "gfx942", 0x4f: "gfx950",
		0x36: "gfx1030", 0x41: "gfx1100", 0x4a: "gfx1151", 0x48: "gfx1200", 0x4e: "gfx1201",
		0x51: "gfx9-generic", 0x52: "gfx10-1-generic", 0x53: "gfx10-3-generic", 0x54: "gfx11-generic", 0x59: "gfx12-generic", 0x5f: "gfx9-4-generic"} {
		if got := ProcessorName(v); got != n {
			t.Errorf("ProcessorName(0x%02x) = %q, want %q", v, got, n)
		}
	}
	for g, members := range genericMembers {
		if !KnownProcessor(g) || !IsGeneric(g) {
			t.Errorf("%s not in the table", g)
		}
		for _, m := range members {
			if !KnownProcessor(m) || IsGeneric(m) {
				t.Errorf("%s member %s not a known specific processor", g, m)
			}
		}
	}
	if !slices.Equal(GenericMembers("gfx12-generic"), []string{"gfx1200", "gfx1201"}) || GenericMembers("gfx90a") != nil {
		t.Error("GenericMembers")
	}
}

func TestTargetFromName(t *testing.T) {
	cases := []struct {
		base string
		want string // "" for false
	}{
		{"TensileLibrary_gfx90a.co", "gfx90a"},
		{"TensileLibrary_lazy_gfx90a.dat", "gfx90a"},
		{"TensileLibrary_Type_HH_Contraction_l_Ailk_Bljk_Cijk_Dijk_gfx942.co", "gfx942"},
		{"TensileLibrary_Type_SS_Contraction_l_Alik_Bljk_Cijk_Dijk_fallback_gfx1030.hsaco", "gfx1030"},
		{"Kernels.so-000-gfx90a-xnack-.hsaco", "gfx90a:xnack-"},
		{"Kernels.so-000-gfx90a-xnack+.hsaco", "gfx90a:xnack+"},
		{"Kernels.so-000-gfx942.hsaco", "gfx942"},
		{"extop_gfx1100.co", "gfx1100"},
		{"hipblasltTransform_gfx942_sramecc+_xnack-.hsaco", "gfx942:sramecc+:xnack-"},
		{"rocfft_kernel_cache_gfx1030.dat", "gfx1030"},
		{"TensileManifest_gfx1030.dat", "gfx1030"},
		{"TensileLibrary_gfx11-generic.co", "gfx11-generic"},
		// MIOpen kernel databases append the CU count.
		{"gfx90a68.kdb", "gfx90a"},
		{"gfx90a6e.kdb", ""}, // the CU count is a number
		{"gfx1030_36.kdb", "gfx1030"},
		{"gfx942130.kdb", "gfx942"},
		{"gfx90878.kdb", "gfx908"},
		{"gfx110048.kdb", "gfx1100"},
		{"gfx1201.kdb", "gfx1201"},
		// Negatives.
		{"libgfx.so", ""},
		{"gfxinfo.txt", ""},
		{"gfx.dat", ""},
		{"gfx9.dat", ""},
		{"gfx999.co", ""},
		{"gfx1.co", ""},
		{"mygfx90a.co", ""}, // "gfx" inside a word
		{"libamdhip64.so", ""},
		{"gfx90zz.co", ""},
		{"", ""},
	}
	for _, c := range cases {
		got, ok := TargetFromName(c.base)
		if c.want == "" {
			if ok {
				t.Errorf("TargetFromName(%q) = %+v, want false", c.base, got)
			}
			continue
		}
		if !ok || got.Name() != c.want || got.Kind != KindName || got.Triple != TripleAMDHSA {
			t.Errorf("TargetFromName(%q) = %+v %v, want %q", c.base, got, ok, c.want)
		}
	}
}

func TestMatches(t *testing.T) {
	cases := []struct {
		code, gpu   string
		ok, certain bool
		rule        string
	}{
		{"gfx90a", "gfx90a:sramecc+:xnack-", true, true, "same processor, features any (ClangOffloadBundler: Target ID compatibility)"},
		{"gfx90a", "gfx90a", true, true, "same processor, no feature set: nothing depends on the node"},
		{"gfx90a", "gfx942:sramecc+:xnack-", false, true, "processors differ"},
		{"gfx908", "gfx90a", false, true, "processors differ even in one family"},
		{"gfx90a:xnack-", "gfx90a:sramecc+:xnack-", true, true, "xnack set off, GPU off: equal"},
		{"gfx90a:xnack+", "gfx90a:sramecc+:xnack-", false, true, "xnack set on, GPU off: must be equal (AMDGPUUsage: Target Features)"},
		{"gfx90a:sramecc-:xnack-", "gfx90a:sramecc+:xnack-", false, true, "sramecc set off, GPU on"},
		{"gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack-", true, true, "both set, both equal"},
		{"gfx90a:xnack+", "gfx90a", true, false, "xnack set but the GPU's setting is unknown: depends on the node"},
		{"gfx90a:xnack+", "gfx90a:sramecc+", true, false, "the GPU string has no xnack setting"},
		{"gfx90a:xnack-", "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-", true, true, "rocminfo's ISA name with the triple"},
		{"gfx1030:xnack-", "gfx1030", false, true, "xnack set on a processor without xnack: the loader sees unsupported"},
		{"gfx9-generic", "gfx906:sramecc+:xnack-", true, true, "generic target, member (AMDGPUUsage: Generic Processors)"},
		{"gfx9-generic", "gfx90a:sramecc+:xnack-", false, true, "gfx90a is not in gfx9-generic"},
		{"gfx9-generic:xnack-", "gfx900:xnack-", true, true, "generic target with a feature, equal"},
		{"gfx9-generic:xnack+", "gfx900:xnack-", false, true, "generic target with a feature, different"},
		{"gfx9-4-generic", "gfx942:sramecc+:xnack-", true, true, "gfx9-4-generic runs on gfx942"},
		{"gfx9-4-generic:sramecc+", "gfx950", true, false, "gfx9-4-generic member, sramecc setting unknown"},
		{"gfx9-4-generic", "gfx90a:sramecc+:xnack-", false, true, "gfx90a is not in gfx9-4-generic"},
		{"gfx10-1-generic", "gfx1013:xnack-", true, true, "gfx10-1-generic = gfx1010..gfx1013"},
		{"gfx10-3-generic", "gfx1036", true, true, "gfx10-3-generic = gfx1030..gfx1036"},
		{"gfx10-3-generic", "gfx1100", false, true, "gfx1100 is not in gfx10-3-generic"},
		{"gfx11-generic", "gfx1151", true, true, "gfx11-generic includes gfx1150, gfx1151"},
		{"gfx11-generic", "gfx1201", false, true, "gfx1201 is gfx12"},
		{"gfx12-generic", "gfx1201", true, true, "gfx12-generic = gfx1200, gfx1201"},
		{"gfx1100", "gfx11-generic", false, true, "a specific code object does not run on a generic name"},
		{"gfx90a", "not a gpu", false, false, "unreadable GPU string"},
	}
	for _, c := range cases {
		code, err := ParseTarget(c.code)
		if err != nil {
			t.Fatal(err)
		}
		ok, certain := Matches(code, c.gpu)
		if ok != c.ok || certain != c.certain {
			t.Errorf("Matches(%q, %q) = %v, %v; want %v, %v (%s)", c.code, c.gpu, ok, certain, c.ok, c.certain, c.rule)
		}
	}
	// A code object read from a file name or e_flags matches the same way.
	tgt, _ := TargetFromFlags(2, osABIAMDGPUHSA, 3, 0x63f) // gfx90a:xnack-
	if ok, certain := Matches(tgt, "gfx90a:sramecc-:xnack-"); !ok || !certain {
		t.Error("e_flags target")
	}
	if ok, _ := Matches(Target{Processor: "unknown-mach-0x49"}, "gfx90a"); ok {
		t.Error("unknown processor matched")
	}
}

func TestResultOrder(t *testing.T) {
	var r Result
	for _, s := range []string{"hipv4-amdgcn-amd-amdhsa--gfx942", "openmp-amdgcn-amd-amdhsa--gfx90a", "hipv4-amdgcn-amd-amdhsa--gfx90a", "hip-amdgcn-amd-amdhsa--gfx1030", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"} {
		tg, err := ParseTarget(s)
		if err != nil {
			t.Fatal(err)
		}
		r.addTarget(tg)
	}
	if got := r.String(); got != "gfx1030 gfx90a gfx90a:xnack- gfx942" {
		t.Errorf("targets %q", got)
	}
	// Of two targets with one name the smaller kind stays.
	if r.Targets[1].Kind != "hipv4" {
		t.Errorf("kept %+v", r.Targets[1])
	}
	if (&Result{}).Empty() != true || (*Result)(nil).Empty() != true || r.Empty() {
		t.Error("Empty")
	}
}
