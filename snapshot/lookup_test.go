package snapshot

import "testing"

func TestGPUByPCI(t *testing.T) {
	s := &Snapshot{
		GPUs: []GPU{
			{Index: 0, PCIAddress: "0000:3b:00.0"},
			{Index: 1, PCIAddress: "0000:86:00.0"},
			{Index: 2},
			{Index: 3, PCIAddress: "00000000:AF:00.0"}, // not canonical, as a hand-written file may have it
		},
		PCI: []PCIDevice{
			{Address: "0000:3b:00.0", Kind: KindGPU},
			{Address: "0000:5e:00.0", Kind: KindNIC},
		},
	}
	for _, tc := range []struct {
		addr string
		want int // GPU index, -1 for none
	}{
		{"0000:3b:00.0", 0},
		{"0000:3B:00.0", 0},
		{"3b:00.0", 0},
		{"00000000:86:00.0", 1},
		{" 0000:86:00.0 ", 1},
		{"0000:af:00.0", 3},
		{"0000:86:00.1", -1},
		{"0000:99:00.0", -1},
		{"", -1},
		{"GPU0", -1},
	} {
		g := s.GPUByPCI(tc.addr)
		switch {
		case tc.want < 0 && g != nil:
			t.Errorf("GPUByPCI(%q) = GPU %d, want none", tc.addr, g.Index)
		case tc.want >= 0 && (g == nil || g.Index != tc.want):
			t.Errorf("GPUByPCI(%q) = %+v, want GPU %d", tc.addr, g, tc.want)
		}
	}
	if g := s.GPUByPCI("0000:86:00.0"); g != &s.GPUs[1] {
		t.Error("GPUByPCI returns a copy, not the snapshot's GPU")
	}
	if d := s.DeviceByPCI("5e:00.0"); d == nil || d.Kind != KindNIC || d != &s.PCI[1] {
		t.Errorf("DeviceByPCI(5e:00.0) = %+v, want the NIC", d)
	}
	if d := s.DeviceByPCI("0000:86:00.0"); d != nil {
		t.Errorf("DeviceByPCI of an address with no PCI entry = %+v", d)
	}
	var none *Snapshot
	if none.GPUByPCI("0000:3b:00.0") != nil || none.DeviceByPCI("0000:3b:00.0") != nil {
		t.Error("a nil snapshot has a device")
	}
}
