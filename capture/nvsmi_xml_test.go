package capture

import (
	"slices"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func TestNvidiaSMIXMLCaptures(t *testing.T) {
	cases := []struct {
		file         string
		gpus, claim  int
		driver, cuda string
		check        func(t *testing.T, s *snapshot.Snapshot)
	}{
		{"nvidia-smi-q-xml/a100-sxm4-80gb-mig-535.54.03.xml", 1, 4, "535.54.03", "12.2", checkXA100MIG},
		{"nvidia-smi-q-xml/a10g-aws-515.105.01.xml", 1, 1, "515.105.01", "11.7", checkXA10G},
		{"nvidia-smi-q-xml/rtx-a5000-x2-590.44.01.xml", 2, 2, "590.44.01", "13.1", checkXA5000},
		{"nvidia-smi-q-xml/rtx-pro-6000-blackwell-maxq-590.44.01.xml", 1, 1, "590.44.01", "13.1", checkXPro6000},
		{"nvidia-smi-q-xml/rtx3080-windows-536.40.xml", 1, 1, "536.40", "12.2", checkX3080},
		{"nvidia-smi-q-xml/quadro-p2000-525.125.06.xml", 1, 1, "525.125.06", "12.0", checkXP2000},
		{"nvidia-smi-q-xml/rtx3090-590.44.01.xml", 1, 1, "590.44.01", "13.1", checkX3090},
	}
	var files []string
	for _, c := range cases {
		files = append(files, c.file)
	}
	for _, f := range nvsmiFiles(t, "nvidia-smi-q-xml") {
		if !slices.Contains(files, f) {
			checkParses(t, f)
		}
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			s, err := ParseNvidiaSMIXML(nvsmiRead(t, c.file))
			if err != nil {
				t.Fatal(err)
			}
			nvsmiInvariants(t, s)
			if len(s.GPUs) != c.gpus {
				t.Fatalf("%d GPUs, want %d", len(s.GPUs), c.gpus)
			}
			if len(s.Claims) != 1 || s.Claims[0] != (snapshot.Claim{Source: kindNvsmiXML, What: "gpus", Count: c.claim, Detail: "attached_gpus"}) {
				t.Errorf("claims %+v, want attached_gpus %d", s.Claims, c.claim)
			}
			if s.Drivers.NVIDIAUser != c.driver || s.Drivers.CUDADriver != c.cuda || s.CollectedAt.IsZero() {
				t.Errorf("driver %q CUDA %q time %v", s.Drivers.NVIDIAUser, s.Drivers.CUDADriver, s.CollectedAt)
			}
			for _, g := range s.GPUs {
				if g.UUID == "" || g.VBIOS == "" || g.Model == "" || g.PCIe == nil || len(g.Throttle) != 9 {
					t.Errorf("GPU %s lacks basics: %+v", g.PCIAddress, g)
				}
			}
			c.check(t, s)
		})
	}
}

func checkXA100MIG(t *testing.T, s *snapshot.Snapshot) {
	g := nvsmiGPU(t, s, "0000:01:00.0")
	if g.Model != "NVIDIA A100-SXM4-80GB" || g.DeviceID != "20b2" || g.SubsystemID != "10de:147f" || g.VBIOS != "92.00.36.00.02" ||
		g.BoardPart != "692-2G506-0212-002" || g.Serial != "1650522003820" {
		t.Errorf("identity %q %q %q %q %q %q", g.Model, g.DeviceID, g.SubsystemID, g.VBIOS, g.BoardPart, g.Serial)
	}
	m := g.MIG
	if m == nil || !m.Enabled || !nvsmiEqB(m.PendingEnabled, true) || len(m.Instances) != 4 {
		t.Fatalf("MIG %+v, want enabled with 4 instances", m)
	}
	for i, in := range m.Instances {
		if in.GPUInstance != 3+i || in.ComputeInstance != 0 || in.SMs != 14 || in.MemoryBytes != 19968<<20 {
			t.Errorf("MIG instance %d: %+v", i, in)
		}
	}
	if p := g.PCIe; p.CurrentGen != 4 || p.MaxGen != 4 || p.HostMaxGen != 4 || p.CurrentWidth != 16 || !nvsmiEqF(p.TxKBps, 4000) {
		t.Errorf("PCIe %+v", p)
	}
	if e := g.ECC; !nvsmiEqB(e.Enabled, true) || !nvsmiEqU(e.VolatileUncorrectable, 0) {
		t.Errorf("ECC %+v", e)
	}
	// <remapped_rows>N/A</remapped_rows> and N/A utilization stay unknown.
	if g.RemappedRows != nil || g.UtilizationGPU != nil || g.RetiredPages != nil {
		t.Errorf("unknowns filled: rows %+v util %v pages %+v", g.RemappedRows, g.UtilizationGPU, g.RetiredPages)
	}
	if !nvsmiEqB(g.Persistence, false) || g.Virtualization != "None" || !nvsmiEqF(g.Temperature.ShutdownC, 92) || !nvsmiEqF(g.Power.LimitW, 500) {
		t.Errorf("persistence %v virt %q temp %+v power %+v", g.Persistence, g.Virtualization, g.Temperature, g.Power)
	}
	if len(nvsmiActive(g)) != 0 {
		t.Errorf("active reasons %v", nvsmiActive(g))
	}
	var noted bool
	for _, n := range s.Notes {
		noted = noted || strings.Contains(n.Message, "states 4 attached GPUs but holds 1")
	}
	if !noted {
		t.Errorf("no note about 4 claimed vs 1 held: %+v", s.Notes)
	}
}

