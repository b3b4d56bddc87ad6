package capture

import (
	"slices"
	"strings"
	"testing"

	"kiln.dev/kiln/snapshot"
)

func parseQ(t *testing.T, rel string) *snapshot.Snapshot {
	t.Helper()
	s, err := ParseNvidiaSMIQ(nvsmiRead(t, rel))
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	nvsmiInvariants(t, s)
	return s
}

func TestNvidiaSMIQCaptures(t *testing.T) {
	cases := []struct {
		file         string
		gpus         int
		driver, cuda string
		check        func(t *testing.T, s *snapshot.Snapshot)
	}{
		{"nvidia-smi-q/h100x8-535.183.01-gpu75-slowdown.txt", 8, "535.183.01", "12.2", checkQH100},
		{"nvidia-smi-q/rtx4090x8-535.154.05-mixed-load.txt", 8, "535.154.05", "12.2", checkQ4090Mixed},
		{"nvidia-smi-q/rtx4090x8-535.154.05-gen5host-idle.txt", 8, "535.154.05", "12.2", checkQ4090Gen5Host},
		{"nvidia-smi-q/a100-sxm4-40gb-x8-azure-460.32.03.txt", 8, "460.32.03", "11.2", checkQA100Azure},
		{"nvidia-smi-q/titanv-560.35.03.txt", 1, "560.35.03", "12.6", checkQTitanV},
		{"nvidia-smi-perf/single-gpu-495.44-q-d-performance.txt", 1, "495.44", "11.5", checkQPerf},
	}
	var files []string
	for _, c := range cases {
		files = append(files, c.file)
	}
	for _, dir := range []string{"nvidia-smi-q", "nvidia-smi-perf"} {
		for _, f := range nvsmiFiles(t, dir) {
			if !slices.Contains(files, f) {
				checkParses(t, f)
			}
		}
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			s := parseQ(t, c.file)
			if len(s.GPUs) != c.gpus {
				t.Fatalf("%d GPUs, want %d", len(s.GPUs), c.gpus)
			}
			if s.Drivers.NVIDIAUser != c.driver || s.Drivers.CUDADriver != c.cuda {
				t.Errorf("driver %q CUDA %q, want %q %q", s.Drivers.NVIDIAUser, s.Drivers.CUDADriver, c.driver, c.cuda)
			}
			if len(s.Claims) != 1 || s.Claims[0].What != "gpus" || s.Claims[0].Count != c.gpus {
				t.Errorf("claims %+v, want one claim of %d gpus", s.Claims, c.gpus)
			}
			if s.CollectedAt.IsZero() {
				t.Error("timestamp not read")
			}
			for i, g := range s.GPUs {
				if g.Index != i || g.Vendor != snapshot.VendorNVIDIA {
					t.Errorf("GPU %d: index %d vendor %q", i, g.Index, g.Vendor)
				}
			}
			c.check(t, s)
		})
	}
}

