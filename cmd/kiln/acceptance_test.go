package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/snapshot"
)

// capturesDir holds real machines' captures and expected.json, copied with
// their sources (see SOURCE.md there).
const capturesDir = "../../testdata/captures"

type expectation struct {
	ID       string   `json:"id"`
	Severity string   `json:"severity"`
	Devices  []string `json:"devices"`
	Code     int      `json:"code"`
	Note     string   `json:"note"`
}

type expectedFile struct {
	GPUs    *int          `json:"gpus"`
	Expect  []expectation `json:"expect"`
	MustNot []expectation `json:"must_not"`
}

// loadExpected reads expected.json (the shared set) and every
// expected-*.json beside it (the corpus kiln grew from public sources, see
// SOURCE-*.md): one map of capture path to expectations.
func loadExpected(t *testing.T) map[string]expectedFile {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(capturesDir, "expected*.json"))
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]expectedFile{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Files map[string]expectedFile `json:"files"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		for k, v := range doc.Files {
			if _, dup := all[k]; dup {
				t.Fatalf("%s: %s is listed in two expectation files", n, k)
			}
			if _, err := os.Stat(filepath.Join(capturesDir, filepath.FromSlash(k))); err != nil {
				t.Fatalf("%s: %s: %v", n, k, err)
			}
			all[k] = v
		}
	}
	if len(all) < 20 {
		t.Fatalf("the expectation files list only %d captures", len(all))
	}
	return all
}

// kiln runs the command line in-process and returns stdout and the exit code.
func kiln(t *testing.T, args ...string) ([]byte, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return out.Bytes(), errb.String(), code
}

// TestDoctorOnCaptures is the acceptance test: for every real capture,
// `kiln doctor --from FILE -o json` reports what expected.json lists (by id,
// severity and device), nothing its must_not lists, and no critical finding
// it does not list.
func TestDoctorOnCaptures(t *testing.T) {
	files := loadExpected(t)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		exp := files[name]
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(capturesDir, filepath.FromSlash(name))
			out, stderr, code := kiln(t, "doctor", "--from", path, "-o", "json")
			if code == doctor.ExitCannot {
				t.Fatalf("kiln doctor exit %d: %s", code, stderr)
			}
			var rep doctor.Report
			if err := json.Unmarshal(out, &rep); err != nil {
				t.Fatalf("doctor -o json: %v\n%s", err, out)
			}
			checkExpectations(t, rep.Findings, exp)
			if want := wantExit(rep.Findings); code != want {
				t.Errorf("exit code %d, want %d for its findings", code, want)
			}
		})
	}
}

func wantExit(fs []doctor.Finding) int {
	code := 0
	for _, f := range fs {
		if f.Severity == doctor.Critical {
			return 2
		}
		if f.Severity == doctor.Warning {
			code = 1
		}
	}
	return code
}

func checkExpectations(t *testing.T, got []doctor.Finding, exp expectedFile) {
	t.Helper()
	for _, e := range exp.Expect {
		covered := map[string]bool{}
		found := false
		for _, f := range got {
			if f.ID != e.ID || f.Severity.String() != e.Severity || (e.Code != 0 && f.Code != e.Code) {
				continue
			}
			found = true
			for _, d := range f.Devices {
				covered[d] = true
			}
		}
		// Critical and warning findings are required; an info one that
		// is missing is worth a line in the log, not a failure.
		report := t.Errorf
		if e.Severity == "info" {
			report = t.Logf
		}
		if !found {
			report("missing %s %s (code %d) on %v: %s", e.Severity, e.ID, e.Code, e.Devices, e.Note)
			continue
		}
		for _, d := range e.Devices {
			if !covered[d] {
				report("%s %s does not name device %s: %s", e.Severity, e.ID, d, e.Note)
			}
		}
	}
	for _, m := range exp.MustNot {
		for _, f := range got {
			if f.ID != m.ID {
				continue
			}
			if len(m.Devices) == 0 {
				t.Errorf("reported %s (%s), which must not be reported: %s", f.ID, f.Title, m.Note)
				continue
			}
			for _, d := range f.Devices {
				if slices.Contains(m.Devices, d) {
					t.Errorf("reported %s on %s (%s), which must not be reported: %s", f.ID, d, f.Title, m.Note)
				}
			}
		}
	}
	for _, f := range got {
		if f.Severity != doctor.Critical {
			continue
		}
		listed := false
		for _, e := range exp.Expect {
			if e.ID == f.ID && e.Severity == "critical" && (e.Code == 0 || e.Code == f.Code) && subset(f.Devices, e.Devices) {
				listed = true
			}
		}
		if !listed {
			t.Errorf("unexpected critical finding %s on %v: %s", f.ID, f.Devices, f.Title)
		}
	}
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// TestInventoryCountsPhysicalGPUs: `kiln inventory --from` on each capture
// counts the physical GPUs expected.json gives (partitions are not GPUs).
func TestInventoryCountsPhysicalGPUs(t *testing.T) {
	files := loadExpected(t)
	for name, exp := range files {
		if exp.GPUs == nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			out, stderr, code := kiln(t, "inventory", "--from", filepath.Join(capturesDir, filepath.FromSlash(name)), "-o", "json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			s, err := snapshot.Decode(bytes.NewReader(out))
			if err != nil {
				t.Fatal(err)
			}
			if len(s.GPUs) != *exp.GPUs {
				t.Errorf("inventory found %d GPUs, capture has %d", len(s.GPUs), *exp.GPUs)
			}
			for _, g := range s.GPUs {
				if g.PCIAddress == "" {
					continue
				}
				if c, err := snapshot.CanonicalPCI(g.PCIAddress); err != nil || c != g.PCIAddress {
					t.Errorf("GPU address %q is not canonical", g.PCIAddress)
				}
			}
		})
	}
}
