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

// TestProcesses: NVML's process lists become the GPU's processes, each PID
// once, with its memory where NVML says it, its MIG instance, and its SM
// use from the latest of its samples; a process NVML has no sample of
// gets none.
func TestProcesses(t *testing.T) {
	lib := fakeH100Node()
	lib.devices[0].procs = []nvmlProcess{
		{pid: 100, memory: 2 << 30, gi: noInstance, ci: noInstance},
		{pid: 200, memory: noMemory, gi: noInstance, ci: noInstance},
		{pid: 300, memory: 1 << 30, gi: 3, ci: 0},
	}
	lib.devices[0].procUtil = []nvmlProcessUtil{{pid: 100, at: 10, sm: 40}, {pid: 100, at: 20, sm: 55}, {pid: 100, at: 15, sm: 1}}
	r, err := collectNVML(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	s := &snapshot.Snapshot{}
	r.Apply(s)
	g := s.GPUs[0]
	if g.Processes != 3 || len(g.ProcessList) != 3 {
		t.Fatalf("processes %d, list %+v; want 3", g.Processes, g.ProcessList)
	}
	p := g.ProcessList
	if p[0].PID != 100 || p[0].MemoryBytes == nil || *p[0].MemoryBytes != 2<<30 || p[0].SMPercent == nil || *p[0].SMPercent != 55 {
		t.Errorf("process 100: %+v (want 2 GiB and the latest sample, 55%%)", p[0])
	}
	if p[1].MemoryBytes != nil || p[1].SMPercent != nil {
		t.Errorf("process 200: NVML did not say its memory nor sample it, got %+v", p[1])
	}
	if p[2].GPUInstance == nil || *p[2].GPUInstance != 3 || p[2].ComputeInstance == nil || *p[2].ComputeInstance != 0 {
		t.Errorf("process 300 on MIG instance 3/0: %+v", p[2])
	}
	if p[0].GPUInstance != nil {
		t.Errorf("process 100 is on the whole GPU, got instance %v", *p[0].GPUInstance)
	}
	got := Resample(s, r)
	if len(got.GPUs[0].ProcessList) != 3 {
		t.Errorf("resampled processes: %+v", got.GPUs[0].ProcessList)
	}
}

// TestSamplerGPM: the sampler measures a GPU's activity between its last
// two GPM samples (none on the first), frees every sample it is done
// with, and a GPU without GPM gets no activity.
func TestSamplerGPM(t *testing.T) {
	lib := fakeH100Node()
	g := &fakeGPM{}
	lib.devices[0].gpm = g
	lib.devices[0].energy = 123456789
	s := &NVMLSampler{lib: lib}
	first, err := s.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if first.Devices[0].Activity != nil {
		t.Errorf("activity after one sample: %+v", first.Devices[0].Activity)
	}
	second, err := s.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a := second.Devices[0].Activity
	if a == nil || a.SMPercent == nil || *a.SMPercent != 2 || *a.TensorPercent != 1 {
		t.Fatalf("activity between samples 1 and 2: %+v", a)
	}
	if second.Devices[1].Activity != nil {
		t.Errorf("a GPU without GPM has activity %+v", second.Devices[1].Activity)
	}
	snap := &snapshot.Snapshot{}
	second.Apply(snap)
	if act := snap.GPUs[0].Activity; act == nil || act.SM == nil || *act.SM != 0.02 {
		t.Errorf("snapshot activity %+v, want SM 0.02", act)
	}
	if p := snap.GPUs[0].Power; p == nil || p.EnergyJ == nil || *p.EnergyJ != 123456.789 {
		t.Errorf("energy %+v, want 123456.789 J", p)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if g.taken != 2 || g.freed != 2 {
		t.Errorf("GPM samples taken %d, freed %d: every sample must be freed", g.taken, g.freed)
	}
}

// TestNVLinkCounters: an active link's error counters and traffic reach
// the Snapshot, traffic in bytes.
func TestNVLinkCounters(t *testing.T) {
	r, err := collectNVML(context.Background(), fakeH100Node())
	if err != nil {
		t.Fatal(err)
	}
	s := &snapshot.Snapshot{}
	r.Apply(s)
	var l3 *snapshot.NVLink
	for i := range s.GPUs[0].NVLinks {
		if s.GPUs[0].NVLinks[i].Link == 3 {
			l3 = &s.GPUs[0].NVLinks[i]
		}
	}
	if l3 == nil || l3.State != "active" {
		t.Fatalf("link 3 of the fake H100: %+v", l3)
	}
	if l3.Errors == nil || l3.Errors.Replay != 3 || l3.Errors.CRCFlit != 6 {
		t.Errorf("link 3 errors %+v, want replay 3 and CRC flit 6", l3.Errors)
	}
	if l3.TxBytes == nil || *l3.TxBytes != 3000*1024 || l3.RxBytes == nil || *l3.RxBytes != 6000*1024 {
		t.Errorf("link 3 traffic %v %v, want 3000 and 6000 KiB in bytes", l3.TxBytes, l3.RxBytes)
	}
}

// TestProcessesRead: a GPU whose process list NVML gave, empty or not, has
// its processes read; one whose list NVML refused has not (zero says
// nothing there).
func TestProcessesRead(t *testing.T) {
	lib := fakeH100Node()
	lib.devices[1].errs["Processes"] = errNVMLNotSupported
	r, err := collectNVML(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	s := &snapshot.Snapshot{}
	r.Apply(s)
	if !s.GPUs[0].ProcessesRead || s.GPUs[0].Processes != 0 {
		t.Errorf("GPU 0, no process listed: read %v, %d processes; want read, 0", s.GPUs[0].ProcessesRead, s.GPUs[0].Processes)
	}
	if s.GPUs[1].ProcessesRead {
		t.Error("GPU 1, whose list NVML refused, counts as read")
	}
}
