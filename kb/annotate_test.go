package kb

import (
	"testing"

	"kiln.dev/kiln/snapshot"
)

func TestAnnotate(t *testing.T) {
	s := snapshot.New()
	s.GPUs = []snapshot.GPU{
		{Vendor: snapshot.VendorNVIDIA, DeviceID: "2330"},
		{Vendor: snapshot.VendorAMD, DeviceID: "74a1", GFXTarget: "gfx942"},
		{Vendor: snapshot.VendorNVIDIA, DeviceID: "2330", Model: "NVIDIA H100 80GB HBM3", ComputeCapability: "9.0", Architecture: "Hopper"},
		{Vendor: snapshot.VendorNVIDIA, DeviceID: "ffff"},
	}
	if n := Default().Annotate(s); n != 2 {
		t.Errorf("annotated %d GPUs, want 2", n)
	}
	if g := s.GPUs[0]; g.Model != "H100-SXM5-80GB" || g.ComputeCapability != "9.0" || g.Architecture == "" {
		t.Errorf("H100 by device id: %+v", g)
	}
	if g := s.GPUs[1]; g.Model == "" || g.GFXTarget != "gfx942" {
		t.Errorf("MI300X: %+v", g)
	}
	if g := s.GPUs[2]; g.Model != "NVIDIA H100 80GB HBM3" {
		t.Errorf("read model replaced: %q", g.Model)
	}
	if g := s.GPUs[3]; g.Model != "" {
		t.Errorf("unknown device got model %q", g.Model)
	}
}
