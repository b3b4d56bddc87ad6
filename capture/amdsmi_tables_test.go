package capture

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

const amdCaptures = "../testdata/captures/amd-smi/"

func TestAMDSMIStaticJSONROCm7(t *testing.T) {
	path := amdCaptures + "mi300x-x8-rocm7.2.1-static.json"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Detect sees the first 64 KiB of a 100 KiB document.
	if !amdIsJSON(b[:detectHead]) || rocmIsJSON(b[:detectHead]) {
		t.Fatalf("the cut head is not detected as amd-smi JSON")
	}
	s := parseFile(t, path)
	if len(s.GPUs) != 8 || s.Drivers.AMDGPU != "6.16.13" || len(s.Events) != 0 || len(s.Notes) != 0 {
		t.Fatalf("%d GPUs, driver %q, events %v, notes %v", len(s.GPUs), s.Drivers.AMDGPU, s.Events, s.Notes)
	}
	for i, addr := range []string{"0000:1b:00.0", "0000:3d:00.0", "0000:4e:00.0", "0000:5f:00.0", "0000:9d:00.0", "0000:bd:00.0", "0000:cd:00.0", "0000:dd:00.0"} {
		g := s.GPUs[i]
		wantNUMA := 0
		if i >= 4 {
			wantNUMA = 1
		}
		if g.PCIAddress != addr || g.Model != "AMD Instinct MI300X" || g.DeviceID != "74a1" || g.GFXTarget != "gfx942" ||
			g.VBIOS != "00159017" || g.MemoryTotalBytes != 196592<<20 || g.NUMANode == nil || *g.NUMANode != wantNUMA {
			t.Errorf("GPU%d = %+v", i, g)
		}
		if f(g.Power.LimitW) != 750 || f(g.Power.MaxLimitW) != 750 || f(g.Power.MinLimitW) != 0 || g.Power.DrawW != nil {
			t.Errorf("GPU%d power %+v (ROCm 7 ppt0 limits)", i, g.Power)
		}
		if c := g.Clocks; c == nil || f(c.GraphicsMHz) != 132 || f(c.MaxGraphicsMHz) != 2100 || f(c.MemoryMHz) != 900 || f(c.MaxMemoryMHz) != 1300 {
			t.Errorf("GPU%d clocks %+v", i, c)
		}
		if g.ECC == nil || g.ECC.Enabled == nil || !*g.ECC.Enabled || g.ECC.VolatileUncorrectable != nil {
			t.Errorf("GPU%d ECC %+v (UMC block ENABLED, no counters)", i, g.ECC)
		}
		if f(g.Temperature.SlowdownC) != 100 || f(g.Temperature.ShutdownC) != 110 || g.Temperature.JunctionC != nil {
			t.Errorf("GPU%d temperature %+v", i, g.Temperature)
		}
	}
	// CPU affinity from the bitmasks: even CPUs for NUMA node 0, odd for 1.
	if a := s.GPUs[0].CPUAffinity; !strings.HasPrefix(a, "0,2,4,") || !strings.HasSuffix(a, ",124,126") || strings.Count(a, ",") != 63 {
		t.Errorf("GPU0 CPU affinity %q", a)
	}
	if a := s.GPUs[7].CPUAffinity; !strings.HasPrefix(a, "1,3,5,") || !strings.HasSuffix(a, ",125,127") {
		t.Errorf("GPU7 CPU affinity %q", a)
	}
	if s.GPUs[0].BoardPart != "102-G30211-0C" || s.GPUs[1].BoardPart != "102-G30213-0C" || s.GPUs[0].UniqueID != "0x28246ce5673b4aa0" {
		t.Errorf("board parts %q %q, unique id %q", s.GPUs[0].BoardPart, s.GPUs[1].BoardPart, s.GPUs[0].UniqueID)
	}
}

