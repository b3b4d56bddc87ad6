package doctor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

var p = snapshot.Ptr[float64]

func u64(v uint64) *uint64 { return &v }
func b(v bool) *bool       { return &v }
func i(v int) *int         { return &v }

// healthy returns a clean 2-GPU H100 node: both GPUs busy at Gen5 x16 under
// one PCIe switch with a NIC beside them, 18 active NVLinks each to the
// NVSwitch fabric, fabric manager running, ECC on with no errors.
func healthy() *snapshot.Snapshot {
	s := snapshot.New()
	s.Host = snapshot.Host{Hostname: "gpu01", CPUSet: "0-63", OnlineCPUs: "0-63"}
	s.Drivers = snapshot.Drivers{NVIDIAKernel: "550.90.07", NVIDIAUser: "550.90.07", CUDADriver: "12.4",
		NouveauLoaded: b(false),
		FabricManager: &snapshot.FabricManager{Installed: b(true), Running: b(true), State: "Completed", Status: "Success"}}
	link := func(cur, w int) *snapshot.PCIeLink {
		return &snapshot.PCIeLink{CurrentGen: cur, MaxGen: 5, CurrentWidth: w, MaxWidth: 16}
	}
	s.PCI = []snapshot.PCIDevice{
		{Address: "0000:15:01.0", Kind: snapshot.KindRootPort, Link: link(5, 16), NUMANode: i(0)},
		{Address: "0000:16:00.0", Kind: snapshot.KindSwitchUp, Parent: "0000:15:01.0", Link: link(5, 16)},
		{Address: "0000:17:00.0", Kind: snapshot.KindSwitchDown, Parent: "0000:16:00.0", Link: link(5, 16), ACS: &snapshot.ACS{}},
		{Address: "0000:17:01.0", Kind: snapshot.KindSwitchDown, Parent: "0000:16:00.0", Link: link(5, 16), ACS: &snapshot.ACS{}},
		{Address: "0000:17:02.0", Kind: snapshot.KindSwitchDown, Parent: "0000:16:00.0", Link: link(5, 16)},
		{Address: "0000:18:00.0", Kind: snapshot.KindGPU, VendorID: "10de", DeviceID: "2330", Parent: "0000:17:00.0", Link: link(5, 16), NUMANode: i(0)},
		{Address: "0000:19:00.0", Kind: snapshot.KindGPU, VendorID: "10de", DeviceID: "2330", Parent: "0000:17:01.0", Link: link(5, 16), NUMANode: i(0)},
		{Address: "0000:1a:00.0", Kind: snapshot.KindNIC, VendorID: "15b3", Parent: "0000:17:02.0", Link: link(5, 16), NUMANode: i(0), Interface: "mlx5_0"},
		{Address: "0000:83:00.0", Kind: snapshot.KindNVSwitch, VendorID: "10de", DeviceID: "22a3"},
	}
	for n, a := range []string{"0000:18:00.0", "0000:19:00.0"} {
		g := snapshot.GPU{
			Index: n, Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", PCIAddress: a, DeviceID: "2330",
			UUID: fmt.Sprintf("GPU-%d", n), VBIOS: "96.00.74.00.01", MemoryTotalBytes: 80 << 30,
			InfoROM:          &snapshot.InfoROM{Image: "G520.0200.00.05", Valid: b(true)},
			PerformanceState: "P0", UtilizationGPU: p(95), Persistence: b(true),
			Power:        &snapshot.Power{DrawW: p(650), LimitW: p(700), DefaultLimitW: p(700)},
			Temperature:  &snapshot.Temperature{GPUC: p(60), MemoryC: p(70), SlowdownC: p(90), ShutdownC: p(95), MemMaxC: p(95)},
			ECC:          &snapshot.ECC{Enabled: b(true), Pending: b(true), VolatileCorrectable: u64(0), VolatileUncorrectable: u64(0), AggregateUncorrectable: u64(0)},
			RetiredPages: &snapshot.RetiredPages{Pending: b(false)},
			RemappedRows: &snapshot.RemappedRows{Correctable: u64(0), Uncorrectable: u64(0), Pending: b(false), Failure: b(false)},
			Throttle: []snapshot.ThrottleReason{{Name: "idle"}, {Name: "sw_power_cap"}, {Name: "hw_slowdown"},
				{Name: "hw_power_brake_slowdown"}, {Name: "sw_thermal_slowdown"}, {Name: "hw_thermal_slowdown"}},
			MIG:      &snapshot.MIG{Enabled: false, PendingEnabled: b(false)},
			PCIe:     &snapshot.PCIeLink{CurrentGen: 5, MaxGen: 5, CurrentWidth: 16, MaxWidth: 16, Replays: u64(0)},
			Upstream: []string{fmt.Sprintf("0000:17:0%d.0", n), "0000:16:00.0", "0000:15:01.0"},
			NUMANode: i(0),
			Fans:     nil,
		}
		for l := 0; l < 18; l++ {
			g.NVLinks = append(g.NVLinks, snapshot.NVLink{Link: l, State: "active", Version: 4, SpeedGBps: 26.562, RemoteKind: snapshot.KindNVSwitch, RemotePCI: "0000:83:00.0"})
		}
		s.GPUs = append(s.GPUs, g)
	}
	return s
}

