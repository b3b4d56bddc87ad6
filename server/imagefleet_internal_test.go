package server

import (
	"testing"
	"time"

	"kiln.dev/kiln/compat"
	"kiln.dev/kiln/compat/require"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// The fleet's image findings are made again when the images or the nodes
// change, or once they are imageFleetTTL old, and not on every view.
func TestImageFleetMemo(t *testing.T) {
	node := func(driver string) *snapshot.Snapshot {
		s := &snapshot.Snapshot{GPUs: []snapshot.GPU{{Index: 0, Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", PCIAddress: "0000:18:00.0"}}}
		s.Drivers.NVIDIAUser, s.Drivers.NVIDIAKernel = driver, driver
		kb.Default().Annotate(s)
		return s
	}
	e, err := require.Parse("cuda>=12.8")
	if err != nil {
		t.Fatal(err)
	}
	req := &compat.Requirements{CUDA: "12.8", CUDAFrom: "test", Require: "cuda>=12.8", RequireExpr: &e}
	req.Resolve(kb.Default())
	imgs := []compat.Checked{{Ref: "lab/a:1", Requirements: req}}
	var m imageFleetMemo
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	old := map[string]*snapshot.Snapshot{"n1": node("550.90.07")}
	if f := m.findings(imgs, old, kb.Default(), t0); len(f) != 1 || f[0].ID != "fleet-image-fails" {
		t.Fatalf("driver 550 and a CUDA 12.8 image: %+v", f)
	}
	// The node's driver is upgraded: within the ttl the old finding stays,
	// after it the finding is gone.
	upgraded := map[string]*snapshot.Snapshot{"n1": node("570.86.15")}
	if f := m.findings(imgs, upgraded, kb.Default(), t0.Add(5*time.Second)); len(f) != 1 {
		t.Errorf("within the ttl: %d findings, want the kept one", len(f))
	}
	if f := m.findings(imgs, upgraded, kb.Default(), t0.Add(imageFleetTTL+time.Second)); len(f) != 0 {
		t.Errorf("after the ttl: %+v", f)
	}
	// A new node is judged at once.
	more := map[string]*snapshot.Snapshot{"n1": node("570.86.15"), "n2": node("550.90.07")}
	if f := m.findings(imgs, more, kb.Default(), t0.Add(imageFleetTTL+2*time.Second)); len(f) != 1 || f[0].Machine != "n2" {
		t.Errorf("a node joined: %+v", f)
	}
}