func checkQH100(t *testing.T, s *snapshot.Snapshot) {
	wantBus := []string{"53", "64", "75", "86", "97", "a8", "b9", "ca"}
	for i, g := range s.GPUs {
		if want := "0000:" + wantBus[i] + ":00.0"; g.PCIAddress != want {
			t.Errorf("GPU %d at %s, want %s", i, g.PCIAddress, want)
		}
		if g.Model != "NVIDIA H100 80GB HBM3" || g.Architecture != "Hopper" || g.VBIOS != "96.00.74.00.01" ||
			g.DeviceID != "2330" || g.SubsystemID != "10de:16c1" || g.BoardPart != "692-2G520-0200-000" {
			t.Errorf("GPU %s identity: %q %q %q %q %q %q", g.PCIAddress, g.Model, g.Architecture, g.VBIOS, g.DeviceID, g.SubsystemID, g.BoardPart)
		}
		if g.InfoROM == nil || g.InfoROM.Image != "G520.0200.00.05" || g.InfoROM.Power != "" || g.InfoROM.Valid != nil {
			t.Errorf("GPU %s InfoROM %+v", g.PCIAddress, g.InfoROM)
		}
		p := g.PCIe
		if p == nil || p.CurrentGen != 5 || p.MaxGen != 5 || p.CurrentWidth != 16 || p.MaxWidth != 16 {
			t.Fatalf("GPU %s PCIe %+v, want Gen5 x16 of Gen5 x16", g.PCIAddress, p)
		}
		if p.HostMaxGen != 0 {
			t.Errorf("GPU %s: Host Max is N/A, read as %d", g.PCIAddress, p.HostMaxGen)
		}
		if p.Replays == nil || *p.Replays < 58 || *p.Replays > 120 || !nvsmiEqU(p.ReplayRollovers, 0) {
			t.Errorf("GPU %s replays %v rollovers %v", g.PCIAddress, p.Replays, p.ReplayRollovers)
		}
		if e := g.ECC; e == nil || !nvsmiEqB(e.Enabled, true) || !nvsmiEqB(e.Pending, true) || !nvsmiEqB(e.Supported, true) ||
			!nvsmiEqU(e.VolatileUncorrectable, 0) || !nvsmiEqU(e.AggregateCorrectable, 0) {
			t.Errorf("GPU %s ECC %+v", g.PCIAddress, e)
		}
		if g.RetiredPages != nil {
			t.Errorf("GPU %s: retired pages are all N/A, got %+v", g.PCIAddress, g.RetiredPages)
		}
		if r := g.RemappedRows; r == nil || !nvsmiEqU(r.Correctable, 0) || !nvsmiEqB(r.Pending, false) || !nvsmiEqB(r.Failure, false) {
			t.Errorf("GPU %s remapped rows %+v", g.PCIAddress, r)
		}
		if g.MIG == nil || g.MIG.Enabled || !nvsmiEqB(g.MIG.PendingEnabled, false) || len(g.MIG.Instances) != 0 {
			t.Errorf("GPU %s MIG %+v", g.PCIAddress, g.MIG)
		}
		if !nvsmiEqB(g.Persistence, true) || g.Virtualization != "Pass-Through" || g.ComputeMode != "Default" || g.DriverModel != "" {
			t.Errorf("GPU %s modes: persistence %v virt %q compute %q dm %q", g.PCIAddress, g.Persistence, g.Virtualization, g.ComputeMode, g.DriverModel)
		}
		if g.MemoryTotalBytes != 81559<<20 {
			t.Errorf("GPU %s memory %d", g.PCIAddress, g.MemoryTotalBytes)
		}
		if pw := g.Power; pw == nil || !nvsmiEqF(pw.LimitW, 700) || !nvsmiEqF(pw.DefaultLimitW, 700) || !nvsmiEqF(pw.MinLimitW, 200) || !nvsmiEqF(pw.MaxLimitW, 700) || pw.EnforcedW != nil {
			t.Errorf("GPU %s power %+v", g.PCIAddress, pw)
		}
		// This driver prints only T.Limit margins: no absolute thresholds.
		if tc := g.Temperature; tc == nil || tc.GPUC == nil || tc.ShutdownC != nil || tc.SlowdownC != nil || tc.MaxOpC != nil {
			t.Errorf("GPU %s temperature %+v", g.PCIAddress, tc)
		}
		if len(g.Fans) != 0 {
			t.Errorf("GPU %s: fan speed is N/A, got %+v", g.PCIAddress, g.Fans)
		}
		if len(g.Throttle) != 9 {
			t.Errorf("GPU %s: %d throttle reasons, want 9", g.PCIAddress, len(g.Throttle))
		}
	}
	if r := nvsmiGPU(t, s, "0000:53:00.0").PCIe.Replays; !nvsmiEqU(r, 120) {
		t.Errorf("53:00.0 replays %v, want 120", r)
	}
	if r := nvsmiGPU(t, s, "0000:a8:00.0").PCIe.Replays; !nvsmiEqU(r, 93) {
		t.Errorf("a8:00.0 replays %v, want 93", r)
	}
	g := nvsmiGPU(t, s, "0000:75:00.0")
	// Each reason as read: the parent HW Slowdown is Not Active while its
	// child HW Power Brake Slowdown is Active.
	if got := nvsmiActive(g); !slices.Equal(got, []string{"sw_power_cap", "hw_power_brake_slowdown", "sw_thermal_slowdown"}) {
		t.Errorf("75:00.0 active reasons %v", got)
	}
	if nvsmiReason(t, g, "hw_slowdown").Active || nvsmiReason(t, g, "idle").Active || nvsmiReason(t, g, "hw_thermal_slowdown").Active {
		t.Error("75:00.0: a Not Active reason read as active")
	}
	if g.Processes != 1 || !nvsmiEqF(g.Power.DrawW, 118.01) || !nvsmiEqF(g.Temperature.GPUC, 39) {
		t.Errorf("75:00.0 processes %d draw %v temp %v", g.Processes, g.Power.DrawW, g.Temperature.GPUC)
	}
	if g := nvsmiGPU(t, s, "0000:53:00.0"); g.Processes != 0 || !slices.Equal(nvsmiActive(g), []string{"idle"}) {
		t.Errorf("53:00.0 processes %d active %v", g.Processes, nvsmiActive(g))
	}
	if fm := s.Drivers.FabricManager; fm == nil || fm.State != "Completed" || fm.Status != "Success" {
		t.Errorf("fabric %+v", fm)
	}
}

