package capture

import (
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func toolErrorsOf(s *snapshot.Snapshot) []snapshot.Event {
	var out []snapshot.Event
	for _, e := range s.Events {
		if e.Kind == snapshot.EventToolError {
			out = append(out, e)
		}
	}
	return out
}

func hasNote(s *snapshot.Snapshot, sub string) bool {
	for _, n := range s.Notes {
		if strings.Contains(n.Message, sub) {
			return true
		}
	}
	return false
}

func TestRocmSMIHungGPU(t *testing.T) {
	s := parseFile(t, rocmDir+"hung-gpu-after-kill-rocm4.x-concise.txt")
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	evs := toolErrorsOf(s)
	if len(evs) != 1 {
		t.Fatalf("tool errors %+v, want one for GPU[0]", evs)
	}
	if e := evs[0]; e.Reason != snapshot.ToolGPUError || e.Source != "rocm-smi" || e.Device != "" ||
		!strings.Contains(e.Message, "was not of the type that was expected") {
		t.Errorf("event %+v", e)
	}
	// Nothing read: the 0% fan, VRAM% and GPU% are what the failed reads left.
	if g := s.GPUs[0]; g.Temperature != nil || g.Power != nil || g.Clocks != nil || g.Fans != nil ||
		g.UtilizationGPU != nil || g.MemoryUsedPercent != nil || g.PerfLevel != "" {
		t.Errorf("GPU = %+v", g)
	}
	if !hasNote(s, "One or more commands failed") {
		t.Errorf("notes %+v", s.Notes)
	}
}

func TestRocmSMIAPUUnsupportedIsNotAFailure(t *testing.T) {
	s := parseFile(t, rocmDir+"rembrandt-680m-apu-rocm5.7-concise.txt")
	if len(s.GPUs) != 1 || len(toolErrorsOf(s)) != 0 {
		t.Fatalf("%d GPUs, tool errors %+v", len(s.GPUs), toolErrorsOf(s))
	}
	g := s.GPUs[0]
	if f(g.Temperature.EdgeC) != 53 || f(g.Power.DrawW) != 23.219 || g.Power.LimitW != nil || g.Clocks.GraphicsMHz != nil ||
		f(g.Clocks.MemoryMHz) != 800 || f(g.UtilizationGPU) != 100 || f(g.MemoryUsedPercent) != 73 || g.PerfLevel != "auto" {
		t.Errorf("GPU = %+v", g)
	}
	if !hasNote(s, "sclk clock is unsupported") || !hasNote(s, "get_power_cap, Not supported") {
		t.Errorf("notes %+v", s.Notes)
	}
}

func TestRocmSMICPXPartitionsFolded(t *testing.T) {
	s := parseFile(t, rocmDir+"mi300x-cpx-partitions-concise.txt")
	if len(s.GPUs) != 2 || len(toolErrorsOf(s)) != 0 {
		t.Fatalf("%d GPUs (want 2 devices), tool errors %+v", len(s.GPUs), toolErrorsOf(s))
	}
	g := s.GPUs[0]
	if g.DeviceID != "74a1" || f(g.Temperature.JunctionC) != 44 || f(g.Power.DrawW) != 151 || f(g.Power.LimitW) != 750 ||
		g.Partition == nil || g.Partition.Compute != "CPX" || g.Partition.Memory != "NPS1" || g.Partition.Count != 8 ||
		len(g.KFDNodes) != 8 || g.KFDNodes[0] != 2 || g.KFDNodes[7] != 9 || g.MatrixName != "GPU0" {
		t.Errorf("GPU0 = %+v partition %+v", g, g.Partition)
	}
	g = s.GPUs[1]
	// Only its first partition is in the capture (the table is cut): the
	// partition count is not known.
	if g.Index != 1 || f(g.Power.DrawW) != 158 || len(g.KFDNodes) != 1 || g.KFDNodes[0] != 10 ||
		g.Partition == nil || g.Partition.Compute != "CPX" || g.Partition.Count != 0 || g.MatrixName != "GPU8" {
		t.Errorf("GPU1 = %+v partition %+v", g, g.Partition)
	}
	if !hasNote(s, "cut short") {
		t.Errorf("notes %+v", s.Notes)
	}
}

func TestRocmSMIShowHW(t *testing.T) {
	s := parseFile(t, rocmDir+"mi300a-x4-tpx-showhw.txt")
	if len(s.GPUs) != 4 {
		t.Fatalf("%d GPUs, want 4 MI300A (12 partitions)", len(s.GPUs))
	}
	for i, addr := range []string{"0000:01:00.0", "0001:01:00.0", "0002:01:00.0", "0003:01:00.0"} {
		g := s.GPUs[i]
		if g.PCIAddress != addr || g.DeviceID != "74a0" || g.GFXTarget != "gfx942" || g.VBIOS != "" ||
			g.Partition == nil || g.Partition.Count != 3 || len(g.KFDNodes) != 3 || g.KFDNodes[0] != 4+3*i ||
			g.ECC == nil || g.ECC.Enabled == nil || *g.ECC.Enabled {
			t.Errorf("GPU%d = %+v partition %+v ECC %+v", i, g, g.Partition, g.ECC)
		}
	}
	if len(toolErrorsOf(s)) != 0 {
		t.Errorf("tool errors %+v", toolErrorsOf(s))
	}
}

func TestRocmSMIShowHWOldLayout(t *testing.T) {
	text := `======================= ROCm System Management Interface =======================
============================ Concise Hardware Info =============================
GPU  DID   GFX RAS   SDMA RAS  UMC RAS   VBIOS           BUS
0    7408  DISABLED  ENABLED   ENABLED   113-D65201-042  0000:C9:00.0
1    7408  DISABLED  ENABLED   N/A       113-D65201-042  0000:D1:00.0
================================================================================
============================= End of ROCm SMI Log ==============================
`
	s, err := ParseBytes("showhw.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g0, g1 := s.GPUs[0], s.GPUs[1]
	if g0.PCIAddress != "0000:c9:00.0" || g0.DeviceID != "7408" || g0.VBIOS != "113-D65201-042" || g0.ECC == nil || !*g0.ECC.Enabled || g0.Partition != nil {
		t.Errorf("GPU0 = %+v", g0)
	}
	if g1.PCIAddress != "0000:d1:00.0" || g1.ECC != nil {
		t.Errorf("GPU1 = %+v (UMC RAS N/A stays unknown)", g1)
	}
}

func TestRocmSMIConciseDIDLayouts(t *testing.T) {
	s := parseFile(t, rocmDir+"navi21-x2-rocm6.1.1-concise.txt")
	if len(s.GPUs) != 2 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g0, g1 := s.GPUs[0], s.GPUs[1]
	if g0.DeviceID != "73bf" || g1.DeviceID != "73a3" || g0.KFDNodes[0] != 1 || g1.KFDNodes[0] != 2 ||
		f(g0.Temperature.EdgeC) != 43 || f(g0.Power.LimitW) != 150 || f(g1.Power.LimitW) != 213 ||
		f(g0.Fans[0].Percent) != 0 || f(g1.Fans[0].Percent) != 20 || f(g0.Clocks.GraphicsMHz) != 0 || g0.PerfLevel != "manual" ||
		g0.Partition != nil {
		t.Errorf("GPUs = %+v / %+v", g0, g1)
	}

	s = parseFile(t, rocmDir+"mi300a-x4-concise-rocprofiler-sdk.txt")
	if len(s.GPUs) != 4 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	for i, g := range s.GPUs {
		if g.DeviceID != "74a0" || g.KFDNodes[0] != 4+i || f(g.Power.LimitW) != 550 || g.Temperature.JunctionC == nil ||
			g.Partition == nil || g.Partition.Compute != "SPX" || g.Partition.Count != 1 {
			t.Errorf("GPU%d = %+v", i, g)
		}
	}

	s = parseFile(t, rocmDir+"mi300x-vf-sriov-guest-rocm7-concise.txt")
	if g := s.GPUs[0]; len(s.GPUs) != 1 || g.DeviceID != "74b5" || f(g.MemoryUsedPercent) != 95 || f(g.Power.LimitW) != 750 ||
		f(g.Temperature.JunctionC) != 39 || len(toolErrorsOf(s)) != 0 {
		t.Errorf("VF = %+v", g)
	}

	s = parseFile(t, rocmDir+"mi300x-power-capped-concise.txt")
	if g := s.GPUs[0]; len(s.GPUs) != 1 || f(g.Power.DrawW) != 748 || f(g.Power.LimitW) != 750 || f(g.UtilizationGPU) != 99 ||
		f(g.Clocks.GraphicsMHz) != 1539 || f(g.Temperature.JunctionC) != 79 {
		t.Errorf("GPU = %+v", g)
	}
}

func TestRocmSMIConciseOldLayouts(t *testing.T) {
	s := parseFile(t, rocmDir+"mi210-x8-concise.txt")
	if len(s.GPUs) != 8 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	for _, g := range s.GPUs {
		// 0x0c34 is MI210's card (subsystem) id; its device id is 0x740f.
		if g.Model != "Instinct MI210" || g.DeviceID != "" || g.Partition != nil || f(g.Power.LimitW) != 300 || g.Temperature.EdgeC == nil {
			t.Errorf("GPU%d = %+v", g.Index, g)
		}
	}
	s = parseFile(t, rocmDir+"mi250-gcd-rocm5-concise.txt")
	if g := s.GPUs[0]; len(s.GPUs) != 1 || f(g.Temperature.EdgeC) != 50 || f(g.Power.DrawW) != 352 || f(g.Power.LimitW) != 560 ||
		f(g.UtilizationGPU) != 100 || f(g.MemoryUsedPercent) != 17 {
		t.Errorf("GPU = %+v", g)
	}
	// A card without a marketing name prints its device id as the name.
	text := `==================================== ROCm System Management Interface ====================================
============================================== Concise Info ==============================================
Device  [Model : Revision]    Temp    Power  Partitions      SCLK  MCLK   Fan  Perf  PwrCap  VRAM%  GPU%
        Name (20 chars)       (Edge)  (Avg)  (Mem, Compute)
==========================================================================================================
0       [0x7901 : 0xc8]       30.0°C  10.0W  N/A, N/A        0Mhz  96Mhz  0%   auto  327.0W    0%   0%
        0x744c
==========================================================================================================
========================================== End of ROCm SMI Log ===========================================
`
	s, err := ParseBytes("rocm-smi.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if g := s.GPUs[0]; g.DeviceID != "744c" || g.Model != "" {
		t.Errorf("GPU = %+v", g)
	}
}

func TestRocmSMINumaOnlyHasNoTopology(t *testing.T) {
	s := parseFile(t, rocmDir+"mi210-x8-showtoponuma.txt")
	if len(s.GPUs) != 8 || s.Matrix != nil || len(s.Links) != 0 {
		t.Fatalf("%d GPUs matrix %+v links %v", len(s.GPUs), s.Matrix, s.Links)
	}
	for i, want := range []int{3, 2, 1, 0, 7, 6, 5, 4} {
		if g := s.GPUs[i]; g.NUMANode == nil || *g.NUMANode != want {
			t.Errorf("GPU%d NUMA %v, want %d", i, g.NUMANode, want)
		}
	}
}

func TestRocmSMITPXTopologyUnsupportedWeight(t *testing.T) {
	s := parseFile(t, rocmDir+"mi300-tpx-showtopo-weight-unsupported.txt")
	if len(s.GPUs) != 12 || len(toolErrorsOf(s)) != 0 {
		t.Fatalf("%d GPUs, tool errors %+v", len(s.GPUs), toolErrorsOf(s))
	}
	if !hasNote(s, "Cannot read Link Weight: Not supported") || !hasNote(s, "get_link_weight_topology, Not supported") {
		t.Errorf("notes %+v", s.Notes)
	}
	if m := s.Matrix; m != nil {
		for i := range m.Cells {
			for j, c := range m.Cells[i] {
				if c == "XXXX" {
					t.Errorf("cell [%d][%d] XXXX kept as a link type", i, j)
				}
			}
		}
		if m.Weights != nil {
			t.Errorf("weights %v from a table of link types", m.Weights)
		}
	}
	// XXXX in a real link-type matrix is no link either.
	text := `============================ ROCm System Management Interface ============================
=============================== Link Type between two GPUs ===============================
       GPU0         GPU1         GPU2
GPU0   0            XXXX         XGMI
GPU1   XXXX         0            XGMI
GPU2   XGMI         XGMI         0
================================== End of ROCm SMI Log ===================================
`
	s, err := ParseBytes("topo.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.Matrix == nil || s.Matrix.Cells[0][1] != "" || s.Matrix.Cells[0][2] != "XGMI" || len(s.Links) != 2 {
		t.Errorf("matrix %+v links %+v", s.Matrix, s.Links)
	}
}

func TestRocmSMIROCm43NamesAndNUMA(t *testing.T) {
	s := parseFile(t, rocmDir+"rx6700xt-rocm4.3-showall.json")
	if len(s.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.Model != "" || g.DeviceID != "73df" || g.NUMANode == nil || *g.NUMANode != -1 || g.PCIAddress != "0000:07:00.0" {
		t.Errorf("GPU = %+v NUMA %v (Card series 0x1002 is no name; 4294967295 is -1)", g, g.NUMANode)
	}
}

func TestRocmSMIDriverUnreachable(t *testing.T) {
	text := `======================= ROCm System Management Interface =======================
ERROR:root:Driver not initialized (amdgpu not found in modules)
============================= End of ROCm SMI Log ==============================
`
	s, err := ParseBytes("rocm-smi.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	evs := toolErrorsOf(s)
	if len(s.GPUs) != 0 || len(evs) != 1 || evs[0].Reason != snapshot.ToolDriverUnreachable {
		t.Errorf("GPUs %d events %+v", len(s.GPUs), evs)
	}
}

func TestRocmSMIJSONCutHead(t *testing.T) {
	b := []byte(`{"card0": {"PCI Bus": "0000:03:00.0", "Card series": "Instinct MI100"}, "card1": {"PCI Bus": "0000:04:00.0", "Card ser`)
	if !rocmIsJSON(b) || amdIsJSON(b) {
		t.Fatal("cut rocm-smi JSON not detected")
	}
	s, err := parseRocmJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 2 || s.GPUs[0].Model != "Instinct MI100" || !hasNote(s, "not whole") {
		t.Errorf("GPUs %+v notes %+v", s.GPUs, s.Notes)
	}
}

func TestRocmSMIPartitionRowsAreNotFailures(t *testing.T) {
	text := `============================================ ROCm System Management Interface ============================================
====================================================== Concise Info ======================================================
Expected integer value from monitor, but got ""
Device  Node  IDs              Temp        Power     Partitions          SCLK    MCLK    Fan  Perf  PwrCap  VRAM%  GPU%
              (DID,     GUID)  (Junction)  (Socket)  (Mem, Compute, ID)
==========================================================================================================================
0       2     0x74a1,   18421  44.0°C      151.0W    NPS1, CPX, 0        132Mhz  900Mhz  0%   auto  750.0W  0%     0%
1       3     N/A,      48116  N/A         N/A       N/A, N/A, 1         N/A     N/A     0%   n/a   N/A     2%     N/A
2       4     N/A,      65524  N/A         N/A       N/A, N/A, 2         N/A     N/A     0%   n/a   N/A     2%     N/A
==========================================================================================================================
================================================== End of ROCm SMI Log ===================================================
`
	s, err := ParseBytes("rocm-smi.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GPUs) != 1 || s.GPUs[0].Partition.Count != 3 || len(toolErrorsOf(s)) != 0 {
		t.Errorf("GPUs %+v tool errors %+v", s.GPUs, toolErrorsOf(s))
	}
}
