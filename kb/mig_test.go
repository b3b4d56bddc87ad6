package kb

import (
	"reflect"
	"regexp"
	"strconv"
	"testing"
)

// migInstancesFromXML reads the MIG devices of an nvidia-smi -q -x capture:
// the SM count and framebuffer size of each.
func migInstancesFromXML(t *testing.T, rel string) (string, []MIGInstance) {
	t.Helper()
	text := readCapture(t, rel)
	product := between(text, "<product_name>", "</product_name>")
	devRe := regexp.MustCompile(`(?s)<mig_device>.*?<multiprocessor_count>(\d+)</multiprocessor_count>.*?<fb_memory_usage>\s*<total>(\d+) MiB</total>.*?</mig_device>`)
	var out []MIGInstance
	for _, m := range devRe.FindAllStringSubmatch(text, -1) {
		sms, _ := strconv.Atoi(m[1])
		mib, _ := strconv.ParseFloat(m[2], 64)
		out = append(out, MIGInstance{SMs: sms, MemoryMiB: mib})
	}
	return product, out
}

// The A100-SXM4-80GB capture has 4 instances of 14 SMs and 19968 MiB: all 8
// memory slices used, 4 of 7 compute slices, 3 stranded.
func TestMIGStrandedA100Capture(t *testing.T) {
	k := Default()
	product, insts := migInstancesFromXML(t, "nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml")
	if product != "NVIDIA A100-SXM4-80GB" || len(insts) != 4 {
		t.Fatalf("capture: %q with %d MIG devices", product, len(insts))
	}
	for _, in := range insts {
		if in.SMs != 14 || in.MemoryMiB != 19968 {
			t.Fatalf("unexpected instance %+v", in)
		}
	}
	m, ok := k.MIGProfiles(product)
	if !ok || m.Name != "A100-80GB" {
		t.Fatalf("MIGProfiles(%q) = %q, %v", product, m.Name, ok)
	}
	u, err := m.Usage(insts)
	if err != nil {
		t.Fatal(err)
	}
	want := MIGUsage{
		ComputeSlicesTotal: 7, MemorySlicesTotal: 8,
		ComputeSlicesUsed: 4, MemorySlicesUsed: 8,
		ComputeSlicesStranded: 3, Placeable: true,
	}
	got := u
	got.Profiles = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("usage = %+v, want %+v", got, want)
	}
	for _, p := range u.Profiles {
		if p != "1g.20gb" {
			t.Errorf("instance resolved to %s, want 1g.20gb", p)
		}
	}
}

func TestMIGUsageByProfileName(t *testing.T) {
	k := Default()
	named := func(names ...string) []MIGInstance {
		out := make([]MIGInstance, len(names))
		for i, n := range names {
			out[i] = MIGInstance{Profile: n}
		}
		return out
	}
	for _, tc := range []struct {
		model                  string
		insts                  []MIGInstance
		cUsed, mUsed, stranded int
		placeable              bool
	}{
		// mig-parted "all-balanced": 2x1g + 2g + 3g uses 7 compute, 8 memory.
		{"H100-SXM5-80GB", named("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"), 7, 8, 0, true},
		{"NVIDIA A100-SXM4-40GB", named("1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"), 7, 8, 0, true},
		// Nothing used: nothing stranded.
		{"H200-SXM-141GB", nil, 0, 0, 0, true},
		// 7g takes the whole GPU.
		{"B200-180GB", named("7g.180gb"), 7, 8, 0, true},
		// 4g.40gb on slices 0-3 and 3g.40gb on 4-7: full.
		{"A100-SXM4-80GB", named("4g.40gb", "3g.40gb"), 7, 8, 0, true},
		// 3g.40gb at 0 and at 4: memory full, 1 compute slice stranded.
		{"A100-SXM4-80GB", named("3g.40gb", "3g.40gb"), 6, 8, 1, true},
		// Seven 1g.10gb: memory slice 7 free but compute all used.
		{"A100-SXM4-80GB", named("1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"), 7, 7, 0, true},
		// 2g.20gb x3 on 0-5: slices 6-7 free, 1g.20gb fits at 6: nothing stranded.
		{"A100-SXM4-80GB", named("2g.20gb", "2g.20gb", "2g.20gb"), 6, 6, 0, true},
		// Two 4g.40gb cannot both be placed (only start 0).
		{"A100-SXM4-80GB", named("4g.40gb", "4g.40gb"), 8, 8, 0, false},
	} {
		m, ok := k.MIGProfiles(tc.model)
		if !ok {
			t.Fatalf("no MIG geometry for %s", tc.model)
		}
		u, err := m.Usage(tc.insts)
		if err != nil {
			t.Fatalf("%s %v: %v", tc.model, tc.insts, err)
		}
		if u.ComputeSlicesUsed != tc.cUsed || u.MemorySlicesUsed != tc.mUsed || u.ComputeSlicesStranded != tc.stranded || u.Placeable != tc.placeable {
			t.Errorf("%s %v: %+v; want used %d/%d stranded %d placeable %v", tc.model, u.Profiles, u, tc.cUsed, tc.mUsed, tc.stranded, tc.placeable)
		}
	}
}