func TestAMDSMIStaticNonRoot(t *testing.T) {
	path := amdCaptures + "mi300x-x8-rocm7.2.1-static-nonroot.txt"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !amdIsJSON(b[:detectHead]) || amdIsText(b) || rocmIsText(b) {
		t.Fatalf("banner + JSON not detected as amd-smi JSON")
	}
	s := parseFile(t, path)
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(s.GPUs))
	}
	if len(s.Events) != 1 {
		t.Fatalf("events %+v, want the permission failure", s.Events)
	}
	e := s.Events[0]
	if e.Kind != snapshot.EventToolError || e.Reason != snapshot.ToolPermissionDenied || e.Device != "" ||
		!strings.Contains(e.Message, "/dev/kfd: Permission denied") || !strings.Contains(e.Message, "64 device(s) denied") {
		t.Errorf("event %+v", e)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "render group") {
		t.Errorf("notes %+v", s.Notes)
	}
	for _, g := range s.GPUs {
		// N/A stays unknown: no market name, device id, memory or driver.
		if g.PCIAddress == "" || g.DeviceID != "" || g.GFXTarget != "" || g.MemoryTotalBytes != 0 || g.VBIOS != "" ||
			g.UniqueID != "" || g.Model != "AMD Instinct MI300X OAM" || g.NUMANode == nil {
			t.Errorf("GPU%d = %+v", g.Index, g)
		}
	}
	if s.Drivers.AMDGPU != "" {
		t.Errorf("driver %q from N/A", s.Drivers.AMDGPU)
	}
}

func TestAMDSMIMonitor(t *testing.T) {
	s := parseFile(t, amdCaptures+"mi300x-x8-monitor-putm.txt")
	if s.Sources[0].Kind != "amd-smi" || len(s.GPUs) != 8 {
		t.Fatalf("kind %s, %d GPUs", s.Sources[0].Kind, len(s.GPUs))
	}
	want := []struct{ power, temp, mem, util, gfx, mclk float64 }{
		{182, 42, 41, 83, 1613, 1230}, {143, 40, 39, 13, 358, 1173}, {117, 41, 40, 0, 120, 900}, {116, 40, 38, 1, 134, 913},
		{118, 42, 40, 0, 120, 900}, {118, 39, 38, 0, 120, 900}, {116, 41, 41, 0, 120, 900}, {118, 40, 37, 0, 120, 900},
	}
	for i, w := range want {
		g := s.GPUs[i]
		if g.MatrixName != "GPU"+strconv.Itoa(i) || g.PCIAddress != "" || f(g.Power.DrawW) != w.power ||
			f(g.Temperature.JunctionC) != w.temp || f(g.Temperature.MemoryC) != w.mem || g.Temperature.EdgeC != nil ||
			f(g.UtilizationGPU) != w.util || f(g.Clocks.GraphicsMHz) != w.gfx || f(g.Clocks.MemoryMHz) != w.mclk ||
			g.PCIe != nil || g.Partition != nil || g.MemoryTotalBytes != 0 {
			t.Errorf("GPU%d = %+v", i, g)
		}
	}
}

func TestAMDSMIMonitorProcesses(t *testing.T) {
	s := parseFile(t, amdCaptures+"16gb-gpu-rvs-stress-monitor-q.txt")
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g := s.GPUs[0]
	if f(g.Power.DrawW) != 199 || f(g.Temperature.JunctionC) != 103 || f(g.Temperature.MemoryC) != 84 ||
		f(g.UtilizationGPU) != 99 || f(g.Clocks.GraphicsMHz) != 1920 || f(g.Clocks.MemoryMHz) != 1000 ||
		g.MemoryUsedBytes != 1235<<20 || g.MemoryTotalBytes != 16335<<20 || g.Processes != 1 {
		t.Errorf("GPU = %+v", g)
	}
	if g.ECC == nil || g.ECC.VolatileCorrectable == nil || *g.ECC.VolatileCorrectable != 0 || *g.ECC.VolatileUncorrectable != 0 || g.ECC.Enabled != nil {
		t.Errorf("ECC %+v", g.ECC)
	}
	if g.PCIe == nil || g.PCIe.Replays == nil || *g.PCIe.Replays != 0 || g.PCIe.TxKBps != nil {
		t.Errorf("PCIe %+v (PCIE_BW N/A stays unknown)", g.PCIe)
	}
}

func TestAMDSMIMonitorCPXFolded(t *testing.T) {
	s := parseFile(t, amdCaptures+"cpx-32-logical-gpus-monitor-ptv.txt")
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8 devices of 4 partitions", len(s.GPUs))
	}
	power := []float64{248, 221, 239, 219, 222, 241, 211, 227}
	for i, g := range s.GPUs {
		if g.Index != i || g.MatrixName != "GPU"+strconv.Itoa(4*i) || g.Partition == nil || g.Partition.Count != 4 ||
			g.Partition.Compute != "" || f(g.Power.DrawW) != power[i] || g.MemoryTotalBytes != 0 || g.MemoryUsedBytes != 0 {
			t.Errorf("GPU%d = %+v partition %+v", i, g, g.Partition)
		}
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "inferred") {
		t.Errorf("notes %+v", s.Notes)
	}
}