func checkQ4090Mixed(t *testing.T, s *snapshot.Snapshot) {
	gen1 := map[string]bool{"0000:81:00.0": true, "0000:a1:00.0": true, "0000:e1:00.0": true}
	for _, g := range s.GPUs {
		if g.Model != "NVIDIA GeForce RTX 4090" || g.VBIOS != "95.02.18.C0.09" || g.DeviceID != "2684" {
			t.Errorf("GPU %s identity %q %q %q", g.PCIAddress, g.Model, g.VBIOS, g.DeviceID)
		}
		if g.Serial != "" || g.BoardPart != "" {
			t.Errorf("GPU %s: serial and board part are N/A, got %q %q", g.PCIAddress, g.Serial, g.BoardPart)
		}
		p := g.PCIe
		wantGen := 4
		if gen1[g.PCIAddress] {
			wantGen = 1
		}
		if p.CurrentGen != wantGen || p.MaxGen != 4 || p.HostMaxGen != 4 || p.CurrentWidth != 16 || p.MaxWidth != 16 {
			t.Errorf("GPU %s PCIe %+v, want Gen%d x16 (max 4, host 4)", g.PCIAddress, p, wantGen)
		}
		if gen1[g.PCIAddress] != slices.Contains(nvsmiActive(&g), "idle") || gen1[g.PCIAddress] != (g.PerformanceState == "P8") {
			t.Errorf("GPU %s: %s with active reasons %v", g.PCIAddress, g.PerformanceState, nvsmiActive(&g))
		}
		// ECC capable, switched off; the counters are N/A.
		if e := g.ECC; e == nil || !nvsmiEqB(e.Enabled, false) || !nvsmiEqB(e.Supported, true) || e.VolatileUncorrectable != nil {
			t.Errorf("GPU %s ECC %+v", g.PCIAddress, e)
		}
		if g.MIG != nil {
			t.Errorf("GPU %s: MIG mode is N/A, got %+v", g.PCIAddress, g.MIG)
		}
		if len(g.Fans) != 1 || g.Fans[0].Percent == nil {
			t.Errorf("GPU %s fans %+v", g.PCIAddress, g.Fans)
		}
	}
	c1 := nvsmiGPU(t, s, "0000:c1:00.0")
	if !nvsmiEqF(c1.Power.DrawW, 313.42) || !nvsmiEqF(c1.Temperature.GPUC, 62) || !nvsmiEqF(c1.Fans[0].Percent, 74) || c1.Processes != 1 {
		t.Errorf("c1:00.0 draw %v temp %v fan %v processes %d", c1.Power.DrawW, c1.Temperature.GPUC, c1.Fans[0].Percent, c1.Processes)
	}
	if g := nvsmiGPU(t, s, "0000:01:00.0"); g.MemoryUsedBytes != 20328<<20 || g.MemoryTotalBytes != 24564<<20 || g.PerformanceState != "P2" {
		t.Errorf("01:00.0 memory %d/%d %s", g.MemoryUsedBytes, g.MemoryTotalBytes, g.PerformanceState)
	}
	if g := nvsmiGPU(t, s, "0000:a1:00.0"); g.Processes != 0 {
		t.Errorf("a1:00.0 processes %d, want 0", g.Processes)
	}
	if s.Drivers.FabricManager != nil {
		t.Errorf("fabric state is N/A, got %+v", s.Drivers.FabricManager)
	}
}