func TestMIGResolve(t *testing.T) {
	k := Default()
	a80, _ := k.MIGProfiles("A100-SXM4-80GB")
	for _, tc := range []struct {
		in   MIGInstance
		want string
	}{
		{MIGInstance{SMs: 14, MemoryMiB: 19968}, "1g.20gb"},
		{MIGInstance{SMs: 28, MemoryMiB: 19968}, "2g.20gb"},
		{MIGInstance{SMs: 14, MemoryMiB: 9728}, "1g.10gb"},
		{MIGInstance{MemoryMiB: 81000}, "7g.80gb"},
		{MIGInstance{Profile: "3G.40GB"}, "3g.40gb"},
	} {
		p, err := a80.Resolve(tc.in)
		if err != nil || p.Name != tc.want {
			t.Errorf("Resolve(%+v) = %q, %v; want %s", tc.in, p.Name, err, tc.want)
		}
	}
	for _, in := range []MIGInstance{
		{Profile: "1g.5gb"},         // a 40GB profile on the 80GB part
		{},                          // nothing to go on
		{SMs: 14, MemoryMiB: 50000}, // 5 memory slices: no profile
		{SMs: 42, MemoryMiB: 19968}, // 3 compute, 2 memory: no profile
		{SMs: 14, MemoryMiB: -1},    // nonsense
	} {
		if p, err := a80.Resolve(in); err == nil {
			t.Errorf("Resolve(%+v) = %s; want an error", in, p.Name)
		}
	}
	// Without an SM count per slice, 2-slice memory is ambiguous on H100.
	h, _ := k.MIGProfiles("NVIDIA H100 80GB HBM3")
	if p, err := h.Resolve(MIGInstance{SMs: 16, MemoryMiB: 19968}); err == nil {
		t.Errorf("ambiguous H100 instance resolved to %s", p.Name)
	}
	if p, err := h.Resolve(MIGInstance{MemoryMiB: 9984}); err != nil || p.Name != "1g.10gb" {
		t.Errorf("H100 1-slice instance: %q %v", p.Name, err)
	}
	if _, err := a80.Usage([]MIGInstance{{Profile: "nope"}}); err == nil {
		t.Error("Usage with an unknown profile did not fail")
	}
}

func TestMIGProfilesLookup(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ model, want string }{
		{"A100-SXM4-80GB", "A100-80GB"},
		{"NVIDIA A100 80GB PCIe", "A100-80GB"},
		{"A100-SXM4-40GB", "A100-40GB"},
		{"NVIDIA H100 PCIe", "H100-80GB"},
		{"NVIDIA H200", "H200-141GB"},
		{"NVIDIA B200", "B200-180GB"},
	} {
		m, ok := k.MIGProfiles(tc.model)
		if !ok || m.Name != tc.want {
			t.Errorf("MIGProfiles(%q) = %q, %v; want %s", tc.model, m.Name, ok, tc.want)
		}
		if ok && (m.ComputeSlices != 7 || m.MemorySlices != 8 || len(m.Profiles) != 7) {
			t.Errorf("%s: %d/%d slices, %d profiles", m.Name, m.ComputeSlices, m.MemorySlices, len(m.Profiles))
		}
	}
	for _, model := range []string{"NVIDIA L40S", "Tesla T4", "NVIDIA GeForce RTX 4090", "", "AMD Instinct MI300X"} {
		if m, ok := k.MIGProfiles(model); ok {
			t.Errorf("MIGProfiles(%q) = %s; want none", model, m.Name)
		}
	}
	// Every MIG geometry row names GPUs flagged MIG-capable.
	for _, m := range k.MIG {
		for _, n := range m.Models {
			g, ok := k.GPUByName(n)
			if !ok || g.Name != n || !g.MIG {
				t.Errorf("MIG row %s: model %s is not a MIG-capable gpus.yaml row", m.Name, n)
			}
		}
	}
}

func FuzzMIGUsage(f *testing.F) {
	f.Add("A100-SXM4-80GB", "1g.20gb", 14, 19968.0, 4)
	f.Add("H100-SXM5-80GB", "", 16, 9984.0, 7)
	f.Add("H200-SXM-141GB", "7g.141gb", 0, 0.0, 1)
	f.Add("A100-SXM4-40GB", "", -3, -1.0, 9)
	k := Default()
	f.Fuzz(func(t *testing.T, model, profile string, sms int, mib float64, n int) {
		m, ok := k.MIGProfiles(model)
		if !ok {
			return
		}
		if n < 0 {
			n = -n
		}
		n %= 10
		insts := make([]MIGInstance, n)
		for i := range insts {
			insts[i] = MIGInstance{Profile: profile, SMs: sms, MemoryMiB: mib}
		}
		u, err := m.Usage(insts)
		if err != nil {
			return
		}
		if u.ComputeSlicesStranded < 0 || u.ComputeSlicesUsed < 0 || u.MemorySlicesUsed < 0 {
			t.Fatalf("negative counts: %+v", u)
		}
		if u.Placeable && (u.ComputeSlicesUsed > u.ComputeSlicesTotal || u.MemorySlicesUsed > u.MemorySlicesTotal) {
			t.Fatalf("placeable but over the GPU: %+v", u)
		}
		if u.ComputeSlicesStranded > u.ComputeSlicesTotal-min(u.ComputeSlicesUsed, u.ComputeSlicesTotal) {
			t.Fatalf("more stranded than free: %+v", u)
		}
	})
}