// TestAMDSMIMonitorNotFolded: rows that cannot be told apart into devices
// stay logical GPUs.
func TestAMDSMIMonitorNotFolded(t *testing.T) {
	var b strings.Builder
	b.WriteString("GPU  POWER  GPU_TEMP  MEM_TEMP\n")
	for i := 0; i < 16; i++ {
		b.WriteString("  " + strconv.Itoa(i) + "  120 W     40 °C     38 °C\n")
	}
	s, err := ParseBytes("monitor.txt", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 16 || s.GPUs[3].Partition != nil {
		t.Errorf("%d GPUs; identical rows must not be grouped", len(s.GPUs))
	}
}

func TestAMDSMIMonitorWatch(t *testing.T) {
	text := `TIMESTAMP  GPU  POWER  GPU_TEMP  MEM_TEMP  GFX_UTIL  SINGLE_ECC  DOUBLE_ECC
1730000000    0  300 W     60 C      50 C      90 %           0           0
1730000000    1    N/A      N/A       N/A       N/A         N/A         N/A
1730000005    0  310 W     61 C      51 C      95 %           3           1
`
	s, err := ParseBytes("watch.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g := s.GPUs[0]
	if f(g.Power.DrawW) != 310 || f(g.Temperature.JunctionC) != 61 || f(g.UtilizationGPU) != 95 ||
		*g.ECC.VolatileCorrectable != 3 || *g.ECC.VolatileUncorrectable != 1 {
		t.Errorf("GPU0 (last sample) = %+v ECC %+v", g, g.ECC)
	}
	if g := s.GPUs[1]; g.Power != nil || g.Temperature != nil || g.UtilizationGPU != nil || g.ECC != nil {
		t.Errorf("GPU1 = %+v: N/A must stay unknown", g)
	}
}

func TestAMDSMITopologyAccessWeight(t *testing.T) {
	s := parseFile(t, amdCaptures+"mi300x-x8-topology-access-weight.txt")
	addrs := []string{"0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0", "0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"}
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	for i, a := range addrs {
		if s.GPUs[i].PCIAddress != a {
			t.Errorf("GPU%d at %s, want %s", i, s.GPUs[i].PCIAddress, a)
		}
	}
	m := s.Matrix
	if m == nil || m.Source != "amd-smi" || len(m.Devices) != 8 || m.Weights == nil || m.Hops != nil {
		t.Fatalf("matrix %+v", m)
	}
	for i := range 8 {
		for j := range 8 {
			want, cell := 15, ""
			if i == j {
				want, cell = 0, "X"
			}
			if m.Weights[i][j] != want || m.Cells[i][j] != cell {
				t.Errorf("[%d][%d] = weight %d cell %q: no link type table, so no link type", i, j, m.Weights[i][j], m.Cells[i][j])
			}
		}
	}
	if len(s.Links) != 0 || len(s.Notes) != 0 {
		t.Errorf("links %v notes %v", s.Links, s.Notes)
	}
}

func TestAMDSMITopologyLinkTypes(t *testing.T) {
	text := `ACCESS TABLE:
             0000:05:00.0 0000:26:00.0 0000:46:00.0
0000:05:00.0 ENABLED      ENABLED      DISABLED
0000:26:00.0 ENABLED      ENABLED      ENABLED
0000:46:00.0 DISABLED     ENABLED      ENABLED

HOPS TABLE:
             0000:05:00.0 0000:26:00.0 0000:46:00.0
0000:05:00.0 0            1            2
0000:26:00.0 1            0            2
0000:46:00.0 2            2            0

LINK TYPE TABLE:
             0000:05:00.0 0000:26:00.0 0000:46:00.0
0000:05:00.0 SELF         XGMI         PCIE
0000:26:00.0 XGMI         SELF         N/A
0000:46:00.0 PCIE         N/A          SELF
`
	s, err := ParseBytes("topology.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 3 || s.Matrix == nil || s.Matrix.Cells[0][1] != "XGMI" || s.Matrix.Cells[1][2] != "" || s.Matrix.Hops[0][2] != 2 {
		t.Fatalf("GPUs %d matrix %+v", len(s.GPUs), s.Matrix)
	}
	if len(s.Links) != 2 || s.Links[0] != (snapshot.Link{A: "0000:05:00.0", B: "0000:26:00.0", Kind: snapshot.LinkXGMI, Hops: 1}) ||
		s.Links[1].Kind != snapshot.LinkPCIe || s.Links[1].Hops != 2 {
		t.Errorf("links %+v", s.Links)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0].Message, "0000:05:00.0-0000:46:00.0") {
		t.Errorf("notes %+v", s.Notes)
	}
}

func TestAMDSMIListRedactedAndASIC(t *testing.T) {
	s := parseFile(t, amdCaptures+"two-gpu-list-kfd-ids.txt")
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	for i, g := range s.GPUs {
		if g.UUID != "" || len(g.KFDNodes) != 1 || g.KFDNodes[0] != i+1 || g.PCIAddress == "" {
			t.Errorf("GPU%d = %+v (\"<redacted>\" is no UUID)", i, g)
		}
	}
	s = parseFile(t, amdCaptures+"mi308x-cpx-partition-static-asic.txt")
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	if g := s.GPUs[0]; g.Model != "MI308X" || g.DeviceID != "74a2" || g.GFXTarget != "gfx942" || g.UniqueID != "" {
		t.Errorf("GPU = %+v", g)
	}
}

func TestAMDToolErrorAlone(t *testing.T) {
	for _, tc := range []struct{ text, reason string }{
		{"ERROR:root:Driver not initialized (amdgpu not found in modules)\n", snapshot.ToolDriverUnreachable},
		{"AMDSMI Tool: 24.6.3\nERROR:root:Drivers not loaded (amdgpu, amd_hsmp, ionic, bnxt_en drivers not found in modules)\n", snapshot.ToolDriverUnreachable},
		{"ERROR:root:Unable to detect any GPU devices, check amdgpu version and module status (sudo modprobe amdgpu)\n", snapshot.ToolNoDevices},
	} {
		s, err := ParseBytes("rocm-smi.txt", []byte(tc.text))
		if err != nil {
			t.Fatalf("%q: %v", tc.text, err)
		}
		if s.Sources[0].Kind != "amd-smi-error" || len(s.Events) != 1 || s.Events[0].Reason != tc.reason || s.Events[0].Kind != snapshot.EventToolError {
			t.Errorf("%q: kind %s events %+v", tc.text, s.Sources[0].Kind, s.Events)
		}
	}
	if detectAMDToolError("", []byte("[    1.0] amdgpu 0000:03:00.0: amdgpu: SMU is initialized successfully!\n")) {
		t.Error("a kernel log line taken for a tool error")
	}
}

func TestAMDSMIStaticTextNoPermission(t *testing.T) {
	text := `Permission needed to access required GPU device node(s):
  • /dev/kfd: Permission denied
  • /dev/dri/renderD*: 2 device(s) denied

GPU: 0
    ASIC:
        MARKET_NAME: N/A
        DEVICE_ID: N/A
    BUS:
        BDF: 0000:03:00.0
    VRAM:
        SIZE: N/A
`
	s, err := ParseBytes("static.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.Sources[0].Kind != "amd-smi" || len(s.GPUs) != 1 || s.GPUs[0].PCIAddress != "0000:03:00.0" || s.GPUs[0].Model != "" || s.GPUs[0].MemoryTotalBytes != 0 {
		t.Fatalf("kind %s GPUs %+v", s.Sources[0].Kind, s.GPUs)
	}
	if len(s.Events) != 1 || s.Events[0].Reason != snapshot.ToolPermissionDenied || !strings.Contains(s.Events[0].Message, "2 device(s) denied") {
		t.Errorf("events %+v", s.Events)
	}
}

func TestAMDSMIJSONCut(t *testing.T) {
	b, err := os.ReadFile(amdDir + "list-metric-mi300x-x2.json")
	if err != nil {
		t.Fatal(err)
	}
	// The second document (metric) lost its closing brackets.
	cut := bytes.TrimRight(bytes.TrimSpace(b), "}] \n")
	s, err := ParseBytes("list-metric.json", cut)
	if err != nil {
		t.Fatal(err)
	}
	g := gpuAt(t, s, "0000:27:00.0")
	if len(s.GPUs) != 2 || g.PCIe == nil || g.PCIe.CurrentGen != 4 || !hasNote(s, "not whole") {
		t.Errorf("GPUs %+v notes %+v", s.GPUs, s.Notes)
	}
}