func checkXA10G(t *testing.T, s *snapshot.Snapshot) {
	g := nvsmiGPU(t, s, "0000:00:1e.0")
	if p := g.PCIe; p.CurrentGen != 1 || p.MaxGen != 4 || p.CurrentWidth != 8 || p.MaxWidth != 16 || p.HostMaxGen != 0 {
		t.Errorf("PCIe %+v, want Gen1 x8 of Gen4 x16", p)
	}
	// The ids were zeroed before publication ("000000DE"): unknown, not "0000".
	if g.DeviceID != "" || g.SubsystemID != "" {
		t.Errorf("placeholder ids read as %q %q", g.DeviceID, g.SubsystemID)
	}
	if g.Virtualization != "Pass-Through" || g.VBIOS != "94.02.75.00.01" || g.Processes != 1 {
		t.Errorf("virt %q VBIOS %q processes %d", g.Virtualization, g.VBIOS, g.Processes)
	}
	// Schema v11: power_readings and clocks_throttle_reasons.
	if pw := g.Power; !nvsmiEqF(pw.DrawW, 25.58) || !nvsmiEqF(pw.LimitW, 300) || !nvsmiEqF(pw.EnforcedW, 300) {
		t.Errorf("power %+v", pw)
	}
	if !slices.Equal(nvsmiActive(g), []string{"idle"}) {
		t.Errorf("active %v", nvsmiActive(g))
	}
	if e := g.ECC; !nvsmiEqB(e.Enabled, true) || !nvsmiEqU(e.AggregateCorrectable, 0) {
		t.Errorf("ECC %+v", e)
	}
	if r := g.RemappedRows; r == nil || !nvsmiEqU(r.Correctable, 0) || !nvsmiEqB(r.Failure, false) {
		t.Errorf("remapped rows %+v", r)
	}
}

func checkXA5000(t *testing.T, s *snapshot.Snapshot) {
	if s.GPUs[0].PCIAddress != "0000:81:00.0" || s.GPUs[1].PCIAddress != "0000:c1:00.0" {
		t.Errorf("addresses %s %s", s.GPUs[0].PCIAddress, s.GPUs[1].PCIAddress)
	}
	for _, g := range s.GPUs {
		if g.VBIOS != "94.02.6D.00.0D" || g.Model != "NVIDIA RTX A5000" || g.DeviceID != "2231" {
			t.Errorf("GPU %s %q %q %q", g.PCIAddress, g.VBIOS, g.Model, g.DeviceID)
		}
		// ECC-capable card with ECC off.
		if e := g.ECC; !nvsmiEqB(e.Enabled, false) || !nvsmiEqB(e.Supported, true) {
			t.Errorf("GPU %s ECC %+v", g.PCIAddress, e)
		}
		if p := g.PCIe; p.CurrentGen != 1 || p.MaxGen != 4 || p.CurrentWidth != 16 {
			t.Errorf("GPU %s PCIe %+v", g.PCIAddress, p)
		}
		if g.Processes != 1 {
			t.Errorf("GPU %s processes %d", g.PCIAddress, g.Processes)
		}
		// Schema v13 counters.
		if r := nvsmiReason(t, &g, "sw_power_cap"); r.Microseconds == nil {
			t.Errorf("GPU %s sw_power_cap without counter", g.PCIAddress)
		}
	}
	if r := nvsmiReason(t, &s.GPUs[0], "sw_power_cap"); !nvsmiEqU(r.Microseconds, 31637354094) || r.Active {
		t.Errorf("81:00.0 sw_power_cap %+v", r)
	}
	if s.GPUs[0].Serial != "0123456789012" || s.GPUs[1].Serial != "1234567890123" {
		t.Errorf("serials %q %q", s.GPUs[0].Serial, s.GPUs[1].Serial)
	}
}