func run(t *testing.T, s *snapshot.Snapshot) *Report {
	t.Helper()
	rep, err := Run(context.Background(), s, kb.Default())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func has(rep *Report, id string, sev Severity, dev string) bool {
	for _, f := range rep.Findings {
		if f.ID != id || f.Severity != sev {
			continue
		}
		if dev == "" {
			return true
		}
		for _, d := range f.Devices {
			if d == dev {
				return true
			}
		}
	}
	return false
}

func ids(rep *Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, fmt.Sprintf("%s/%s%v", f.ID, f.Severity, f.Devices))
	}
	return out
}

func TestHealthyNodeIsQuiet(t *testing.T) {
	rep := run(t, healthy())
	if len(rep.Findings) != 0 {
		t.Fatalf("healthy node reported %v", ids(rep))
	}
	if rep.ExitCode() != ExitHealthy {
		t.Fatalf("exit %d", rep.ExitCode())
	}
}

const g0, g1 = "0000:18:00.0", "0000:19:00.0"

// TestChecksFire: every finding id fires on a node broken in that one way.
// TestHealthyNodeIsQuiet is the case where each must not fire; the quiet
// cases below cover the look-alikes that must not fire either.
func TestChecksFire(t *testing.T) {
	cases := []struct {
		id     string
		sev    Severity
		dev    string
		breakf func(s *snapshot.Snapshot)
	}{
		{"pcie-link-downtrained", Warning, g1, func(s *snapshot.Snapshot) { s.GPUs[1].PCIe.CurrentWidth = 8 }},
		{"pcie-link-downtrained", Warning, g1, func(s *snapshot.Snapshot) { s.GPUs[1].PCIe.CurrentGen = 3 }},
		{"pcie-link-downtrained", Info, g1, func(s *snapshot.Snapshot) {
			g := &s.GPUs[1]
			g.PCIe.CurrentGen, g.PerformanceState, g.UtilizationGPU = 3, "", nil
		}},
		{"pcie-link-downtrained", Warning, "0000:1a:00.0", func(s *snapshot.Snapshot) { s.PCI[7].Link.CurrentWidth = 4 }},
		{"pcie-upstream-bottleneck", Warning, g0, func(s *snapshot.Snapshot) {
			s.PCI[0].Link = &snapshot.PCIeLink{CurrentGen: 4, MaxGen: 4, CurrentWidth: 16, MaxWidth: 16}
		}},
		{"pcie-acs-blocks-p2p", Warning, "0000:17:01.0", func(s *snapshot.Snapshot) { s.PCI[3].ACS.ReqRedir = true }},
		{"pcie-replays", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].PCIe.Replays = u64(120) }},
		{"pcie-replays", Info, g0, func(s *snapshot.Snapshot) { s.GPUs[0].PCIe.Replays = u64(3) }},
		{"pcie-aer-errors", Warning, g0, func(s *snapshot.Snapshot) { s.PCI[5].AER = &snapshot.AER{Correctable: []string{"RxErr", "BadTLP"}} }},
		{"pcie-aer-errors", Info, "0000:17:00.0", func(s *snapshot.Snapshot) { s.PCI[2].AER = &snapshot.AER{Uncorrectable: []string{"UnsupReq"}} }},
		{"pcie-aer-errors", Critical, "0000:17:00.0", func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventAER, Device: "0000:17:00.0", Message: "PCIe Bus Error: severity=Uncorrected (Fatal)"})
		}},
		{"firmware-mismatch", Warning, g1, func(s *snapshot.Snapshot) { s.GPUs[1].VBIOS = "96.00.99.00.01" }},
		{"inforom-corrupted", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].InfoROM.Valid = b(false) }},
		{"driver-mismatch", Critical, g0, func(s *snapshot.Snapshot) { s.Drivers.NVIDIAUser = "550.127.05" }},
		{"driver-too-old", Warning, g0, func(s *snapshot.Snapshot) {
			s.Drivers.Toolkits = []snapshot.Toolkit{{Kind: "cuda", Version: "12.8", Path: "/usr/local/cuda-12.8"}}
		}},
		{"unknown-gpu-model", Info, g1, func(s *snapshot.Snapshot) { s.GPUs[1].DeviceID, s.GPUs[1].Model = "ffff", "NVIDIA Mystery" }},
		{"nouveau-loaded", Warning, g0, func(s *snapshot.Snapshot) { s.Drivers.NouveauLoaded = b(true) }},
		{"nvlink-inactive", Warning, g1, func(s *snapshot.Snapshot) { s.GPUs[1].NVLinks[3].State = "inactive" }},
		{"nvswitch-error", Warning, "0000:83:00.0", func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventNVSwitch, Code: 12028, Device: "0000:83:00.0", Message: "detected NVSwitch non-fatal error 12028"})
		}},
		{"nvswitch-error", Critical, "0000:83:00.0", func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventSXid, Code: 24007, Device: "0000:83:00.0", Message: "SXid 24007, Fatal, Link 44"})
		}},
		{"fabric-manager-missing", Critical, g0, func(s *snapshot.Snapshot) { s.Drivers.FabricManager.Running = b(false) }},
		{"fabric-manager-missing", Critical, g0, func(s *snapshot.Snapshot) { s.Drivers.FabricManager.State = "In Progress" }},
		{"ecc-uncorrectable", Critical, g0, func(s *snapshot.Snapshot) { s.GPUs[0].ECC.VolatileUncorrectable = u64(2) }},
		{"ecc-uncorrectable", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].ECC.AggregateUncorrectable = u64(2) }},
		{"ecc-correctable", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].ECC.VolatileCorrectable = u64(5000) }},
		{"retired-pages-pending", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].RetiredPages.Pending = b(true) }},
		{"row-remap-pending", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].RemappedRows.Pending = b(true) }},
		{"row-remap-failure", Critical, g0, func(s *snapshot.Snapshot) { s.GPUs[0].RemappedRows.Failure = b(true) }},
		{"xid-error", Critical, g0, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventXid, Code: 48, Device: g0, Message: "NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE"})
		}},
		{"xid-error", Warning, g0, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventXid, Code: 13, Device: g0, Message: "NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception"})
		}},
		{"gpu-fallen-off-bus", Critical, g1, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventXid, Code: 79, Device: g1, Message: "NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus."})
		}},
		{"gpu-fallen-off-bus", Critical, g1, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventFallenOffBus, Device: g1, Message: "NVRM: GPU 0000:19:00.0: GPU has fallen off the bus."})
		}},
		{"amdgpu-error", Warning, g0, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventAMDGPU, Device: g0, Message: "amdgpu 0000:18:00.0: [drm] *ERROR* ring gfx timeout"})
		}},
		{"throttle-thermal", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Throttle[4].Active = true }},
		{"throttle-power", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Throttle[1].Active = true }},
		{"throttle-power", Info, g0, func(s *snapshot.Snapshot) {
			s.GPUs[0].Throttle[1].Active, s.GPUs[0].PerformanceState = true, "P8"
		}},
		{"hw-slowdown", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Throttle[3].Active = true }},
		{"power-limit-reduced", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Power.LimitW = p(500) }},
		{"temperature-high", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Temperature.GPUC = p(87) }},
		{"temperature-high", Critical, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Temperature.MemoryC = p(99) }},
		{"fan-failure", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].Fans = []snapshot.Fan{{Error: "ERR!"}} }},
		{"persistence-off", Info, g1, func(s *snapshot.Snapshot) { s.GPUs[1].Persistence = b(false) }},
		{"ecc-disabled", Info, g1, func(s *snapshot.Snapshot) { s.GPUs[1].ECC.Enabled = b(false) }},
		{"mig-pending", Warning, g0, func(s *snapshot.Snapshot) { s.GPUs[0].MIG.PendingEnabled = b(true) }},
		{"mig-stranded", Info, g0, func(s *snapshot.Snapshot) {
			// The A100-SXM4-80GB capture's layout: four 1g.20gb-sized instances.
			for k := range s.GPUs {
				s.GPUs[k].Model, s.GPUs[k].DeviceID = "NVIDIA A100-SXM4-80GB", "20b2"
			}
			s.GPUs[0].MIG = &snapshot.MIG{Enabled: true, PendingEnabled: b(true)}
			for gi := 0; gi < 4; gi++ {
				s.GPUs[0].MIG.Instances = append(s.GPUs[0].MIG.Instances, snapshot.MIGInstance{GPUInstance: gi + 3, SMs: 14, MemoryBytes: 19968 << 20})
			}
		}},
		{"gpu-missing", Critical, g1, func(s *snapshot.Snapshot) { s.GPUs[1].UUID = "" }},
		{"gpu-missing", Critical, "", func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventProbeFailed, Message: "NVRM: The NVIDIA probe routine failed for 1 device(s)."})
		}},
		{"memory-mismatch", Warning, g1, func(s *snapshot.Snapshot) { s.GPUs[1].MemoryTotalBytes = 40 << 30 }},
		{"mixed-models", Info, "", func(s *snapshot.Snapshot) { s.GPUs[1].DeviceID, s.GPUs[1].Model = "20b2", "NVIDIA A100-SXM4-80GB" }},
		{"numa-unknown", Info, g1, func(s *snapshot.Snapshot) { s.GPUs[1].NUMANode = i(-1) }},
		{"cpu-affinity-restricted", Info, "", func(s *snapshot.Snapshot) { s.Host.CPUSet = "0-7" }},
		{"capture-incomplete", Warning, "", func(s *snapshot.Snapshot) {
			s.Claims = append(s.Claims, snapshot.Claim{Source: "nvidia-smi-q-xml", What: "gpus", Count: 4, Detail: "attached_gpus"})
		}},
		{"no-p2p-path", Warning, "", func(s *snapshot.Snapshot) { twoSockets(s) }},
		{"capture-incomplete", Warning, g0, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventToolError, Reason: snapshot.ToolPermissionDenied, Source: "amd-smi",
				Message: "Permission needed to access required GPU device node(s): /dev/kfd: Permission denied"})
		}},
		{"pcie-upstream-bottleneck", Warning, g0, func(s *snapshot.Snapshot) {
			// nvidia-smi's Host Max below Device Max: the slot caps the card.
			s.GPUs[0].PCIe.HostMaxGen = 3
		}},
		{"gpu-unreachable", Critical, g1, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventToolError, Reason: snapshot.ToolGPUError, Device: g1, Source: "nvidia-smi",
				Message: "Unable to determine the device handle for GPU " + g1 + ": Unknown Error"})
		}},
		{"gpu-unreachable", Critical, g0, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventInitFailed, Device: g0, Source: "dmesg",
				Message: "NVRM: GPU " + g0 + ": RmInitAdapter failed! (0x24:0x72:1568)"})
		}},
		{"gpu-unreachable", Critical, "", func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventToolError, Reason: snapshot.ToolDriverUnreachable, Source: "nvidia-smi",
				Message: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."})
		}},
		{"gpu-fallen-off-bus", Critical, g1, func(s *snapshot.Snapshot) {
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventToolError, Reason: snapshot.ToolGPULost, Device: g1, Source: "nvidia-smi",
				Message: "Unable to determine the device handle for GPU " + g1 + ": GPU is lost. Reboot the system to recover this GPU"})
		}},
		{"driver-mismatch", Critical, "", func(s *snapshot.Snapshot) {
			s.Drivers.NVIDIAUser = ""
			s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventToolError, Reason: snapshot.ToolVersionMismatch, Source: "nvidia-smi",
				Message: "Failed to initialize NVML: Driver/library version mismatch"})
		}},
		{"nic-locality", Info, g1, func(s *snapshot.Snapshot) { twoSockets(s) }},
		{"bandwidth-below-rating", Warning, g1, func(s *snapshot.Snapshot) {
			s.Measurements = &snapshot.Measurements{Results: []snapshot.Measurement{{Test: "h2d", Devices: []string{g1}, Memory: "pinned",
				Direction: "uni", Repetitions: 10, MedianGBps: 20, RatedGBps: 63, Verdict: snapshot.VerdictBelowRating}}}
		}},
	}
	for _, c := range cases {
		t.Run(c.id+"/"+c.sev.String(), func(t *testing.T) {
			s := healthy()
			c.breakf(s)
			rep := run(t, s)
			if !has(rep, c.id, c.sev, c.dev) {
				t.Fatalf("want %s %s on %q; got %v", c.sev, c.id, c.dev, ids(rep))
			}
		})
	}
	// Every registered id has a case here.
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.id] = true
	}
	for _, ch := range Checks() {
		for _, id := range ch.IDs {
			if !covered[id] {
				t.Errorf("finding id %s (check %s) has no test where it fires", id, ch.Name)
			}
		}
	}
}

