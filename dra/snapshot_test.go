package dra_test

import (
	"testing"

	"kiln.dev/kiln/dra"
)

// TestNodeSnapshotRoundTrip: the Snapshot read back from a node's slices
// has its whole GPUs with the facts placement and pinning need.
func TestNodeSnapshotRoundTrip(t *testing.T) {
	m := machineByName(t, "rtx4090x8-mixed-load")
	s := loadMachine(t, m)
	r := buildMachine(t, m)
	got := dra.NodeSnapshot(r.Objects(), m.name)
	if len(got.GPUs) != len(s.GPUs) {
		t.Fatalf("%d GPUs read back, %d published", len(got.GPUs), len(s.GPUs))
	}
	for i, g := range got.GPUs {
		w := s.GPUs[i]
		if g.Index != w.Index || g.UUID != w.UUID || g.Vendor != w.Vendor || g.ComputeCapability != w.ComputeCapability || g.MemoryTotalBytes != w.MemoryTotalBytes || g.PCIAddress == "" {
			t.Errorf("GPU %d read back as %+v, was %+v", i, g, w)
		}
	}
	if got.Drivers.CUDADriver != "12.2" || got.Drivers.NVIDIAUser == "" {
		t.Errorf("drivers %+v", got.Drivers)
	}
}

func TestMajorMinor(t *testing.T) {
	for in, want := range map[string]string{"12.4.0": "12.4", "9.0.0": "9.0", "12": "12", "": ""} {
		if got := dra.MajorMinor(in); got != want {
			t.Errorf("MajorMinor(%q) = %q, want %q", in, got, want)
		}
	}
}
