package discover

import (
	"context"
	"testing"

	"kiln.dev/kiln/snapshot"
)

// TestResample: a second reading replaces the changing values of the first
// and leaves what does not change (and the base) alone; a GPU NVML no
// longer reads keeps no changing value.
func TestResample(t *testing.T) {
	lib := fakeH100Node()
	first, err := collectNVML(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	base := &snapshot.Snapshot{}
	first.Apply(base)
	if len(base.GPUs) < 2 || base.GPUs[0].UtilizationGPU == nil {
		t.Fatalf("the fake node's first GPU has no utilization: %+v", base.GPUs)
	}
	before := *base.GPUs[0].UtilizationGPU
	model := base.GPUs[0].Model

	lib.devices[0].utilGPU = 77
	lib.devices[0].memUsed = 5 << 30
	second, err := collectNVML(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	got := Resample(base, second)
	g := got.GPUs[0]
	if g.UtilizationGPU == nil || *g.UtilizationGPU != 77 {
		t.Errorf("utilization after resampling = %v, want 77", g.UtilizationGPU)
	}
	if g.MemoryUsedBytes != 5<<30 {
		t.Errorf("memory used after resampling = %d, want %d", g.MemoryUsedBytes, 5<<30)
	}
	if g.Model != model {
		t.Errorf("model changed to %q", g.Model)
	}
	if *base.GPUs[0].UtilizationGPU != before {
		t.Errorf("the base changed: utilization %v, was %v", *base.GPUs[0].UtilizationGPU, before)
	}

	// The first GPU is lost: its changing values go.
	lost := *second
	lost.Devices = lost.Devices[1:]
	got = Resample(base, &lost)
	if g := got.GPUs[0]; g.UtilizationGPU != nil || g.Power != nil || g.Temperature != nil {
		t.Errorf("a GPU NVML did not read kept readings: utilization %v, power %v, temperature %v", g.UtilizationGPU, g.Power, g.Temperature)
	}
	if got.GPUs[0].UUID != base.GPUs[0].UUID {
		t.Errorf("a GPU NVML did not read lost its identity")
	}
}

// TestSamplerClosed: a closed sampler answers an error, not a crash.
func TestSamplerClosed(t *testing.T) {
	s := &NVMLSampler{lib: fakeH100Node()}
	if _, err := s.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(context.Background()); err == nil {
		t.Fatal("a closed sampler sampled")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}
