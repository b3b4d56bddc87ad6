package capture

import (
	"reflect"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func topoMParse(t *testing.T, rel string) *snapshot.Snapshot {
	t.Helper()
	s, err := ParseNvidiaSMITopo(lspciReadCapture(t, rel))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return s
}

func topoMCellOf(t *testing.T, m *snapshot.TopoMatrix, a, b string) string {
	t.Helper()
	i, j := -1, -1
	for k, d := range m.Devices {
		if d == a {
			i = k
		}
		if d == b {
			j = k
		}
	}
	if i < 0 || j < 0 {
		t.Fatalf("no %s or %s in %v", a, b, m.Devices)
	}
	return m.Cells[i][j]
}

func TestTopoMB300(t *testing.T) {
	s := topoMParse(t, "nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt")
	m := s.Matrix
	if m == nil || m.Source != "nvidia-smi-topo" {
		t.Fatalf("matrix %+v", m)
	}
	want := []string{"GPU0", "GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6", "GPU7", "NIC0", "NIC1", "NIC2", "NIC3", "NIC4", "NIC5", "NIC6", "NIC7"}
	if !reflect.DeepEqual(m.Devices, want) {
		t.Fatalf("devices %v", m.Devices)
	}
	for pair, want := range map[[2]string]string{
		{"GPU0", "GPU1"}: "NV18", {"GPU7", "GPU7"}: "X", {"GPU0", "NIC0"}: "PXB", {"GPU0", "NIC1"}: "NODE",
		{"GPU0", "NIC4"}: "SYS", {"NIC7", "NIC7"}: "X", {"NIC7", "GPU7"}: "PXB", {"NIC5", "GPU4"}: "NODE",
	} {
		if got := topoMCellOf(t, m, pair[0], pair[1]); got != want {
			t.Errorf("cell %s-%s = %q, want %q", pair[0], pair[1], got, want)
		}
	}
	if m.Aliases["NIC0"] != "mlx5_bond_0" || m.Aliases["NIC7"] != "mlx5_bond_7" || len(m.Aliases) != 8 {
		t.Errorf("aliases %v", m.Aliases)
	}
	if m.CPUAffinity["GPU3"] != "0-63,128-191" || m.CPUAffinity["GPU4"] != "64-127,192-255" || len(m.CPUAffinity) != 8 {
		t.Errorf("CPU affinity %v", m.CPUAffinity)
	}
	if m.NUMA["GPU3"] != 0 || m.NUMA["GPU4"] != 1 || len(m.NUMA) != 8 {
		t.Errorf("NUMA %v", m.NUMA)
	}
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(s.GPUs))
	}
	for i, g := range s.GPUs {
		wantNUMA := i / 4
		if g.Index != i || g.MatrixName != "GPU"+string(rune('0'+i)) || g.Vendor != snapshot.VendorNVIDIA || g.PCIAddress != "" ||
			g.NUMANode == nil || *g.NUMANode != wantNUMA {
			t.Errorf("GPU %d = %+v", i, g)
		}
	}
	if len(s.Links) != 28 {
		t.Fatalf("%d NVLink pairs, want 28", len(s.Links))
	}
	if l := s.Links[0]; l != (snapshot.Link{A: "GPU0", B: "GPU1", Kind: snapshot.LinkNVLink, Count: 18}) {
		t.Errorf("first link %+v", l)
	}
	for _, l := range s.Links {
		if l.Count != 18 || l.Kind != snapshot.LinkNVLink {
			t.Errorf("link %+v", l)
		}
	}
}

func TestTopoMRTX4090Tabs(t *testing.T) {
	s := topoMParse(t, "nvidia-smi-topo/rtx4090x8-all-sys-topo-m.txt")
	m := s.Matrix
	if len(m.Devices) != 10 || m.Devices[9] != "NIC1" {
		t.Fatalf("devices %v", m.Devices)
	}
	if got := topoMCellOf(t, m, "GPU0", "GPU1"); got != "SYS" {
		t.Errorf("GPU0-GPU1 = %q, want SYS", got)
	}
	if got := topoMCellOf(t, m, "GPU6", "NIC0"); got != "PHB" {
		t.Errorf("GPU6-NIC0 = %q, want PHB", got)
	}
	if got := topoMCellOf(t, m, "NIC0", "NIC1"); got != "PIX" {
		t.Errorf("NIC0-NIC1 = %q, want PIX", got)
	}
	if len(m.Aliases) != 0 {
		t.Errorf("aliases %v from a capture without a NIC legend", m.Aliases)
	}
	if m.NUMA["GPU0"] != 0 || m.NUMA["GPU7"] != 1 || m.CPUAffinity["GPU7"] != "56-111,168-223" {
		t.Errorf("NUMA %v, CPU affinity %v", m.NUMA, m.CPUAffinity)
	}
	if _, ok := m.NUMA["NIC0"]; ok {
		t.Errorf("NIC0 has a NUMA node though none is printed")
	}
	if len(s.GPUs) != 8 || len(s.Links) != 0 {
		t.Errorf("%d GPUs and %d links, want 8 and none", len(s.GPUs), len(s.Links))
	}
}

func TestTopoMErrors(t *testing.T) {
	for _, in := range []string{
		"",
		"\tGPU0\tGPU1\n",
		"\tGPU0\tGPU1\nGPU0\t X \n",
		"\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU0\t X \tNV4\n",
		"\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-3\tzero\nGPU1\tNV4\t X \t0-3\t0\n",
	} {
		if _, err := ParseNvidiaSMITopo([]byte(in)); err == nil {
			t.Errorf("ParseNvidiaSMITopo(%q): no error", in)
		}
	}
	// rocm-smi prints 0 on the diagonal and a different frame: not claimed.
	if detectTopoM("x", []byte("       GPU0         GPU1\nGPU0   0            15\nGPU1   15           0\n")) {
		t.Error("rocm-smi weight matrix claimed")
	}
	// nvidia-smi topo -p2p prints OK/NS cells: not claimed.
	if detectTopoM("x", []byte(" \tGPU0\tGPU1\n GPU0\tX\tOK\n GPU1\tOK\tX\n")) {
		t.Error("topo -p2p matrix claimed")
	}
}

func FuzzParseNvidiaSMITopo(f *testing.F) {
	for _, rel := range []string{"nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt", "nvidia-smi-topo/rtx4090x8-all-sys-topo-m.txt"} {
		f.Add(lspciReadCapture(f, rel))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		detectTopoM("f", data)
		s, err := ParseNvidiaSMITopo(data)
		if err != nil {
			return
		}
		m := s.Matrix
		if m == nil || len(m.Cells) != len(m.Devices) {
			t.Fatalf("matrix %+v", m)
		}
		for i, row := range m.Cells {
			if len(row) != len(m.Devices) {
				t.Fatalf("row %d has %d cells for %d devices", i, len(row), len(m.Devices))
			}
		}
		for _, g := range s.GPUs {
			if g.Index < 0 || !strings.HasPrefix(g.MatrixName, "GPU") || (g.NUMANode != nil && *g.NUMANode < 0) {
				t.Fatalf("GPU %+v", g)
			}
		}
		for _, l := range s.Links {
			if l.Count <= 0 || l.A == l.B {
				t.Fatalf("link %+v", l)
			}
		}
	})
}
