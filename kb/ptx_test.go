package kb

import (
	"strings"
	"testing"
)

func TestPTXTableLoads(t *testing.T) {
	k := Default()
	rows, err := k.PTXISAs()
	if err != nil {
		t.Fatal(err)
	}
	targets, err := k.PTXTargets()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < 29 || len(targets) < 15 {
		t.Fatalf("ptx tables too small: %d isa rows, %d targets", len(rows), len(targets))
	}
	// Oldest first, no version twice, every row sourced.
	for i, r := range rows {
		if strings.TrimSpace(r.Source) == "" {
			t.Errorf("ptx %s has no source", r.ISA)
		}
		if i > 0 && CompareDriver(rows[i-1].ISA, r.ISA) >= 0 {
			t.Errorf("ptx rows out of order at %s", r.ISA)
		}
		if i > 0 && CompareDriver(rows[i-1].CUDA, r.CUDA) >= 0 {
			t.Errorf("ptx %s: CUDA %s is not newer than the previous row's %s", r.ISA, r.CUDA, rows[i-1].CUDA)
		}
	}
	for _, tg := range targets {
		if strings.TrimSpace(tg.Source) == "" {
			t.Errorf("target %s has no source", tg.Target)
		}
	}
}

// The loader refuses rows without a source, unreadable versions and rule
// sets without a rule; each case breaks one thing in a valid table.
func TestPTXValidate(t *testing.T) {
	valid := func() ptxDoc {
		d := ptxDoc{
			ISA:     []PTXISA{{ISA: "8.0", CUDA: "12.0", Source: "s"}, {ISA: "8.8", CUDA: "12.9", Source: "s"}},
			Targets: []PTXTarget{{Target: "sm_90a", ISA: "8.0", Source: "s"}, {Target: "sm_100f", ISA: "8.8", Family: []string{"10.0", "10.3"}, Source: "s"}},
			Tegra:   ptxTegra{CC: []string{"8.7"}, Source: "s"},
		}
		for _, id := range []string{ruleSASS, ruleSASSTegra, rulePTX, ruleArch, ruleFamily, rulePTXDriver} {
			d.Rules = append(d.Rules, PTXRule{ID: id, Text: "t", Source: "s"})
		}
		return d
	}
	if d := valid(); d.validate() != nil {
		t.Fatalf("the valid table is refused: %v", d.validate())
	}
	for name, breakIt := range map[string]func(*ptxDoc){
		"isa without source":   func(d *ptxDoc) { d.ISA[0].Source = "" },
		"isa not a version":    func(d *ptxDoc) { d.ISA[0].ISA = "eight" },
		"plain target":         func(d *ptxDoc) { d.Targets[0].Target = "sm_90" },
		"target without isa":   func(d *ptxDoc) { d.Targets[0].ISA = "" },
		"target isa unknown":   func(d *ptxDoc) { d.Targets[0].ISA = "7.9" },
		"a target with family": func(d *ptxDoc) { d.Targets[0].Family = []string{"9.0"} },
		"family not a cc":      func(d *ptxDoc) { d.Targets[1].Family = []string{"ten"} },
		"tegra without source": func(d *ptxDoc) { d.Tegra.Source = "" },
		"rule without source":  func(d *ptxDoc) { d.Rules[0].Source = "" },
		"rule missing":         func(d *ptxDoc) { d.Rules = d.Rules[1:] },
	} {
		d := valid()
		breakIt(&d)
		if err := d.validate(); err == nil {
			t.Errorf("%s: validate accepted the table", name)
		}
	}
}

