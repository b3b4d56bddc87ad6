package sched

import "testing"

// TestMatchDeviceVersions: the version floors read versions as package
// version does; one that does not parse never meets a floor.
func TestMatchDeviceVersions(t *testing.T) {
	nv := &Device{Vendor: "nvidia", ComputeCapability: "9.0"}
	amd := &Device{Vendor: "amd"}
	for _, tc := range []struct {
		name string
		c    Constraints
		n    Node
		d    *Device
		ok   bool
	}{
		{"driver above", Constraints{MinDriver: "535"}, Node{Driver: "535.129.03"}, nv, true},
		{"driver below", Constraints{MinDriver: "550"}, Node{Driver: "535.129.03"}, nv, false},
		{"driver missing", Constraints{MinDriver: "0"}, Node{}, nv, false},
		{"driver N/A", Constraints{MinDriver: "0"}, Node{Driver: "N/A"}, nv, false},
		{"amdgpu with a package suffix", Constraints{MinDriver: "6.3"}, Node{AMDGPU: "6.10.5-2084815.24.04"}, amd, true},
		{"amdgpu below", Constraints{MinDriver: "6.12"}, Node{AMDGPU: "6.10.5-2084815.24.04"}, amd, false},
		{"cuda equal", Constraints{MinCUDA: "12.4"}, Node{CUDA: "12.4.0"}, nv, true},
		{"cuda 1.x", Constraints{MinCUDA: "1"}, Node{CUDA: "1.x"}, nv, false},
		{"cc", Constraints{MinComputeCapability: "8.0"}, Node{}, nv, true},
		{"cc unknown", Constraints{MinComputeCapability: "8.0"}, Node{}, &Device{Vendor: "nvidia"}, false},
		{"floor unparsable", Constraints{MinComputeCapability: "eight"}, Node{}, nv, false},
	} {
		why := MatchDevice(&tc.c, &tc.n, tc.d)
		if (why == "") != tc.ok {
			t.Errorf("%s: MatchDevice = %q, want ok %v", tc.name, why, tc.ok)
		}
	}
}
