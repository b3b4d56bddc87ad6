package topo_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/topo"
)

// fromCapture builds the matrix of a real capture. A capture whose format
// no importer reads yet is skipped; once read, every assertion holds.
func fromCapture(t *testing.T, paths ...string) *topo.Matrix {
	t.Helper()
	s, err := capture.Load(context.Background(), paths...)
	if err != nil {
		t.Skipf("capture not importable here: %v", err)
	}
	m, err := topo.Build(s, kb.Default())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return m
}

// byPCI finds a device by its PCI address.
func byPCI(t *testing.T, m *topo.Matrix, addr string) int {
	t.Helper()
	for i, d := range m.Devices {
		if d.PCI == addr {
			return i
		}
	}
	t.Fatalf("no device at %s", addr)
	return -1
}

func TestCaptureHGXH100Lspci(t *testing.T) {
	m := fromCapture(t, "../testdata/captures/lspci/h100-hgx-x8-lspci-vvv.txt")
	if got := len(m.GPUs()); got != 8 {
		t.Fatalf("%d GPUs, want 8", got)
	}
	gpu0 := byPCI(t, m, "0000:19:00.0")
	gpu1 := byPCI(t, m, "0000:3b:00.0")
	gpu4 := byPCI(t, m, "0000:9b:00.0")
	cx7 := byPCI(t, m, "0000:1a:00.0")
	nvme := byPCI(t, m, "0000:18:00.0")
	gen5x16 := 16 * 3.93846
	tests := []struct {
		a, b  int
		class string
		uni   float64
	}{
		// The GPU and its ConnectX-7 share a PEX890xx switch.
		{gpu0, cx7, "PIX", gen5x16},
		// Each GPU has its own root port: NODE within a socket, SYS across.
		{gpu0, gpu1, "NODE", gen5x16},
		{gpu0, gpu4, "SYS", gen5x16},
		// The Gen4 x4 NVMe drive on the same switch limits its path.
		{gpu0, nvme, "PIX", 4 * 1.96923},
	}
	for _, tt := range tests {
		c := m.Cells[tt.a][tt.b]
		if c.Class != tt.class || math.Abs(c.GBpsUni-tt.uni) > 0.01 || c.GBpsBidi != 2*c.GBpsUni {
			t.Errorf("%s-%s = %s %v GB/s per direction (%s), want %s %v",
				m.Devices[tt.a].PCI, m.Devices[tt.b].PCI, c.Class, c.GBpsUni, c.Basis, tt.class, tt.uni)
		}
	}
	if c := m.Cells[gpu0][nvme]; c.Bottleneck != "0000:18:00.0" {
		t.Errorf("GPU0-NVMe bottleneck %q, want 0000:18:00.0", c.Bottleneck)
	}
	if nic, class := m.NearestNIC(gpu0); nic < 0 || class != "PIX" || !strings.HasPrefix(m.Devices[nic].PCI, "0000:1") {
		t.Errorf("NearestNIC(GPU0) = %d %q", nic, class)
	}
	// The two ports of the BCM5720 are functions of one device below one
	// root port.
	b0, b1 := byPCI(t, m, "0000:01:00.0"), byPCI(t, m, "0000:01:00.1")
	if c := m.Cells[b0][b1]; c.Class != "PIX" {
		t.Errorf("BCM5720 ports: %s, want PIX", c.Class)
	}
}

func TestCaptureMI210KFD(t *testing.T) {
	m := fromCapture(t, "../testdata/captures/kfd-topology/mi210-x8-xgmi-pcie")
	gpus := m.GPUs()
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	xgmi, sys := 0, 0
	for a := range gpus {
		for b := a + 1; b < len(gpus); b++ {
			c := m.Cells[gpus[a]][gpus[b]]
			switch c.Class {
			case "XGMI":
				xgmi++
				if c.GBpsUni != 50 {
					t.Errorf("GPU%d-GPU%d xGMI at %v GB/s per direction, want 50", a, b, c.GBpsUni)
				}
			case "SYS":
				sys++
			default:
				t.Errorf("GPU%d-GPU%d: %s", a, b, c.Class)
			}
		}
	}
	// Two hives of four: 2 x 6 pairs inside, 16 pairs across sockets.
	if xgmi != 12 || sys != 16 {
		t.Errorf("%d XGMI and %d SYS pairs, want 12 and 16", xgmi, sys)
	}
}

func TestCaptureMI300XCPX(t *testing.T) {
	m := fromCapture(t, "../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz")
	gpus := m.GPUs()
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8 physical GPUs", len(gpus))
	}
	for a := range gpus {
		for b := a + 1; b < len(gpus); b++ {
			if c := m.Cells[gpus[a]][gpus[b]]; c.Class != "XGMI" || c.GBpsUni != 64 || c.GBpsBidi != 128 {
				t.Errorf("GPU%d-GPU%d = %s %v/%v, want XGMI 64 GB/s per direction, 128 both", a, b, c.Class, c.GBpsUni, c.GBpsBidi)
			}
		}
	}
}

func TestCaptureB300TopoM(t *testing.T) {
	m := fromCapture(t, "../testdata/captures/nvidia-smi-topo/b300x8-cx8-bond-topo-m.txt")
	gpus := m.GPUs()
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	for a := range gpus {
		for b := a + 1; b < len(gpus); b++ {
			if c := m.Cells[gpus[a]][gpus[b]]; c.Class != "NV18" {
				t.Errorf("GPU%d-GPU%d = %s, want NV18", a, b, c.Class)
			}
		}
		nic, class := m.NearestNIC(gpus[a])
		want := "mlx5_bond_" + string(rune('0'+a))
		if nic < 0 || m.Devices[nic].Interface != want || class != "PXB" {
			t.Errorf("NearestNIC(GPU%d) = %d %q, want %s PXB", a, nic, class, want)
		}
		d := m.Devices[gpus[a]]
		if d.NUMANode == nil || *d.NUMANode != a/4 {
			t.Errorf("GPU%d NUMA %v, want %d", a, d.NUMANode, a/4)
		}
	}
	if d := m.Devices[gpus[4]]; d.CPUAffinity != "64-127,192-255" {
		t.Errorf("GPU4 CPU affinity %q", d.CPUAffinity)
	}
}

func TestCaptureRTX4090AllSYS(t *testing.T) {
	m := fromCapture(t, "../testdata/captures/nvidia-smi-topo/rtx4090x8-all-sys-topo-m.txt")
	gpus := m.GPUs()
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	for a := range gpus {
		for b := a + 1; b < len(gpus); b++ {
			if c := m.Cells[gpus[a]][gpus[b]]; c.Class != "SYS" {
				t.Errorf("GPU%d-GPU%d = %s, want SYS as printed", a, b, c.Class)
			}
		}
	}
	// Only GPU6 is PHB-local to the NICs.
	for a, g := range gpus {
		_, class := m.NearestNIC(g)
		want := "SYS"
		if a == 6 {
			want = "PHB"
		}
		if class != want {
			t.Errorf("NearestNIC(GPU%d) class %q, want %s", a, class, want)
		}
	}
}