// The ISA -> CUDA release mapping of the PTX ISA document's release history
// (PTX ISA 9.4, Table 71), including its gaps: 12.5 and 12.6 both emit 8.5,
// 8.6 belongs to the never-shipped 12.7, 12.8 is 8.7.
func TestPTXISARows(t *testing.T) {
	k := Default()
	want := map[string]string{
		"6.0": "9.0", "6.3": "10.0", "6.5": "10.2", "7.0": "11.0", "7.1": "11.1", "7.8": "11.8",
		"8.0": "12.0", "8.4": "12.4", "8.5": "12.5", "8.6": "12.7", "8.7": "12.8", "8.8": "12.9",
		"9.0": "13.0", "9.1": "13.1", "9.2": "13.2", "9.3": "13.3", "9.4": "13.4",
	}
	for isa, cuda := range want {
		r, ok := k.PTXISA(isa)
		if !ok || r.CUDA != cuda {
			t.Errorf("PTXISA(%s) = %+v, %v; want CUDA %s", isa, r, ok, cuda)
		}
	}
	if r, _ := k.PTXISA("8.5"); len(r.AlsoCUDA) != 1 || r.AlsoCUDA[0] != "12.6" {
		t.Errorf("8.5 is also CUDA 12.6's version: %+v", r)
	}
	for _, isa := range []string{"", "5.0", "8.9", "10.0", "x"} {
		if r, ok := k.PTXISA(isa); ok {
			t.Errorf("PTXISA(%q) = %+v; want none", isa, r)
		}
	}
}

// PTX JIT needs the toolkit driver of the release that introduced the ISA
// version (CUDA Compatibility guide: minor-version compatibility does not
// cover PTX; an older driver fails with cudaErrorUnsupportedPtxVersion).
func TestMinDriverForPTX(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ isa, driver, cuda string }{
		{"7.8", "520.61.05", "11.8"}, // CUDA 11.8's toolkit driver, not the 11.x floor 450.80.02
		{"7.0", "450.51.05", "11.0.2"},
		{"8.2", "535.54.03", "12.2"},
		{"8.5", "555.42.02", "12.5"},
		{"8.7", "570.26", "12.8"},
		{"9.0", "580.65.06", "13.0"},
		{"9.3", "610", "13.3"}, // cuda.yaml's branch floor
		{"8.6", "565", "12.7"}, // no cuda.yaml row: the PTX document's driver branch
		{"6.0", "384", "9.0"},
	} {
		d, c, ok := k.MinDriverForPTX(tc.isa)
		if !ok || d != tc.driver || c != tc.cuda {
			t.Errorf("MinDriverForPTX(%s) = %s, %s, %v; want %s, %s", tc.isa, d, c, ok, tc.driver, tc.cuda)
		}
		// The driver is cuda.yaml's value where cuda.yaml has the release.
		if rel, found := k.MinDriverForCUDA(tc.cuda); found && rel.MinDriverLinux != d {
			t.Errorf("%s: %s is not cuda.yaml's %s", tc.isa, d, rel.MinDriverLinux)
		}
	}
	if _, _, ok := k.MinDriverForPTX("4.3"); ok {
		t.Error("unknown ISA version found a driver")
	}
	// Every row resolves to a driver.
	rows, _ := k.PTXISAs()
	for _, r := range rows {
		if _, _, ok := k.MinDriverForPTX(r.ISA); !ok {
			t.Errorf("ptx %s (CUDA %s): no driver in cuda.yaml and no driver_branch", r.ISA, r.CUDA)
		}
		if r.DriverBranch != "" {
			if _, found := k.MinDriverForCUDA(r.CUDA); found {
				t.Errorf("ptx %s restates a driver cuda.yaml has for CUDA %s", r.ISA, r.CUDA)
			}
		}
	}
}

func TestPTXISAForCUDA(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ cuda, isa string }{
		{"12.5", "8.5"}, {"12.6", "8.5"}, {"12.6.3", "8.5"}, {"12.8.1", "8.7"}, {"11.8", "7.8"}, {"13.0", "9.0"}, {"9.2", "6.2"},
	} {
		if got, ok := k.PTXISAForCUDA(tc.cuda); !ok || got != tc.isa {
			t.Errorf("PTXISAForCUDA(%s) = %s, %v; want %s", tc.cuda, got, ok, tc.isa)
		}
	}
	for _, c := range []string{"", "8.0", "12.10", "x"} {
		if got, ok := k.PTXISAForCUDA(c); ok {
			t.Errorf("PTXISAForCUDA(%q) = %s; want none", c, got)
		}
	}
	r := k.PTXDriverRule()
	if !strings.Contains(r, "cudaErrorUnsupportedPtxVersion") || !strings.Contains(r, "Minor Version Compatibility") {
		t.Errorf("PTXDriverRule() = %q", r)
	}
}