// twoSockets moves the GPUs to separate root ports on separate NUMA nodes
// without NVLink, with the NIC beside GPU 0 only.
func twoSockets(s *snapshot.Snapshot) {
	s.PCI = []snapshot.PCIDevice{
		{Address: "0000:15:01.0", Kind: snapshot.KindRootPort, NUMANode: i(0), Link: &snapshot.PCIeLink{CurrentGen: 5, MaxGen: 5, CurrentWidth: 16, MaxWidth: 16}},
		{Address: "0000:18:00.0", Kind: snapshot.KindGPU, Parent: "0000:15:01.0", NUMANode: i(0)},
		{Address: "0000:95:01.0", Kind: snapshot.KindRootPort, NUMANode: i(1), Link: &snapshot.PCIeLink{CurrentGen: 5, MaxGen: 5, CurrentWidth: 16, MaxWidth: 16}},
		{Address: "0000:19:00.0", Kind: snapshot.KindGPU, Parent: "0000:95:01.0", NUMANode: i(1)},
		{Address: "0000:15:02.0", Kind: snapshot.KindRootPort, NUMANode: i(0)},
		{Address: "0000:1a:00.0", Kind: snapshot.KindNIC, Parent: "0000:15:02.0", NUMANode: i(0)},
	}
	s.GPUs[0].Upstream = []string{"0000:15:01.0"}
	s.GPUs[1].Upstream = []string{"0000:95:01.0"}
	s.GPUs[1].NUMANode = i(1)
	for k := range s.GPUs {
		// Consumer cards: no NVLink fabric that PCIe classes could hide.
		s.GPUs[k].NVLinks = nil
		s.GPUs[k].Model, s.GPUs[k].DeviceID = "NVIDIA GeForce RTX 4090", "2684"
	}
	s.Drivers.FabricManager = nil
}