func checkXPro6000(t *testing.T, s *snapshot.Snapshot) {
	g := nvsmiGPU(t, s, "0000:61:00.0")
	if g.VBIOS != "98.02.6A.00.03" || g.Architecture != "Blackwell" || !nvsmiEqF(g.Power.LimitW, 300) {
		t.Errorf("VBIOS %q arch %q power %+v", g.VBIOS, g.Architecture, g.Power)
	}
	// Only T.Limit margins are printed: no thresholds.
	if tc := g.Temperature; !nvsmiEqF(tc.GPUC, 24) || tc.ShutdownC != nil || tc.SlowdownC != nil {
		t.Errorf("temperature %+v", tc)
	}
	// New v13 ECC fields are N/A and parse; ECC is off.
	if e := g.ECC; !nvsmiEqB(e.Enabled, false) || e.VolatileUncorrectable != nil {
		t.Errorf("ECC %+v", e)
	}
	if p := g.PCIe; p.CurrentGen != 1 || p.MaxGen != 5 || p.HostMaxGen != 4 || p.CurrentWidth != 16 {
		t.Errorf("PCIe %+v", p)
	}
	if !nvsmiEqF(g.Power.DrawW, 3.97) {
		t.Errorf("power draw %v (average_power_draw)", g.Power.DrawW)
	}
}

func checkX3080(t *testing.T, s *snapshot.Snapshot) {
	g := nvsmiGPU(t, s, "0000:04:00.0")
	if g.DriverModel != "WDDM" || g.Persistence != nil {
		t.Errorf("driver model %q persistence %v (N/A)", g.DriverModel, g.Persistence)
	}
	if g.Processes != 5 || g.PerformanceState != "P8" || g.Serial != "" {
		t.Errorf("processes %d pstate %s serial %q", g.Processes, g.PerformanceState, g.Serial)
	}
	if p := g.PCIe; p.CurrentGen != 4 || p.MaxGen != 4 || p.CurrentWidth != 16 || p.HostMaxGen != 0 {
		t.Errorf("PCIe %+v", p)
	}
	if e := g.ECC; !nvsmiEqB(e.Supported, false) || e.Enabled != nil {
		t.Errorf("ECC %+v", e)
	}
	if pw := g.Power; !nvsmiEqF(pw.LimitW, 336) || !nvsmiEqF(pw.DefaultLimitW, 320) {
		t.Errorf("power %+v", pw)
	}
}

func checkXP2000(t *testing.T, s *snapshot.Snapshot) {
	g := nvsmiGPU(t, s, "0000:17:00.0")
	if p := g.PCIe; p.CurrentGen != 1 || p.MaxGen != 3 || p.CurrentWidth != 8 || p.MaxWidth != 16 {
		t.Errorf("PCIe %+v, want Gen1 x8 of Gen3 x16", p)
	}
	if pw := g.Power; !nvsmiEqF(pw.DrawW, 4.61) || !nvsmiEqF(pw.MaxLimitW, 75) {
		t.Errorf("power %+v", pw)
	}
	// Pascal layout: single/double bit counters, all N/A.
	if e := g.ECC; !nvsmiEqB(e.Supported, false) || e.VolatileCorrectable != nil || e.AggregateUncorrectable != nil {
		t.Errorf("ECC %+v", e)
	}
	if g.Architecture != "Pascal" || g.SubsystemID != "1028:11b3" || g.DeviceID != "1c30" || !nvsmiEqF(g.Fans[0].Percent, 46) {
		t.Errorf("arch %q subsystem %q device %q fans %+v", g.Architecture, g.SubsystemID, g.DeviceID, g.Fans)
	}
}