func TestMaxPTXForDriver(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ driver, isa string }{
		{"535.104.05", "8.2"}, // 12.2 Update 2's driver; 12.3 needs 545.23.06
		{"535.54.03", "8.2"},
		{"535.54.02", "8.1"},
		{"520.61.05", "7.8"},
		{"560.35.03", "8.5"}, // CUDA 12.6 still emits 8.5
		{"565.57.01", "8.6"}, // r565 per the PTX document
		{"570.26", "8.7"},
		{"575.57.08", "8.8"},
		{"580.65.06", "9.0"},
		{"580.65.05", "8.8"},
		{"610.43.02", "9.3"},
		{"615.1", "9.4"},
		{"384.81", "6.0"},
	} {
		got, ok := k.MaxPTXForDriver(tc.driver)
		if !ok || got != tc.isa {
			t.Errorf("MaxPTXForDriver(%s) = %s, %v; want %s", tc.driver, got, ok, tc.isa)
		}
	}
	for _, d := range []string{"", "  ", "375.26", "300"} {
		if got, ok := k.MaxPTXForDriver(d); ok {
			t.Errorf("MaxPTXForDriver(%q) = %s; want none (older than every row)", d, got)
		}
	}
}

func TestSASSRunsOn(t *testing.T) {
	for _, tc := range []struct {
		target, cc string
		ok, known  bool
		rule       string // a phrase of the cited rule
	}{
		// A cubin for X.y runs on X.z, z >= y (Programming Guide, Binary Compatibility).
		{"sm_80", "8.6", true, true, "Binary Compatibility"},
		{"sm_86", "8.9", true, true, "Binary Compatibility"},
		{"sm_86", "8.0", false, true, "Binary Compatibility"}, // not to a lower minor
		{"sm_80", "9.0", false, true, "Binary Compatibility"}, // not across majors
		{"sm_90", "10.0", false, true, "Binary Compatibility"},
		{"sm_100", "10.3", true, true, "Binary Compatibility"},
		{"sm_120", "12.1", true, true, "Binary Compatibility"},
		{"sm_80", "8.0", true, true, "Binary Compatibility"},
		// Not among Tegra GPUs nor between Tegra and desktop (note in the same section).
		{"sm_80", "8.7", false, true, "Tegra"},
		{"sm_87", "8.9", false, true, "Tegra"},
		{"sm_87", "8.7", true, true, "Binary Compatibility"},
		// Architecture-specific: only that exact capability (5.1.2.1).
		{"sm_90a", "9.0", true, true, "5.1.2.1"},
		{"sm_90a", "10.0", false, true, "5.1.2.1"},
		{"sm_100a", "10.3", false, true, "5.1.2.1"},
		{"sm_100a", "10.0", true, true, "5.1.2.1"},
		{"sm_120a", "12.1", false, true, "5.1.2.1"},
		// Family-specific: the family's members (Table 28).
		{"sm_100f", "10.3", true, true, "Table 28"},
		{"sm_100f", "10.0", true, true, "Table 28"},
		{"sm_100f", "10.7", true, true, "Table 28"},
		{"sm_100f", "11.0", false, true, "Table 28"},
		{"sm_100f", "12.0", false, true, "Table 28"},
		{"sm_103f", "10.0", false, true, "Table 28"},
		{"sm_120f", "12.1", true, true, "Table 28"},
		{"sm_121f", "12.0", false, true, "Table 28"},
		{"sm_110f", "11.0", true, true, "Table 28"},
		// Unknown targets and capabilities.
		{"sm_80a", "8.0", false, false, ""},   // no such target: a targets start at 9.0
		{"sm_90f", "9.0", false, false, ""},   // no such target
		{"sm_101f", "10.1", false, false, ""}, // exists, family members in no source read
		{"sm_xyz", "8.0", false, false, ""},
		{"", "8.0", false, false, ""},
		{"sm_80", "eight", false, false, ""},
		{"sm_80", "", false, false, ""},
	} {
		ok, rule, known := SASSRunsOn(tc.target, tc.cc)
		if ok != tc.ok || known != tc.known || !strings.Contains(rule, tc.rule) {
			t.Errorf("SASSRunsOn(%q, %q) = %v, %q, %v; want %v, ~%q, %v", tc.target, tc.cc, ok, rule, known, tc.ok, tc.rule, tc.known)
		}
		if known && !strings.Contains(rule, tc.target) {
			t.Errorf("SASSRunsOn(%q, %q): rule %q does not name the target", tc.target, tc.cc, rule)
		}
	}
}