// TestLookAlikesStayQuiet covers states that look like faults and are not.
func TestLookAlikesStayQuiet(t *testing.T) {
	cases := []struct {
		name string
		id   string
		mod  func(s *snapshot.Snapshot)
	}{
		{"idle GPU at Gen1 saves power", "pcie-link-downtrained", func(s *snapshot.Snapshot) {
			g := &s.GPUs[0]
			g.PCIe.CurrentGen, g.PerformanceState, g.UtilizationGPU = 1, "P8", p(0)
			g.Throttle[0].Active = true
		}},
		{"switch port at Gen4 for a Gen4 NVMe", "pcie-link-downtrained", func(s *snapshot.Snapshot) {
			s.PCI[4].Link.CurrentGen = 4
			s.PCI[7].Link = &snapshot.PCIeLink{CurrentGen: 4, MaxGen: 4, CurrentWidth: 4, MaxWidth: 4}
			s.PCI[7].Kind = snapshot.KindNVMe
			s.PCI[4].Link.CurrentWidth = 4
		}},
		{"host max lower than device max", "pcie-link-downtrained", func(s *snapshot.Snapshot) {
			s.GPUs[0].PCIe = &snapshot.PCIeLink{CurrentGen: 4, MaxGen: 5, HostMaxGen: 4, CurrentWidth: 16, MaxWidth: 16}
		}},
		{"uncorrectable only in the past", "ecc-correctable", func(s *snapshot.Snapshot) {}},
		{"ACS redirect on a port with one GPU below", "pcie-acs-blocks-p2p", func(s *snapshot.Snapshot) {
			s.PCI[0].ACS = &snapshot.ACS{ReqRedir: true, CmpltRedir: true}
		}},
		{"ECC off on a consumer card", "ecc-disabled", func(s *snapshot.Snapshot) {
			for k := range s.GPUs {
				s.GPUs[k].DeviceID, s.GPUs[k].Model = "2684", "NVIDIA GeForce RTX 4090"
				s.GPUs[k].ECC = &snapshot.ECC{Enabled: b(false)}
			}
		}},
		{"WDDM persistence N/A", "persistence-off", func(s *snapshot.Snapshot) { s.GPUs[0].Persistence = nil }},
		{"fabric manager state unknown", "fabric-manager-missing", func(s *snapshot.Snapshot) { s.Drivers.FabricManager = nil }},
		{"MIG with a full layout", "mig-stranded", func(s *snapshot.Snapshot) {
			s.GPUs[0].MIG = &snapshot.MIG{Enabled: true, PendingEnabled: b(true), Instances: []snapshot.MIGInstance{{GPUInstance: 0, Profile: "7g.80gb", SMs: 132, MemoryBytes: 80 << 30}}}
		}},
		{"NVLink all active", "nvlink-inactive", func(s *snapshot.Snapshot) {}},
		{"slightly different memory (reserved)", "memory-mismatch", func(s *snapshot.Snapshot) { s.GPUs[1].MemoryTotalBytes -= 256 << 20 }},
		{"sw power cap while idle is not a warning", "throttle-power/warning", func(s *snapshot.Snapshot) {
			s.GPUs[0].Throttle[1].Active, s.GPUs[0].Throttle[0].Active = true, true
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := healthy()
			c.mod(s)
			rep := run(t, s)
			id, sev, _ := strings.Cut(c.id, "/")
			for _, f := range rep.Findings {
				if f.ID == id && (sev == "" || f.Severity.String() == sev) {
					t.Fatalf("%s fired: %s %v", id, f.Title, f.Evidence)
				}
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	r := &Report{}
	if r.ExitCode() != 0 {
		t.Fatal("empty")
	}
	r.Findings = []Finding{{Severity: Info}}
	if r.ExitCode() != 0 {
		t.Fatal("info")
	}
	r.Findings = append(r.Findings, Finding{Severity: Warning})
	if r.ExitCode() != 1 {
		t.Fatal("warning")
	}
	r.Findings = append(r.Findings, Finding{Severity: Critical})
	if r.ExitCode() != 2 {
		t.Fatal("critical")
	}
}

func TestXidGroupedPerCodeAndGPU(t *testing.T) {
	s := healthy()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for n := 0; n < 5; n++ {
		s.Events = append(s.Events, snapshot.Event{Time: t0.Add(time.Duration(n) * time.Minute), Kind: snapshot.EventXid, Code: 119, Device: g0, Process: "nvidia-smi", Message: "Timeout after 6s of waiting for RPC response"})
	}
	s.Events = append(s.Events, snapshot.Event{Kind: snapshot.EventXid, Code: 119, Device: g1, Message: "x"})
	rep := run(t, s)
	n := 0
	for _, f := range rep.Findings {
		if f.ID == "xid-error" {
			n++
			if f.Devices[0] == g0 && (!strings.Contains(f.Title, "5 events") || !strings.Contains(f.Title, "03:04:05 to 2025-01-02 03:08:05") || f.Code != 119) {
				t.Errorf("title %q code %d", f.Title, f.Code)
			}
		}
	}
	if n != 2 {
		t.Fatalf("want one finding per code and GPU (2), got %d: %v", n, ids(rep))
	}
}

func TestSeverityText(t *testing.T) {
	for _, s := range []Severity{Info, Warning, Critical} {
		var back Severity
		txt, _ := s.MarshalText()
		if err := back.UnmarshalText(txt); err != nil || back != s {
			t.Fatalf("%v round trip: %v %v", s, back, err)
		}
	}
	var x Severity
	if x.UnmarshalText([]byte("fatal")) == nil {
		t.Fatal("accepted fatal")
	}
}

// TestXidSeverityFromTheDriver: the catalogue's rating yields to what the
// driver says (a reset asked for, Xid 154's recovery action), and an Xid
// another one caused is marked secondary.
func TestXidSeverityFromTheDriver(t *testing.T) {
	const g0 = "0000:18:00.0"
	xid := func(code int, pid int, name, msg string) snapshot.Event {
		return snapshot.Event{Kind: snapshot.EventXid, Code: code, Device: g0, PID: pid, Process: name, Source: "dmesg",
			Message: fmt.Sprintf("NVRM: Xid (PCI:0000:18:00): %d, pid=%d, name=%s, %s", code, pid, name, msg)}
	}
	tests := []struct {
		name      string
		events    []snapshot.Event
		code      int
		sev       Severity
		secondary bool
	}{
		{"row remap asks for a reset", []snapshot.Event{xid(63, 0, "", "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.")}, 63, Critical, false},
		{"row remap event alone", []snapshot.Event{xid(63, 0, "", "Row Remapper: New row marked for remapping.")}, 63, Info, false},
		{"154 asks for a GPU reset", []snapshot.Event{xid(154, 0, "", "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")}, 154, Critical, false},
		{"154 back to none", []snapshot.Event{xid(154, 0, "", "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")}, 154, Info, false},
		{"154 drain p2p", []snapshot.Event{xid(154, 0, "", "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)")}, 154, Warning, false},
		{"109 alone: NVIDIA resets the GPU", []snapshot.Event{xid(109, 77, "modprobe", "errorString CTX SWITCH TIMEOUT, Info 0x74007")}, 109, Critical, false},
		{"109 after the job's own Xid 13", []snapshot.Event{
			xid(13, 9, "pt_main_thread", "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Illegal Instruction Parameter"),
			xid(109, 9, "pt_main_thread", "errorString CTX SWITCH TIMEOUT, Info 0x2c014")}, 109, Warning, true},
		{"109 after another job's Xid 13", []snapshot.Event{
			xid(13, 9, "a", "Graphics SM Warp Exception"),
			xid(109, 10, "b", "errorString CTX SWITCH TIMEOUT")}, 109, Critical, false},
		{"45 beside 79", []snapshot.Event{xid(79, 0, "", "GPU has fallen off the bus."), xid(45, 5, "python3", "Ch 00000008")}, 45, Info, true},
		{"45 alone", []snapshot.Event{xid(45, 5, "python3", "Ch 00000008")}, 45, Warning, false},
		{"45 caused by previous Xid", []snapshot.Event{xid(45, 5, "python3", "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x1c084, caused by previous Xid 149")}, 45, Info, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := healthy()
			s.Events = tt.events
			rep := run(t, s)
			for _, f := range rep.Findings {
				if f.ID != "xid-error" || f.Code != tt.code {
					continue
				}
				if f.Severity != tt.sev || f.Secondary != tt.secondary {
					t.Errorf("Xid %d: %s secondary=%v (caused by %q), want %s secondary=%v", tt.code, f.Severity, f.Secondary, f.CausedBy, tt.sev, tt.secondary)
				}
				return
			}
			t.Fatalf("no Xid %d finding: %v", tt.code, ids(rep))
		})
	}
}

// TestAERRecurrence: one corrected report is info, corrected reports that
// recur on one port's link are a warning, and an uncorrectable fatal one is
// critical; reports are grouped by the port that received them.
func TestAERRecurrence(t *testing.T) {
	const port, gpu = "0000:15:01.0", "0000:18:00.0"
	aer := func(dev, sev string) snapshot.Event {
		return snapshot.Event{Kind: snapshot.EventAER, Device: dev, Port: port,
			Message: "pcieport " + port + ": AER: error received: " + dev + " (severity=" + sev + ")"}
	}
	for _, tt := range []struct {
		name   string
		events []snapshot.Event
		want   Severity
	}{
		{"one corrected", []snapshot.Event{aer(gpu, "Corrected")}, Info},
		{"corrected on both ends of the link", []snapshot.Event{aer(gpu, "Corrected"), aer(port, "Corrected")}, Warning},
		{"non-fatal uncorrected", []snapshot.Event{aer(gpu, "Uncorrected (Non-Fatal)")}, Warning},
		{"fatal", []snapshot.Event{aer(gpu, "Corrected"), aer(gpu, "Uncorrected (Fatal)")}, Critical},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := healthy()
			s.Events = tt.events
			rep := run(t, s)
			if !has(rep, "pcie-aer-errors", tt.want, port) {
				t.Errorf("want %s pcie-aer-errors on %s; got %v", tt.want, port, ids(rep))
			}
		})
	}
}

// TestSlotCapsTheCard: a Gen5 card under a Gen4 port trains Gen4 by design:
// the port is reported (pcie-upstream-bottleneck), the card's link is not
// downtrained.
func TestSlotCapsTheCard(t *testing.T) {
	s := healthy()
	for i := range s.PCI {
		if s.PCI[i].Address == "0000:17:00.0" {
			s.PCI[i].Link = &snapshot.PCIeLink{CurrentGen: 4, MaxGen: 4, CurrentWidth: 16, MaxWidth: 16}
		}
	}
	s.GPUs[0].PCIe.CurrentGen = 4
	rep := run(t, s)
	if has(rep, "pcie-link-downtrained", Warning, "0000:18:00.0") || has(rep, "pcie-link-downtrained", Info, "0000:18:00.0") {
		t.Errorf("the card's link is reported downtrained: %v", ids(rep))
	}
	if !has(rep, "pcie-upstream-bottleneck", Warning, "0000:17:00.0") {
		t.Errorf("the Gen4 port above the Gen5 card is not reported: %v", ids(rep))
	}
}

// TestCardWithItsOwnSwitch: an AMD card carries a switch on the package;
// its GPU's x16 is the inside link, and the card's x8 link to an x8 root
// port is no bottleneck. An x4 root port above it is one.
func TestCardWithItsOwnSwitch(t *testing.T) {
	build := func(rootWidth int) *snapshot.Snapshot {
		s := snapshot.New()
		link := func(gen, w int) *snapshot.PCIeLink {
			return &snapshot.PCIeLink{CurrentGen: gen, MaxGen: gen, CurrentWidth: w, MaxWidth: w}
		}
		s.PCI = []snapshot.PCIDevice{
			{Address: "0000:00:01.0", Kind: snapshot.KindRootPort, VendorID: "8086", Link: link(3, rootWidth)},
			{Address: "0000:01:00.0", Kind: snapshot.KindSwitchUp, VendorID: "1002", Parent: "0000:00:01.0", Link: link(3, 8)},
			{Address: "0000:02:00.0", Kind: snapshot.KindSwitchDown, VendorID: "1002", Parent: "0000:01:00.0", Link: link(3, 16)},
			{Address: "0000:03:00.0", Kind: snapshot.KindGPU, VendorID: "1002", DeviceID: "7340", Parent: "0000:02:00.0", Link: link(3, 16)},
		}
		s.GPUs = []snapshot.GPU{{Vendor: snapshot.VendorAMD, PCIAddress: "0000:03:00.0", DeviceID: "7340", PCIe: link(3, 16),
			Upstream: []string{"0000:02:00.0", "0000:01:00.0", "0000:00:01.0"}}}
		return s
	}
	if rep := run(t, build(8)); has(rep, "pcie-upstream-bottleneck", Warning, "0000:03:00.0") {
		t.Errorf("an x8 card in an x8 slot is reported: %v", ids(rep))
	}
	if rep := run(t, build(4)); !has(rep, "pcie-upstream-bottleneck", Warning, "0000:00:01.0") {
		t.Errorf("an x8 card in an x4 slot is not reported: %v", ids(rep))
	}
}
