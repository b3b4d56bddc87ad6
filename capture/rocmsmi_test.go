package capture

import (
	"os"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

const rocmDir = "../testdata/captures/rocm-smi/"

func parseFile(t *testing.T, path string) *snapshot.Snapshot {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseBytes(path, b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gpuAt(t *testing.T, s *snapshot.Snapshot, addr string) snapshot.GPU {
	t.Helper()
	for _, g := range s.GPUs {
		if g.PCIAddress == addr {
			return g
		}
	}
	t.Fatalf("no GPU %s in %d GPUs", addr, len(s.GPUs))
	return snapshot.GPU{}
}

func f(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

func TestRocmSMIMI100(t *testing.T) {
	s := parseFile(t, rocmDir+"mi100-x4-rocm6.0.2-showall.json")
	if s.Sources[0].Kind != "rocm-smi" || len(s.GPUs) != 4 {
		t.Fatalf("kind %s, %d GPUs; want rocm-smi, 4", s.Sources[0].Kind, len(s.GPUs))
	}
	if s.Drivers.AMDGPU != "6.3.6" {
		t.Errorf("amdgpu driver %q, want 6.3.6", s.Drivers.AMDGPU)
	}
	for i, addr := range []string{"0000:83:00.0", "0000:a3:00.0", "0000:c3:00.0", "0000:e3:00.0"} {
		g := gpuAt(t, s, addr)
		if g.Index != i || g.VBIOS != "113-D3431401-101" || g.DeviceID != "738c" || g.Vendor != "amd" {
			t.Errorf("%s: index %d vbios %q device %q", addr, g.Index, g.VBIOS, g.DeviceID)
		}
		if g.NUMANode == nil || *g.NUMANode != 1 {
			t.Errorf("%s: NUMA %v, want 1", addr, g.NUMANode)
		}
		if g.PCIe == nil || g.PCIe.CurrentGen != 4 || g.PCIe.CurrentWidth != 16 || g.PCIe.MaxGen != 4 ||
			g.PCIe.Replays == nil || *g.PCIe.Replays != 0 {
			t.Errorf("%s: PCIe %+v, want Gen4 x16, 0 replays", addr, g.PCIe)
		}
		if g.Serial != "" {
			t.Errorf("%s: serial %q from N/A", addr, g.Serial)
		}
	}
	g := gpuAt(t, s, "0000:83:00.0")
	if g.Model != "Arcturus GL-XL [Instinct MI100]" || g.UniqueID != "0x79ccd55167a2124a" ||
		f(g.Temperature.EdgeC) != 53 || f(g.Temperature.JunctionC) != 55 || f(g.Temperature.MemoryC) != 53 ||
		f(g.Power.DrawW) != 36 || f(g.Power.LimitW) != 290 || g.MemoryTotalBytes != 34342961152 ||
		g.MemoryUsedBytes != 6750208 || g.PerfLevel != "auto" || f(g.UtilizationGPU) != 0 ||
		g.Firmware["TA XGMI"] != "32.00.00.17" || g.Firmware["SMC"] != "00.54.29.00" {
		t.Errorf("83:00.0 = %+v", g)
	}
	if len(s.Links) != 6 {
		t.Fatalf("links = %d, want 6", len(s.Links))
	}
	for _, l := range s.Links {
		if l.Kind != snapshot.LinkPCIe || l.Weight != 40 || l.Hops != 2 {
			t.Errorf("link %+v, want pcie weight 40 hops 2", l)
		}
	}
	if s.Matrix == nil || len(s.Matrix.Devices) != 4 || s.Matrix.Weights[0][1] != 40 || s.Matrix.Cells[2][3] != "PCIE" {
		t.Errorf("matrix %+v", s.Matrix)
	}
	if len(s.Claims) != 1 || s.Claims[0].Count != 4 {
		t.Errorf("claims %+v, want 4 GPUs", s.Claims)
	}
}

func TestRocmSMIMI50TrimmedCapture(t *testing.T) {
	s := parseFile(t, rocmDir+"mi50-rocm5.x-showall.json")
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs, want 1 (no invented cards)", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.PCIAddress != "0000:63:00.0" || g.Model != "Radeon Instinct MI50 32GB" || g.Serial != "692024000810" ||
		g.DeviceID != "66a1" || g.PerfLevel != "high" || len(g.Fans) != 1 || f(g.Fans[0].Percent) != 0 {
		t.Errorf("GPU = %+v", g)
	}
	if len(s.Claims) != 1 || s.Claims[0].What != "gpus" || s.Claims[0].Count != 8 {
		t.Errorf("claims = %+v, want gpus 8", s.Claims)
	}
	if len(s.Links) != 0 || s.Matrix != nil {
		t.Errorf("links %v matrix %v for a single card", s.Links, s.Matrix)
	}
	if s.Drivers.AMDGPU != "5.9.17" {
		t.Errorf("driver %q", s.Drivers.AMDGPU)
	}
}

func TestRocmSMIRX6700NoNUMA(t *testing.T) {
	s := parseFile(t, rocmDir+"rx6700xt-rocm6.1.2-showall.json")
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.NUMANode == nil || *g.NUMANode != -1 {
		t.Errorf("NUMA %v from affinity -1, want -1 (platform reports none)", g.NUMANode)
	}
	if g.PCIAddress != "0000:07:00.0" || g.GFXTarget != "gfx1031" || g.UniqueID != "" ||
		g.MemoryVisibleBytes != 268435456 || g.MemoryTotalBytes != 12868124672 || f(g.MemoryUsedPercent) != 12 ||
		len(g.KFDNodes) != 1 || g.KFDNodes[0] != 1 || g.Model != "Navi 22 [Radeon RX 6700/6700 XT / 6800M]" {
		t.Errorf("GPU = %+v", g)
	}
	if g.PCIe.CurrentGen != 4 || g.PCIe.MaxGen != 4 || g.PCIe.MaxWidth != 16 {
		t.Errorf("PCIe %+v", g.PCIe)
	}
}

func TestRocmSMIShowTopoMI308X(t *testing.T) {
	s := parseFile(t, rocmDir+"mi308x-x8-showtopo.txt")
	if s.Sources[0].Kind != "rocm-smi" || len(s.GPUs) != 8 {
		t.Fatalf("kind %s, %d GPUs", s.Sources[0].Kind, len(s.GPUs))
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "low-power state") {
		t.Errorf("notes %+v, want the low-power warning", s.Notes)
	}
	for i, g := range s.GPUs {
		want := 0
		if i >= 4 {
			want = 1
		}
		if g.NUMANode == nil || *g.NUMANode != want || g.MatrixName != "GPU"+string(rune('0'+i)) {
			t.Errorf("GPU%d: NUMA %v name %q, want NUMA %d", i, g.NUMANode, g.MatrixName, want)
		}
	}
	if len(s.Links) != 28 {
		t.Errorf("links = %d, want 28", len(s.Links))
	}
	for _, l := range s.Links {
		if l.Kind != snapshot.LinkXGMI || l.Weight != 15 || l.Hops != 1 {
			t.Errorf("link %+v", l)
		}
	}
	m := s.Matrix
	if m == nil || len(m.Devices) != 8 || m.Weights[3][4] != 15 || m.Hops[7][0] != 1 || m.Cells[1][2] != "XGMI" ||
		m.Cells[5][5] != "X" || m.NUMA["GPU6"] != 1 {
		t.Errorf("matrix %+v", m)
	}
}

func TestRocmSMIConciseMI300X(t *testing.T) {
	s := parseFile(t, rocmDir+"mi300x-x8-concise.txt")
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(s.GPUs))
	}
	for _, g := range s.GPUs {
		// "[Model : Revision]" is the card's model (subsystem) id, not its
		// device id: it happens to equal it on MI300X.
		if g.Model != "AMD Instinct MI300X" || g.DeviceID != "" || g.Partition == nil ||
			g.Partition.Compute != "SPX" || g.Partition.Memory != "NPS1" || g.Partition.Count != 1 ||
			f(g.Power.LimitW) != 750 || g.PerfLevel != "auto" {
			t.Errorf("GPU%d = %+v", g.Index, g)
		}
	}
	g := s.GPUs[3]
	if f(g.MemoryUsedPercent) != 17 || f(g.UtilizationGPU) != 0 || f(g.Temperature.JunctionC) != 45 ||
		f(g.Power.DrawW) != 178 || f(g.Clocks.GraphicsMHz) != 131 || f(g.Clocks.MemoryMHz) != 900 {
		t.Errorf("GPU3 = %+v", g)
	}
	if g.Temperature.EdgeC != nil {
		t.Errorf("GPU3: junction temperature also read as edge")
	}
}

func TestRocmSMIOldConciseAndShowAllText(t *testing.T) {
	text := `======================= ROCm System Management Interface =======================
================================= Concise Info =================================
GPU  Temp (DieEdge)  AvgPwr  SCLK    MCLK     Fan  Perf  PwrCap  VRAM%  GPU%
0    35.0c           27.0W   800Mhz  1600Mhz  0%   auto  250.0W    3%   0%
1    N/A             N/A     N/A     N/A      N/A  N/A   N/A       N/A  N/A
================================================================================
=================================== PCI Bus ID ===================================
GPU[0]		: PCI Bus: 0000:0A:00.0
GPU[1]		: PCI Bus: 0000:0B:00.0
GPU[1]		: PCIe Replay Count: 7
GPU[1]		: 0: 2.5GT/s x16
GPU[1]		: 1: 8.0GT/s x16 *
GPU[1]		: 2: 16.0GT/s x16
================================== Driver version ==================================
Driver version: 6.2.4
============================= End of ROCm SMI Log ==============================
`
	s, err := ParseBytes("rocm-smi.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 || s.Drivers.AMDGPU != "6.2.4" {
		t.Fatalf("%d GPUs driver %q", len(s.GPUs), s.Drivers.AMDGPU)
	}
	g0, g1 := s.GPUs[0], s.GPUs[1]
	if g0.PCIAddress != "0000:0a:00.0" || f(g0.Temperature.EdgeC) != 35 || f(g0.Power.DrawW) != 27 || f(g0.MemoryUsedPercent) != 3 {
		t.Errorf("GPU0 = %+v", g0)
	}
	if g1.PCIAddress != "0000:0b:00.0" || g1.Temperature != nil || g1.Power != nil || *g1.PCIe.Replays != 7 ||
		g1.PCIe.CurrentGen != 3 || g1.PCIe.MaxGen != 4 || g1.PCIe.MaxWidth != 16 {
		t.Errorf("GPU1 = %+v (N/A must stay unknown)", g1)
	}
}

func TestRocmSMIDetect(t *testing.T) {
	for _, tc := range []struct {
		data string
		want bool
	}{
		{`{"card0": {"PCI Bus": "0000:03:00.0"}}`, true},
		{`{"system": {"Driver version": "6.3.6"}}`, true},
		{`{"card0": "x"}`, false},
		{`{"gpu_data": [{"gpu": 0, "asic": {}}]}`, false},
		{`[{"gpu": 0, "bdf": "0000:03:00.0"}]`, false},
		{"GPU: 0\n    BDF: 0000:03:00.0\n", false},
		{"==== ROCm System Management Interface ====\n", true},
	} {
		got := rocmIsJSON([]byte(tc.data)) || rocmIsText([]byte(tc.data))
		if got != tc.want {
			t.Errorf("detect(%q) = %v, want %v", tc.data, got, tc.want)
		}
	}
}