func checkQ4090Gen5Host(t *testing.T, s *snapshot.Snapshot) {
	for _, g := range s.GPUs {
		p := g.PCIe
		if p.CurrentGen != 1 || p.MaxGen != 4 || p.HostMaxGen != 5 || p.CurrentWidth != 16 {
			t.Errorf("GPU %s PCIe %+v, want Gen1 x16, device max 4, host max 5", g.PCIAddress, p)
		}
		if g.VBIOS != "95.02.3C.00.02" || g.PerformanceState != "P8" || !nvsmiReason(t, &g, "idle").Active {
			t.Errorf("GPU %s: VBIOS %q %s", g.PCIAddress, g.VBIOS, g.PerformanceState)
		}
		if g.BoardPart != "" {
			t.Errorf("GPU %s board part %q: \"Board Part Number\" is N/A and the GPU part number is not a board part", g.PCIAddress, g.BoardPart)
		}
		if len(g.Fans) != 1 || g.Fans[0].Percent == nil || *g.Fans[0].Percent < 65 || *g.Fans[0].Percent > 75 {
			t.Errorf("GPU %s fans %+v", g.PCIAddress, g.Fans)
		}
	}
	if s.GPUs[0].PCIAddress != "0000:01:00.0" || s.GPUs[1].PCIAddress != "0000:21:00.0" || s.GPUs[7].PCIAddress != "0000:e1:00.0" {
		t.Errorf("addresses %s %s %s", s.GPUs[0].PCIAddress, s.GPUs[1].PCIAddress, s.GPUs[7].PCIAddress)
	}
	if g := s.GPUs[0]; !nvsmiEqF(g.Fans[0].Percent, 72) || !nvsmiEqF(g.Power.DrawW, 17.11) {
		t.Errorf("01:00.0 fan %v draw %v", g.Fans[0].Percent, g.Power.DrawW)
	}
}

func checkQA100Azure(t *testing.T, s *snapshot.Snapshot) {
	domains := []string{"0001", "0002", "0003", "0004", "000b", "000c", "000d", "000e"}
	for i, g := range s.GPUs {
		if want := domains[i] + ":00:00.0"; g.PCIAddress != want {
			t.Errorf("GPU %d at %s, want %s", i, g.PCIAddress, want)
		}
		if g.Model != "A100-SXM4-40GB" || g.DeviceID != "20b0" || g.VBIOS != "92.00.36.00.04" || g.Virtualization != "Pass-Through" {
			t.Errorf("GPU %s: %q %q %q %q", g.PCIAddress, g.Model, g.DeviceID, g.VBIOS, g.Virtualization)
		}
		// This driver prints the board part number as "GPU Part Number".
		if g.BoardPart != "692-2G506-0200-000" {
			t.Errorf("GPU %s board part %q", g.PCIAddress, g.BoardPart)
		}
		// Old spellings: "Ecc Mode", "Clocks Throttle Reasons".
		if e := g.ECC; e == nil || !nvsmiEqB(e.Enabled, true) || !nvsmiEqU(e.AggregateUncorrectable, 0) {
			t.Errorf("GPU %s ECC %+v", g.PCIAddress, e)
		}
		if !slices.Equal(nvsmiActive(&g), []string{"idle"}) || len(g.Throttle) != 9 {
			t.Errorf("GPU %s throttle %+v", g.PCIAddress, g.Throttle)
		}
		if !nvsmiEqB(g.Persistence, false) {
			t.Errorf("GPU %s persistence %v, want Disabled", g.PCIAddress, g.Persistence)
		}
		if p := g.PCIe; p.CurrentGen != 4 || p.MaxGen != 4 || p.MaxWidth != 16 || p.HostMaxGen != 0 || !nvsmiEqU(p.Replays, 0) {
			t.Errorf("GPU %s PCIe %+v", g.PCIAddress, p)
		}
		if tc := g.Temperature; !nvsmiEqF(tc.ShutdownC, 92) || !nvsmiEqF(tc.SlowdownC, 89) || !nvsmiEqF(tc.MaxOpC, 85) || !nvsmiEqF(tc.MemMaxC, 95) {
			t.Errorf("GPU %s thresholds %+v", g.PCIAddress, tc)
		}
		if pw := g.Power; !nvsmiEqF(pw.LimitW, 400) || !nvsmiEqF(pw.EnforcedW, 400) {
			t.Errorf("GPU %s power %+v", g.PCIAddress, pw)
		}
		if r := g.RemappedRows; r == nil || !nvsmiEqU(r.Uncorrectable, 0) || !nvsmiEqB(r.Pending, false) {
			t.Errorf("GPU %s remapped rows %+v", g.PCIAddress, r)
		}
		if g.MIG == nil || g.MIG.Enabled {
			t.Errorf("GPU %s MIG %+v", g.PCIAddress, g.MIG)
		}
	}
}