func TestPTXRunsOn(t *testing.T) {
	for _, tc := range []struct {
		target, cc string
		ok, known  bool
		rule       string
	}{
		// Plain PTX JIT-compiles for any capability at or above it (PTX Compatibility).
		{"compute_80", "9.0", true, true, "PTX Compatibility"},
		{"compute_80", "8.6", true, true, "PTX Compatibility"},
		{"compute_80", "12.0", true, true, "PTX Compatibility"},
		{"compute_86", "8.0", false, true, "PTX Compatibility"},
		{"compute_90", "8.9", false, true, "PTX Compatibility"},
		{"compute_80", "8.7", true, true, "PTX Compatibility"}, // no Tegra exception for PTX
		{"sm_75", "10.0", true, true, "PTX Compatibility"},     // prefixes are interchangeable
		// Architecture-specific PTX: exact capability only.
		{"compute_90a", "9.0", true, true, "5.1.2.1"},
		{"compute_90a", "10.0", false, true, "5.1.2.1"},
		{"compute_100a", "10.3", false, true, "5.1.2.1"},
		// Family PTX: the family.
		{"compute_100f", "10.3", true, true, "Table 28"},
		{"compute_100f", "12.0", false, true, "Table 28"},
		{"compute_120f", "12.1", true, true, "Table 28"},
		{"compute_99a", "9.9", false, false, ""},
		{"compute_", "9.0", false, false, ""},
		{"compute_1000", "9.0", false, false, ""},
	} {
		ok, rule, known := PTXRunsOn(tc.target, tc.cc)
		if ok != tc.ok || known != tc.known || !strings.Contains(rule, tc.rule) {
			t.Errorf("PTXRunsOn(%q, %q) = %v, %q, %v; want %v, ~%q, %v", tc.target, tc.cc, ok, rule, known, tc.ok, tc.rule, tc.known)
		}
	}
}

// A KB built in memory has no PTX tables: every answer is unknown.
func TestPTXEmptyKB(t *testing.T) {
	k := &KB{}
	if ok, _, known := k.SASSRunsOn("sm_80", "8.6"); ok || known {
		t.Error("empty KB answered SASSRunsOn")
	}
	if _, ok := k.MaxPTXForDriver("580.65.06"); ok {
		t.Error("empty KB answered MaxPTXForDriver")
	}
	if _, _, ok := k.MinDriverForPTX("8.0"); ok {
		t.Error("empty KB answered MinDriverForPTX")
	}
}

func TestTargetFirstCUDA(t *testing.T) {
	k := Default()
	for _, tc := range []struct{ target, cuda string }{
		{"sm_90a", "12.0"},
		{"compute_90a", "12.0"},
		{"sm_100a", "12.8"}, // PTX ISA 8.6 belongs to CUDA 12.7, which never shipped
		{"sm_120a", "12.8"},
		{"sm_100f", "12.9"}, // family targets came with CUDA 12.9
		{"sm_103a", "12.9"},
		{"sm_121f", "12.9"},
		{"sm_110f", "13.0"},
		{"sm_107a", "13.4"},
	} {
		got, ok := k.TargetFirstCUDA(tc.target)
		if !ok || got != tc.cuda {
			t.Errorf("TargetFirstCUDA(%s) = %s, %v; want %s", tc.target, got, ok, tc.cuda)
		}
	}
	for _, tg := range []string{"sm_80", "sm_90f", "x"} {
		if got, ok := k.TargetFirstCUDA(tg); ok {
			t.Errorf("TargetFirstCUDA(%s) = %s; want none", tg, got)
		}
	}
	if r, ok := k.PTXTargetInfo("sm_101a"); !ok || r.LastISA != "8.8" {
		t.Errorf("sm_101a was dropped after PTX ISA 8.8 (renamed sm_110a): %+v", r)
	}
}
