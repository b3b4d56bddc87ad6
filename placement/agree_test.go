package placement

import (
	"errors"
	"sort"
	"strings"
	"testing"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// constraintNodes: an NVIDIA node with an A100 and an A10 (driver 535,
// CUDA 12.2) and an AMD node with an MI300X (amdgpu 6.8.5).
func constraintNodes() map[string]*snapshot.Snapshot {
	nv := &snapshot.Snapshot{Host: snapshot.Host{Hostname: "nv"},
		Drivers: snapshot.Drivers{NVIDIAUser: "535.104.05", CUDADriver: "12.2"},
		GPUs: []snapshot.GPU{
			{Index: 0, Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA A100-SXM4-80GB", Architecture: "Ampere", ComputeCapability: "8.0", PCIAddress: "0000:17:00.0", MemoryTotalBytes: 80 << 30},
			{Index: 1, Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA A10", Architecture: "Ampere", ComputeCapability: "8.6", PCIAddress: "0000:65:00.0", MemoryTotalBytes: 24 << 30},
		}}
	amd := &snapshot.Snapshot{Host: snapshot.Host{Hostname: "amd"},
		Drivers: snapshot.Drivers{AMDGPU: "6.8.5"},
		GPUs: []snapshot.GPU{
			{Index: 0, Vendor: snapshot.VendorAMD, Model: "AMD Instinct MI300X", Architecture: "CDNA 3", PCIAddress: "0000:11:00.0", MemoryTotalBytes: 192 << 30},
		}}
	return map[string]*snapshot.Snapshot{"nv": nv, "amd": amd}
}

// reachable is every device a placer grants one GPU of c on, one lease
// after the other until nothing fits.
func reachable(t *testing.T, pl Placer, c api.Constraints) string {
	t.Helper()
	f := newFleet(constraintNodes())
	var got []string
	for i := 0; i < 10; i++ {
		p, err := pl.Place(Request{GPUs: 1, Constraints: c}, f.views(nil))
		if err != nil {
			var nf *NoFit
			if !errors.As(err, &nf) {
				t.Fatalf("%+v: a refusal that is not a NoFit: %v", c, err)
			}
			break
		}
		a := p.Allocations[0]
		got = append(got, a.Node+"/"+a.Devices[0].ID)
		f.grant(strings.Repeat("l", i+1), p)
	}
	sort.Strings(got)
	return strings.Join(got, " ")
}

// TestPlacersShareConstraints: the sched engine and first-fit give every
// constraint one meaning, the one of sched.MatchDevice: a model is whole
// words of the name ("A10" is not the A100), the driver floor is the GPU
// vendor's own driver (amdgpu for the MI300X), a CUDA floor keeps to
// NVIDIA GPUs, an unreadable floor meets nothing.
func TestPlacersShareConstraints(t *testing.T) {
	cases := []struct {
		c    api.Constraints
		want string
	}{
		{api.Constraints{}, "amd/gpu0 nv/gpu0 nv/gpu1"},
		{api.Constraints{Model: "A10"}, "nv/gpu1"},
		{api.Constraints{Model: "a100"}, "nv/gpu0"},
		{api.Constraints{Model: "MI300X"}, "amd/gpu0"},
		{api.Constraints{MinDriver: "6.7"}, "amd/gpu0 nv/gpu0 nv/gpu1"},
		{api.Constraints{MinDriver: "6.9"}, "nv/gpu0 nv/gpu1"},
		{api.Constraints{MinDriver: "550"}, ""},
		{api.Constraints{MinCUDA: "12.0"}, "nv/gpu0 nv/gpu1"},
		{api.Constraints{MinComputeCapability: "8.5"}, "nv/gpu1"},
		{api.Constraints{MinComputeCapability: "eight"}, ""},
		{api.Constraints{Vendor: "AMD"}, "amd/gpu0"},
		{api.Constraints{Architecture: "cdna 3"}, "amd/gpu0"},
		{api.Constraints{MinMemoryBytes: 64 << 30}, "amd/gpu0 nv/gpu0"},
		{api.Constraints{Nodes: []string{"nv"}, Model: "A100"}, "nv/gpu0"},
	}
	for _, tc := range cases {
		for name, pl := range map[string]Placer{"sched": &SchedPlacer{}, "first-fit": FirstFit{}} {
			if got := reachable(t, pl, tc.c); got != tc.want {
				t.Errorf("%s, %+v: placed on %q, want %q", name, tc.c, got, tc.want)
			}
		}
	}
}
