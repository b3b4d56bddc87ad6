package capture

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

const nvsmiCaptures = "../testdata/captures"

func nvsmiRead(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nvsmiCaptures, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nvsmiFiles lists the files of one capture folder, relative to nvsmiCaptures.
// bundleFolders hold captures that bundle many formats.
var bundleFolders = map[string]bool{"nvidia-bug-report": true, "sosreport": true, "bundle": true}

// checkParses is for captures without a case of their own: they must be
// read without an error (the acceptance test in cmd/kiln holds their
// findings).
func checkParses(t *testing.T, rel string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nvsmiCaptures, rel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseBytes(rel, b); err != nil {
		t.Errorf("%s: %v", rel, err)
	}
}

func nvsmiFiles(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(nvsmiCaptures, dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			out = append(out, dir+"/"+e.Name())
		}
	}
	if len(out) == 0 {
		t.Fatalf("no captures in %s", dir)
	}
	return out
}

func nvsmiGPU(t *testing.T, s *snapshot.Snapshot, addr string) *snapshot.GPU {
	t.Helper()
	for i := range s.GPUs {
		if s.GPUs[i].PCIAddress == addr {
			return &s.GPUs[i]
		}
	}
	t.Fatalf("no GPU %s among %d GPUs", addr, len(s.GPUs))
	return nil
}

func nvsmiReason(t *testing.T, g *snapshot.GPU, name string) snapshot.ThrottleReason {
	t.Helper()
	for _, r := range g.Throttle {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("GPU %s: no throttle reason %q in %+v", g.PCIAddress, name, g.Throttle)
	return snapshot.ThrottleReason{}
}

func nvsmiActive(g *snapshot.GPU) []string {
	var out []string
	for _, r := range g.Throttle {
		if r.Active {
			out = append(out, r.Name)
		}
	}
	return out
}

func nvsmiEqF(p *float64, want float64) bool { return p != nil && *p == want }
func nvsmiEqU(p *uint64, want uint64) bool   { return p != nil && *p == want }
func nvsmiEqB(p *bool, want bool) bool       { return p != nil && *p == want }

var nvsmiSnake = regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)

// nvsmiInvariants holds for anything an nvidia-smi importer returns.
func nvsmiInvariants(t *testing.T, s *snapshot.Snapshot) {
	t.Helper()
	if s == nil {
		t.Fatal("nil snapshot without error")
	}
	for _, c := range s.Claims {
		if c.Count < 0 {
			t.Errorf("negative claim %+v", c)
		}
	}
	for _, g := range s.GPUs {
		if g.Vendor != snapshot.VendorNVIDIA {
			t.Errorf("GPU vendor %q", g.Vendor)
		}
		if g.PCIAddress != "" {
			if c, err := snapshot.CanonicalPCI(g.PCIAddress); err != nil || c != g.PCIAddress {
				t.Errorf("PCI address %q is not canonical", g.PCIAddress)
			}
		}
		if g.Index < 0 || g.Processes < 0 {
			t.Errorf("GPU %s: negative index or process count", g.PCIAddress)
		}
		for _, r := range g.Throttle {
			if !nvsmiSnake.MatchString(r.Name) {
				t.Errorf("throttle reason name %q is not snake_case", r.Name)
			}
		}
		if g.MIG != nil {
			for _, in := range g.MIG.Instances {
				if in.GPUInstance < 0 || in.ComputeInstance < 0 || in.SMs < 0 {
					t.Errorf("negative MIG instance field %+v", in)
				}
			}
		}
		if p := g.PCIe; p != nil {
			if p.CurrentGen < 0 || p.MaxGen < 0 || p.CurrentWidth < 0 || p.MaxWidth < 0 || p.HostMaxGen < 0 {
				t.Errorf("negative PCIe field %+v", p)
			}
		}
	}
}

// TestNvsmiDetectClaimsOnlyItsFormat runs every nvidia-smi detector over
// every capture in the shared set: each must claim exactly its own folders.
func TestNvsmiDetectClaimsOnlyItsFormat(t *testing.T) {
	detectors := map[string]func(string, []byte) bool{
		kindNvsmiQ:       detectNvsmiQ,
		kindNvsmiXML:     detectNvsmiXML,
		kindNvsmiSummary: detectNvsmiSummary,
	}
	owner := map[string]string{
		"nvidia-smi-q":       kindNvsmiQ,
		"nvidia-smi-perf":    kindNvsmiQ,
		"nvidia-smi-q-xml":   kindNvsmiXML,
		"nvidia-smi-summary": kindNvsmiSummary,
	}
	n := 0
	err := filepath.WalkDir(nvsmiCaptures, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(nvsmiCaptures, p)
		folder, _, nested := strings.Cut(filepath.ToSlash(rel), "/")
		if !nested || bundleFolders[folder] {
			// Files at the top describe the set (README, SOURCE-*.md,
			// expected*.json); bundles hold every format and are split
			// before any format's detector sees them.
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		for kind, detect := range detectors {
			want := owner[folder] == kind
			if got := detect(filepath.Base(p), data); got != want {
				t.Errorf("%s: %s detector says %v, want %v", rel, kind, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("walked only %d capture files", n)
	}
}

func TestNvsmiValueForms(t *testing.T) {
	notes := &nvsmiNotes{source: "test"}
	for _, s := range []string{"N/A", "[N/A]", "Not Supported", "[Not Supported]", "[Unknown Error]", "Requested functionality has been deprecated", ""} {
		if v := notes.number(nvVal{s: s}, "x", "W"); v != nil {
			t.Errorf("%q read as %v, want unknown", s, *v)
		}
		if v := notes.flag(nvVal{s: s}, "x"); v != nil {
			t.Errorf("%q read as %v, want unknown", s, *v)
		}
	}
	if len(notes.notes) != 0 {
		t.Errorf("unknown values made notes: %v", notes.notes)
	}
	if v := notes.number(nvVal{s: "71.97 W"}, "x", "W"); !nvsmiEqF(v, 71.97) {
		t.Errorf("71.97 W -> %v", v)
	}
	if v := notes.bytes(nvVal{s: "81559 MiB"}, "x"); !nvsmiEqU(v, 81559<<20) {
		t.Errorf("81559 MiB -> %v", v)
	}
	if hi, lo, ok := notes.pciID(nvVal{s: "0x233010DE"}, "a PCI device id"); !ok || hi != "2330" || lo != "10de" {
		t.Errorf("0x233010DE -> %s %s %v", hi, lo, ok)
	}
	if v := notes.number(nvVal{s: "5x W", at: "line 3 (Max)"}, "a power draw", "W"); v != nil || len(notes.notes) != 1 ||
		notes.notes[0].Message != `line 3 (Max): cannot read "5x W" as a power draw` {
		t.Errorf("bad value: %v, notes %v", v, notes.notes)
	}
	for label, want := range map[string]string{
		"HW Power Brake Slowdown": "hw_power_brake_slowdown",
		"gpu_idle":                "idle",
		"display_clocks_setting":  "display_clock_setting",
		"SW Power Capping":        "sw_power_cap",
		"hw_therm_slowdown":       "hw_thermal_slowdown",
		"Some New Reason":         "some_new_reason",
	} {
		if got := nvsmiReasonName(label); got != want {
			t.Errorf("reason %q -> %q, want %q", label, got, want)
		}
	}
}
