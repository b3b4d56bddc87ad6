package doctor

import (
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func fleetNode(model, vbios, driver string, n int) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Drivers: snapshot.Drivers{NVIDIAKernel: driver}}
	for i := 0; i < n; i++ {
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: i, Vendor: snapshot.VendorNVIDIA, Model: model, VBIOS: vbios})
	}
	return s
}

// TestFleet: one GPU model on two VBIOS versions is a warning naming which
// nodes run which; two driver versions an info; a uniform fleet, and
// different models on different firmware, are nothing.
func TestFleet(t *testing.T) {
	mixed := map[string]*snapshot.Snapshot{
		"a": fleetNode("H100-SXM5-80GB", "96.00.74.00.01", "535.183.01", 8),
		"b": fleetNode("H100-SXM5-80GB", "96.00.74.00.01", "535.183.01", 8),
		"c": fleetNode("H100-SXM5-80GB", "96.00.61.00.01", "550.54.15", 8),
		"d": fleetNode("L40S", "95.02.66.00.02", "535.183.01", 4),
	}
	fs := Fleet(mixed)
	if len(fs) != 2 {
		t.Fatalf("findings %+v, want the VBIOS and the driver", fs)
	}
	v, d := fs[0], fs[1]
	if v.ID != "fleet-vbios-mixed" || v.Severity != Warning || !strings.Contains(v.Title, "H100-SXM5-80GB") || v.Machine != "a, b, c" {
		t.Errorf("VBIOS finding %+v", v)
	}
	if len(v.Evidence) != 2 || v.Evidence[0] != "96.00.74.00.01 on a, b" || v.Evidence[1] != "96.00.61.00.01 on c" || v.Remedy == "" {
		t.Errorf("VBIOS evidence %q (the common version first), remedy %q", v.Evidence, v.Remedy)
	}
	if d.ID != "fleet-driver-mixed" || d.Severity != Info || d.Machine != "a, b, c, d" {
		t.Errorf("driver finding %+v", d)
	}
	uniform := map[string]*snapshot.Snapshot{
		"a": fleetNode("H100-SXM5-80GB", "96.00.74.00.01", "535.183.01", 8),
		"b": fleetNode("H100-SXM5-80GB", "96.00.74.00.01", "535.183.01", 8),
		"c": fleetNode("L40S", "95.02.66.00.02", "535.183.01", 4),
		"e": nil,
	}
	if fs := Fleet(uniform); len(fs) != 0 {
		t.Errorf("a uniform fleet: %+v", fs)
	}
}