func checkQTitanV(t *testing.T, s *snapshot.Snapshot) {
	g := s.GPUs[0]
	if g.PCIAddress != "0000:01:00.0" || g.Model != "NVIDIA TITAN V" || g.VBIOS != "88.00.36.00.01" || g.BoardPart != "900-1G500-2500-000" {
		t.Errorf("identity %s %q %q %q", g.PCIAddress, g.Model, g.VBIOS, g.BoardPart)
	}
	// ECC Mode N/A: the card has no ECC; the counters stay unknown.
	if e := g.ECC; e == nil || !nvsmiEqB(e.Supported, false) || e.Enabled != nil || e.VolatileCorrectable != nil || e.AggregateUncorrectable != nil {
		t.Errorf("ECC %+v", e)
	}
	if g.RemappedRows != nil || g.MIG != nil {
		t.Errorf("remapped rows %+v MIG %+v: both N/A", g.RemappedRows, g.MIG)
	}
	if p := g.PCIe; p.CurrentGen != 1 || p.MaxGen != 3 || p.HostMaxGen != 3 || p.CurrentWidth != 16 {
		t.Errorf("PCIe %+v", p)
	}
	if g.Processes != 3 || !nvsmiEqB(g.Persistence, false) || g.InfoROM.ECC != "" {
		t.Errorf("processes %d persistence %v inforom %+v", g.Processes, g.Persistence, g.InfoROM)
	}
	if tc := g.Temperature; !nvsmiEqF(tc.ShutdownC, 100) || !nvsmiEqF(tc.SlowdownC, 97) || !nvsmiEqF(tc.MaxOpC, 91) || !nvsmiEqF(tc.MemoryC, 41) {
		t.Errorf("temperature %+v", tc)
	}
	if !nvsmiEqF(g.Power.MaxLimitW, 300) || !nvsmiEqF(g.Clocks.MaxGraphicsMHz, 1912) || !nvsmiEqF(g.Fans[0].Percent, 30) {
		t.Errorf("power %+v clocks %+v fans %+v", g.Power, g.Clocks, g.Fans)
	}
}

func checkQPerf(t *testing.T, s *snapshot.Snapshot) {
	g := s.GPUs[0]
	if g.PCIAddress != "0000:0e:00.0" || g.PerformanceState != "P0" {
		t.Errorf("GPU %s %s", g.PCIAddress, g.PerformanceState)
	}
	if !slices.Equal(nvsmiActive(&g), []string{"idle"}) || len(g.Throttle) != 9 {
		t.Errorf("throttle %+v", g.Throttle)
	}
	// The short layout holds nothing else: nothing else is filled in.
	if g.Model != "" || g.PCIe != nil || g.Power != nil || g.ECC != nil || g.MIG != nil || g.Temperature != nil {
		t.Errorf("fields filled from a PERFORMANCE-only report: %+v", g)
	}
}

// The layouts below are small hand-made variations of the real captures'
// structure, for what no capture in the set shows.

const qHeader = `==============NVSMI LOG==============

Timestamp                                 : Fri Jun 21 02:03:08 2024
Driver Version                            : 550.54.15
CUDA Version                              : 12.4

Attached GPUs                             : 2
`