func checkX3090(t *testing.T, s *snapshot.Snapshot) {
	g := nvsmiGPU(t, s, "0000:09:00.0")
	r := nvsmiReason(t, g, "sw_power_cap")
	if !r.Active || !nvsmiEqU(r.Microseconds, 9840338777) {
		t.Errorf("sw_power_cap %+v, want active with 9840338777 us", r)
	}
	if !slices.Equal(nvsmiActive(g), []string{"sw_power_cap"}) {
		t.Errorf("active %v", nvsmiActive(g))
	}
	if h := nvsmiReason(t, g, "hw_power_brake_slowdown"); h.Active || !nvsmiEqU(h.Microseconds, 0) {
		t.Errorf("hw_power_brake_slowdown %+v", h)
	}
	if g.PerformanceState != "P8" || !nvsmiEqF(g.Power.DrawW, 35.06) || !nvsmiEqF(g.Power.LimitW, 350) || g.SubsystemID != "1043:87ad" {
		t.Errorf("pstate %s power %+v subsystem %q", g.PerformanceState, g.Power, g.SubsystemID)
	}
	if p := g.PCIe; p.CurrentGen != 1 || p.MaxGen != 4 || p.CurrentWidth != 16 {
		t.Errorf("PCIe %+v", p)
	}
	if g.MIG != nil || g.Processes != 0 {
		t.Errorf("MIG %+v processes %d", g.MIG, g.Processes)
	}
}

func TestNvidiaSMIXMLWarningsAround(t *testing.T) {
	in := "WARNING: infoROM is corrupted at gpu 0000:17:00.0\n" + string(nvsmiRead(t, "nvidia-smi-q-xml/quadro-p2000-525.125.06.xml"))
	s, err := ParseNvidiaSMIXML([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	g := nvsmiGPU(t, s, "0000:17:00.0")
	if g.InfoROM == nil || !nvsmiEqB(g.InfoROM.Valid, false) || g.InfoROM.Image != "G410.0502.00.02" {
		t.Errorf("InfoROM %+v", g.InfoROM)
	}
	if !detectNvsmiXML("x", []byte(in)) {
		t.Error("detector misses a report with a warning line before it")
	}
}

func TestNvidiaSMIXMLTruncated(t *testing.T) {
	// A report cut in the middle of a value: the GPU is read, the value
	// cut short is not, and a note says so.
	in := "<?xml version=\"1.0\" ?>\n<nvidia_smi_log><driver_version>535.54.03</driver_version><gpu id=\"00000000:01:00.0\"><product_name>NVIDIA A1"
	s, err := ParseNvidiaSMIXML([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	// Cut after a whole GPU element: the GPU is read once.
	whole := "<nvidia_smi_log><gpu id=\"00000000:01:00.0\"><product_name>NVIDIA A100</product_name></gpu>"
	if w, err := ParseNvidiaSMIXML([]byte(whole)); err != nil {
		t.Errorf("cut after a GPU: %v", err)
	} else if len(w.GPUs) != 1 {
		t.Errorf("cut after a GPU: %d GPUs, want 1", len(w.GPUs))
	}
	if len(s.GPUs) != 1 || s.GPUs[0].PCIAddress != "0000:01:00.0" || s.GPUs[0].Model != "" || s.Drivers.NVIDIAUser != "535.54.03" {
		t.Errorf("GPUs %+v drivers %+v", s.GPUs, s.Drivers)
	}
	if len(s.Notes) == 0 || !strings.Contains(s.Notes[0].Message, "cut short") {
		t.Errorf("notes %+v", s.Notes)
	}
}

func TestNvidiaSMIXMLErrors(t *testing.T) {
	for name, in := range map[string]string{
		"not XML at all": "<nvidia_smi_log",
		"bad bus id":     "<nvidia_smi_log><gpu id=\"x\"><pci><pci_bus_id>zz:00.0</pci_bus_id></pci></gpu></nvidia_smi_log>",
	} {
		if _, err := ParseNvidiaSMIXML([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func FuzzNvidiaSMIXML(f *testing.F) {
	for _, p := range nvsmiFiles(f, "nvidia-smi-q-xml") {
		f.Add(nvsmiRead(f, p))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseNvidiaSMIXML(data)
		if err != nil {
			return
		}
		nvsmiInvariants(t, s)
	})
}