func TestNvidiaSMIQCountersMIGAndWarnings(t *testing.T) {
	in := "WARNING: infoROM is corrupted at gpu 0000:07:00.0\n" + qHeader + `GPU 00000000:07:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    MIG Mode
        Current                           : Enabled
        Pending                           : Disabled
    MIG devices
        MIG Device
            GPU Instance ID               : 1
            Compute Instance ID           : 0
            Device Attributes
                Shared
                    Multiprocessor count  : 42
            FB Memory Usage
                Total                     : 40192 MiB
    PCI
        GPU Link Info
            PCIe Generation
                Max                       : 5x
                Current                   : 4
    Clocks Event Reasons
        SW Power Cap                      : Active
        HW Slowdown                       : Not Active
    Clocks Event Reasons Counters
        SW Power Capping                  : 3737587 us
        HW Power Braking                  : 0 us
    Fabric
        State                             : In Progress
        Status                            : N/A
`
	s, err := ParseNvidiaSMIQ([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	nvsmiInvariants(t, s)
	g := nvsmiGPU(t, s, "0000:07:00.0")
	if g.InfoROM == nil || !nvsmiEqB(g.InfoROM.Valid, false) {
		t.Errorf("InfoROM %+v, want Valid=false from the WARNING line", g.InfoROM)
	}
	if m := g.MIG; m == nil || !m.Enabled || !nvsmiEqB(m.PendingEnabled, false) || len(m.Instances) != 1 ||
		m.Instances[0] != (snapshot.MIGInstance{GPUInstance: 1, ComputeInstance: 0, SMs: 42, MemoryBytes: 40192 << 20}) {
		t.Errorf("MIG %+v", m)
	}
	if r := nvsmiReason(t, g, "sw_power_cap"); !r.Active || !nvsmiEqU(r.Microseconds, 3737587) {
		t.Errorf("sw_power_cap %+v", r)
	}
	if r := nvsmiReason(t, g, "hw_slowdown"); r.Active || r.Microseconds != nil {
		t.Errorf("hw_slowdown %+v", r)
	}
	// "Max : 5x" cannot be read: unknown, and said in a note with its line.
	if g.PCIe == nil || g.PCIe.MaxGen != 0 || g.PCIe.CurrentGen != 4 {
		t.Errorf("PCIe %+v", g.PCIe)
	}
	var msgs []string
	for _, n := range s.Notes {
		msgs = append(msgs, n.Message)
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{`GPU 0000:07:00.0: line 26 (Max): cannot read "5x" as a PCIe generation`, "infoROM is corrupted", "states 2 attached GPUs but holds 1"} {
		if !strings.Contains(all, want) {
			t.Errorf("notes %q lack %q", all, want)
		}
	}
	if fm := s.Drivers.FabricManager; fm == nil || fm.State != "In Progress" || fm.Status != "" {
		t.Errorf("fabric %+v", fm)
	}
}

func TestNvidiaSMIQErrors(t *testing.T) {
	for name, in := range map[string]string{
		"not a report": "hello\nworld\n",
		"bad header":   qHeader + "GPU 00000000:zz:00.0\n    Product Name : x\n",
	} {
		if _, err := ParseNvidiaSMIQ([]byte(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// A report that lists no GPU is not an error; its claim is kept.
	s, err := ParseNvidiaSMIQ([]byte(qHeader))
	if err != nil || len(s.GPUs) != 0 || len(s.Claims) != 1 || s.Claims[0].Count != 2 {
		t.Errorf("empty report: %v %+v", err, s)
	}
}

func FuzzNvidiaSMIQ(f *testing.F) {
	for _, dir := range []string{"nvidia-smi-q", "nvidia-smi-perf"} {
		for _, p := range nvsmiFiles(f, dir) {
			f.Add(nvsmiRead(f, p))
		}
	}
	f.Add([]byte(qHeader + "GPU 0000:01:00.0\n    MIG devices\n        MIG Device\n            GPU Instance ID : 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseNvidiaSMIQ(data)
		if err != nil {
			return
		}
		nvsmiInvariants(t, s)
	})
}
