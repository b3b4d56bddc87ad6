package discover

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/snapshot"
)

// fakeLib is an NVML with fixed answers.
type fakeLib struct {
	driver, version string
	cuda            int
	devices         []*fakeDevice // a nil entry fails to open
	openErr         error         // the error of a nil entry
}

func (f *fakeLib) DriverVersion() (string, error)  { return f.driver, nil }
func (f *fakeLib) NVMLVersion() (string, error)    { return f.version, nil }
func (f *fakeLib) CUDADriverVersion() (int, error) { return f.cuda, nil }
func (f *fakeLib) DeviceCount() (int, error)       { return len(f.devices), nil }
func (f *fakeLib) Shutdown() error                 { return nil }
func (f *fakeLib) Device(i int) (nvmlDevice, error) {
	if f.devices[i] == nil {
		return nil, f.openErr
	}
	return f.devices[i], nil
}

// fakeDevice answers with its fields; errs maps a method name to the error
// it returns instead.
type fakeDevice struct {
	name, uuid, serial, part, vbios, image  string
	inforom                                 map[inforomObject]string
	inforomErr                              error
	pci                                     nvmlPCI
	memTotal, memUsed                       uint64
	ccMajor, ccMinor                        int
	power, limit, enforced, def, pmin, pmax uint32
	clocks, maxClocks                       map[clockKind]uint32
	temp                                    uint32
	thresholds                              map[tempThreshold]uint32
	fans                                    []uint32
	pstate                                  int
	utilGPU, utilMem                        uint32
	persistence                             bool
	computeMode                             int
	eccCur, eccPending                      bool
	ecc                                     [2][2]uint64 // [uncorrected][aggregate]
	retired                                 [2]int
	retiredPending                          bool
	remap                                   nvmlRemap
	reasons, supported                      uint64
	gen, maxGen, width, maxWidth, replays   int
	migCur, migPending                      bool
	mig                                     []*fakeMIG // nil: empty slot
	placement                               map[int][2]int
	links                                   []fakeLink
	fabric                                  nvmlFabric
	numa                                    int
	procs                                   []nvmlProcess
	procUtil                                []nvmlProcessUtil
	energy                                  uint64
	gpm                                     *fakeGPM // nil: not supported
	errs                                    map[string]error
}

type fakeLink struct {
	active     bool
	version    uint32
	remote     string
	remoteType int
}

type fakeMIG struct {
	gi, ci     int
	uuid, name string
	sms        int
	mib        uint64
	used       uint64
}

func (m *fakeMIG) GPUInstanceID() (int, error)      { return m.gi, nil }
func (m *fakeMIG) ComputeInstanceID() (int, error)  { return m.ci, nil }
func (m *fakeMIG) UUID() (string, error)            { return m.uuid, nil }
func (m *fakeMIG) Name() (string, error)            { return m.name, nil }
func (m *fakeMIG) Attributes() (int, uint64, error) { return m.sms, m.mib, nil }
func (m *fakeMIG) MemoryInfo() (uint64, uint64, error) {
	return m.mib << 20, m.used, nil
}

func ans[T any](f *fakeDevice, method string, v T) (T, error) {
	if err, bad := f.errs[method]; bad {
		var zero T
		return zero, err
	}
	return v, nil
}

func (f *fakeDevice) Name() (string, error)            { return ans(f, "Name", f.name) }
func (f *fakeDevice) UUID() (string, error)            { return ans(f, "UUID", f.uuid) }
func (f *fakeDevice) Serial() (string, error)          { return ans(f, "Serial", f.serial) }
func (f *fakeDevice) BoardPartNumber() (string, error) { return ans(f, "BoardPartNumber", f.part) }
func (f *fakeDevice) PCIInfo() (nvmlPCI, error)        { return ans(f, "PCIInfo", f.pci) }
func (f *fakeDevice) VBIOSVersion() (string, error)    { return ans(f, "VBIOSVersion", f.vbios) }
func (f *fakeDevice) InfoROMImageVersion() (string, error) {
	return ans(f, "InfoROMImageVersion", f.image)
}
func (f *fakeDevice) InfoROMVersion(o inforomObject) (string, error) {
	v, ok := f.inforom[o]
	if !ok {
		return "", errNVMLNotSupported
	}
	return v, nil
}
func (f *fakeDevice) ValidateInfoROM() error { return f.inforomErr }
func (f *fakeDevice) MemoryInfo() (uint64, uint64, error) {
	if _, err := ans(f, "MemoryInfo", 0); err != nil {
		return 0, 0, err
	}
	return f.memTotal, f.memUsed, nil
}
func (f *fakeDevice) CUDAComputeCapability() (int, int, error) {
	return f.ccMajor, f.ccMinor, nil
}
func (f *fakeDevice) PowerUsage() (uint32, error) { return ans(f, "PowerUsage", f.power) }
func (f *fakeDevice) PowerLimit() (uint32, error) { return ans(f, "PowerLimit", f.limit) }
func (f *fakeDevice) EnforcedPowerLimit() (uint32, error) {
	return ans(f, "EnforcedPowerLimit", f.enforced)
}
func (f *fakeDevice) DefaultPowerLimit() (uint32, error) { return ans(f, "DefaultPowerLimit", f.def) }
func (f *fakeDevice) PowerLimitConstraints() (uint32, uint32, error) {
	if _, err := ans(f, "PowerLimitConstraints", 0); err != nil {
		return 0, 0, err
	}
	return f.pmin, f.pmax, nil
}
func (f *fakeDevice) Clock(k clockKind) (uint32, error) {
	v, ok := f.clocks[k]
	if !ok {
		return 0, errNVMLNotSupported
	}
	return v, nil
}
func (f *fakeDevice) MaxClock(k clockKind) (uint32, error) {
	v, ok := f.maxClocks[k]
	if !ok {
		return 0, errNVMLNotSupported
	}
	return v, nil
}
func (f *fakeDevice) Temperature() (uint32, error) { return ans(f, "Temperature", f.temp) }
func (f *fakeDevice) TemperatureThreshold(t tempThreshold) (uint32, error) {
	v, ok := f.thresholds[t]
	if !ok {
		return 0, errNVMLNotSupported
	}
	return v, nil
}
func (f *fakeDevice) NumFans() (int, error) { return ans(f, "NumFans", len(f.fans)) }
func (f *fakeDevice) FanSpeed(i int) (uint32, error) {
	if i >= len(f.fans) {
		return 0, errNVMLInvalidArgument
	}
	return f.fans[i], nil
}
func (f *fakeDevice) PerformanceState() (int, error) { return ans(f, "PerformanceState", f.pstate) }
func (f *fakeDevice) Utilization() (uint32, uint32, error) {
	if _, err := ans(f, "Utilization", 0); err != nil {
		return 0, 0, err
	}
	return f.utilGPU, f.utilMem, nil
}
func (f *fakeDevice) PersistenceMode() (bool, error) { return ans(f, "PersistenceMode", f.persistence) }
func (f *fakeDevice) ComputeMode() (int, error)      { return ans(f, "ComputeMode", f.computeMode) }
func (f *fakeDevice) ECCMode() (bool, bool, error) {
	if _, err := ans(f, "ECCMode", 0); err != nil {
		return false, false, err
	}
	return f.eccCur, f.eccPending, nil
}
func (f *fakeDevice) TotalECCErrors(unc, agg bool) (uint64, error) {
	i, j := 0, 0
	if unc {
		i = 1
	}
	if agg {
		j = 1
	}
	return ans(f, "TotalECCErrors", f.ecc[i][j])
}
func (f *fakeDevice) RetiredPages(double bool) (int, error) {
	if double {
		return ans(f, "RetiredPages", f.retired[1])
	}
	return ans(f, "RetiredPages", f.retired[0])
}
func (f *fakeDevice) RetiredPagesPending() (bool, error) {
	return ans(f, "RetiredPagesPending", f.retiredPending)
}
func (f *fakeDevice) RemappedRows() (nvmlRemap, error) { return ans(f, "RemappedRows", f.remap) }
func (f *fakeDevice) ClocksEventReasons() (uint64, error) {
	return ans(f, "ClocksEventReasons", f.reasons)
}
func (f *fakeDevice) SupportedClocksEventReasons() (uint64, error) {
	return ans(f, "SupportedClocksEventReasons", f.supported)
}
func (f *fakeDevice) PCIeCurrentGen() (int, error)    { return ans(f, "PCIeCurrentGen", f.gen) }
func (f *fakeDevice) PCIeMaxGen() (int, error)        { return ans(f, "PCIeMaxGen", f.maxGen) }
func (f *fakeDevice) PCIeCurrentWidth() (int, error)  { return ans(f, "PCIeCurrentWidth", f.width) }
func (f *fakeDevice) PCIeMaxWidth() (int, error)      { return ans(f, "PCIeMaxWidth", f.maxWidth) }
func (f *fakeDevice) PCIeReplayCounter() (int, error) { return ans(f, "PCIeReplayCounter", f.replays) }
func (f *fakeDevice) MIGMode() (bool, bool, error) {
	if _, err := ans(f, "MIGMode", 0); err != nil {
		return false, false, err
	}
	return f.migCur, f.migPending, nil
}
func (f *fakeDevice) MaxMIGDeviceCount() (int, error) { return ans(f, "MaxMIGDeviceCount", len(f.mig)) }
func (f *fakeDevice) MIGDevice(i int) (nvmlMIGDevice, error) {
	if f.mig[i] == nil {
		return nil, errNVMLNotFound
	}
	return f.mig[i], nil
}
func (f *fakeDevice) GPUInstancePlacement(gi int) (int, int, error) {
	p, ok := f.placement[gi]
	if !ok {
		return 0, 0, errors.New("Insufficient Permissions")
	}
	return p[0], p[1], nil
}
func (f *fakeDevice) NVLinkState(l int) (bool, error) {
	if _, err := ans(f, "NVLink", 0); err != nil {
		return false, err
	}
	if l >= len(f.links) {
		return false, errNVMLInvalidArgument
	}
	return f.links[l].active, nil
}
func (f *fakeDevice) NVLinkVersion(l int) (uint32, error)   { return f.links[l].version, nil }
func (f *fakeDevice) NVLinkRemotePCI(l int) (string, error) { return f.links[l].remote, nil }
func (f *fakeDevice) NVLinkRemoteDeviceType(l int) (int, error) {
	return ans(f, "NVLinkRemoteDeviceType", f.links[l].remoteType)
}
func (f *fakeDevice) FabricInfo() (nvmlFabric, error)   { return ans(f, "FabricInfo", f.fabric) }
func (f *fakeDevice) NUMANode() (int, error)            { return ans(f, "NUMANode", f.numa) }
func (f *fakeDevice) Processes() ([]nvmlProcess, error) { return ans(f, "Processes", f.procs) }
func (f *fakeDevice) TotalEnergy() (uint64, error)      { return ans(f, "TotalEnergy", f.energy) }
func (f *fakeDevice) NVLinkErrors(link int) ([4]uint64, error) {
	return ans(f, "NVLinkErrors", [4]uint64{uint64(link), 0, uint64(2 * link), 0})
}
func (f *fakeDevice) NVLinkTraffic(link int) (uint64, uint64, error) {
	if err, bad := f.errs["NVLinkTraffic"]; bad {
		return 0, 0, err
	}
	return uint64(1000 * link), uint64(2000 * link), nil
}
func (f *fakeDevice) GPM() (nvmlGPM, error) {
	if f.gpm == nil {
		return nil, errNVMLNotSupported
	}
	return f.gpm, nil
}

// fakeGPM counts its samples; the activity between two is that of the
// later one's number (sample n reads n percent SM busy).
type fakeGPM struct {
	taken, freed int
}

func (g *fakeGPM) Sample() (gpmSample, error) { g.taken++; return g.taken, nil }
func (g *fakeGPM) Free(gpmSample)             { g.freed++ }
func (g *fakeGPM) Between(a, b gpmSample) (NVMLActivity, error) {
	sm, tensor := float64(b.(int)), float64(a.(int))
	return NVMLActivity{SMPercent: &sm, TensorPercent: &tensor}, nil
}
func (f *fakeDevice) ProcessUtilization(uint64) ([]nvmlProcessUtil, error) {
	return ans(f, "ProcessUtilization", f.procUtil)
}

// h100 is GPU 00000000:75:00.0 of the 8x H100 HGX capture in
// testdata/captures/nvidia-smi-q, as NVML would give it, on NVSwitches.
func h100() *fakeDevice {
	links := make([]fakeLink, 18)
	for i := range links {
		links[i] = fakeLink{active: true, version: 4, remote: "00000000:05:00.0", remoteType: nvlinkRemoteSwitch}
	}
	links[17].active = false
	return &fakeDevice{
		name: "NVIDIA H100 80GB HBM3", uuid: "GPU-973565ff-45cf-12ea-4e91-33386720f7bb",
		serial: "1654922018857", part: "692-2G520-0200-000", vbios: "96.00.74.00.01",
		image:    "G520.0200.00.05",
		inforom:  map[inforomObject]string{inforomOEM: "2.1", inforomECC: "7.16"}, // power object: N/A
		pci:      nvmlPCI{BusID: "00000000:75:00.0", DeviceID: 0x233010DE, SubsystemID: 0x16C110DE},
		memTotal: 81559 << 20, memUsed: 9221 << 20,
		ccMajor: 9, ccMinor: 0,
		power: 118010, limit: 700000, enforced: 700000, def: 700000, pmin: 200000, pmax: 700000,
		clocks:    map[clockKind]uint32{clockGraphics: 1980, clockSM: 1980, clockMemory: 2619},
		maxClocks: map[clockKind]uint32{clockGraphics: 1980, clockSM: 1980, clockMemory: 2619},
		temp:      39,
		thresholds: map[tempThreshold]uint32{
			thresholdShutdown: 92, thresholdSlowdown: 89, thresholdGPUMax: 87, thresholdMemoryMax: 95,
		},
		pstate: 0, persistence: true, computeMode: 0,
		eccCur: true, eccPending: true,
		remap:   nvmlRemap{},
		reasons: 0x4 | 0x20 | 0x80, supported: 0x1ff,
		gen: 5, maxGen: 5, width: 16, maxWidth: 16, replays: 58,
		links:  links,
		fabric: nvmlFabric{State: 3, CliqueID: 0},
		numa:   1,
		errs: map[string]error{
			"NumFans":             errNVMLNotSupported, // SXM: no fans
			"RetiredPages":        errNVMLNotSupported, // Hopper remaps rows instead
			"RetiredPagesPending": errNVMLNotSupported,
		},
	}
}

// h100MIG is a second H100 in MIG mode, run by a user without root, with a
// corrupted InfoROM, on a driver without NUMA or fabric queries.
func h100MIG() *fakeDevice {
	d := h100()
	d.uuid = "GPU-11111111-2222-3333-4444-555555555555"
	d.pci = nvmlPCI{BusID: "00000000:86:00.0", DeviceID: 0x233010DE, SubsystemID: 0x16C110DE}
	d.inforomErr = errNVMLCorruptedInfoROM
	d.reasons = 0x1
	d.migCur, d.migPending = true, true
	d.mig = []*fakeMIG{
		{gi: 1, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000001", name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb", sms: 60, mib: 40192},
		nil,
		{gi: 5, ci: 0, uuid: "MIG-aaaaaaaa-0000-0000-0000-000000000002", name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb", sms: 16, mib: 9984, used: 13 << 20},
	}
	d.placement = map[int][2]int{1: {0, 4}}
	d.links = nil
	d.errs = map[string]error{
		"Serial":     errors.New("Insufficient Permissions"),
		"NUMANode":   errNVMLNotSupported,
		"FabricInfo": errNVMLNotSupported,
		"NVLink":     errNVMLNotSupported,
	}
	return d
}

func fakeH100Node() *fakeLib {
	return &fakeLib{
		driver: "535.183.01", version: "12.535.183.01", cuda: 12020,
		devices: []*fakeDevice{h100(), h100MIG(), nil},
		openErr: errors.New("GPU is lost"),
	}
}

func collectFake(t *testing.T) *NVMLReadings {
	t.Helper()
	r, err := collectNVML(context.Background(), fakeH100Node())
	if err != nil {
		t.Fatalf("collectNVML: %v", err)
	}
	return r
}

func TestCollectNVMLWithoutLibrary(t *testing.T) {
	dir := t.TempDir()
	notALib := filepath.Join(dir, "libnvidia-ml.so.1")
	if err := os.WriteFile(notALib, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing", "libnvidia-ml.so.1"), notALib} {
		start := time.Now()
		r, err := CollectNVML(context.Background(), path)
		if !errors.Is(err, ErrNoNVML) {
			t.Fatalf("CollectNVML(%s) = %v, %v; want an error wrapping ErrNoNVML", path, r, err)
		}
		if r != nil {
			t.Errorf("CollectNVML(%s) returned readings with its error", path)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("CollectNVML(%s) took %v to fail", path, d)
		}
		if !strings.Contains(err.Error(), "NVML") || !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name NVML and the library", err)
		}
	}
}

func TestCollectNVMLNotNVMLLibrary(t *testing.T) {
	// A real shared library that is not NVML must fail cleanly, not end the
	// process at the first NVML call.
	var lib string
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			lib = p
			break
		}
	}
	if lib == "" {
		t.Skip("no libc.so.6 found to load")
	}
	_, err := CollectNVML(context.Background(), lib)
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("CollectNVML(%s) = %v; want an error wrapping ErrNoNVML", lib, err)
	}
	t.Log(err)
}

func TestCollectNVMLDefaultLibrary(t *testing.T) {
	// On a machine without the NVIDIA driver the default library is absent.
	r, err := CollectNVML(context.Background(), "")
	if err == nil {
		t.Skipf("NVML is present here (%d GPUs): nothing to test", len(r.Devices))
	}
	if !errors.Is(err, ErrNoNVML) {
		t.Fatalf("CollectNVML = %v; want an error wrapping ErrNoNVML", err)
	}
}

func TestCollectNVMLCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := CollectNVML(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("CollectNVML with a cancelled context = %v; want context.Canceled", err)
	}
	if _, err := collectNVML(ctx, fakeH100Node()); !errors.Is(err, context.Canceled) {
		t.Fatalf("collectNVML with a cancelled context = %v; want context.Canceled", err)
	}
}

func TestCollectNVMLSystem(t *testing.T) {
	r := collectFake(t)
	if r.DriverVersion != "535.183.01" || r.NVMLVersion != "12.535.183.01" || r.CUDADriverVersion != 12020 {
		t.Errorf("system readings = %q %q %d", r.DriverVersion, r.NVMLVersion, r.CUDADriverVersion)
	}
	if len(r.Devices) != 3 {
		t.Fatalf("got %d devices, want 3", len(r.Devices))
	}
	lost := r.Devices[2]
	if lost.Index != 2 || lost.PCIBusID != "" || len(lost.Failures) != 1 || !strings.Contains(lost.Failures[0], "GPU is lost") {
		t.Errorf("unopenable GPU = %+v; want index 2 with one failure naming the cause", lost)
	}
}

func TestCollectNVMLDevice(t *testing.T) {
	d := collectFake(t).Devices[0]
	str := []struct{ name, got, want string }{
		{"name", d.Name, "NVIDIA H100 80GB HBM3"},
		{"uuid", d.UUID, "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"},
		{"serial", d.Serial, "1654922018857"},
		{"board part", d.BoardPartNumber, "692-2G520-0200-000"},
		{"pci bus id", d.PCIBusID, "0000:75:00.0"},
		{"pci device id", d.PCIDeviceID, "2330"},
		{"pci subsystem", d.PCISubsystemID, "10de:16c1"},
		{"vbios", d.VBIOS, "96.00.74.00.01"},
		{"inforom image", d.InfoROMImage, "G520.0200.00.05"},
		{"inforom oem", d.InfoROMOEM, "2.1"},
		{"inforom ecc", d.InfoROMECC, "7.16"},
		{"inforom power (not supported)", d.InfoROMPower, ""},
		{"compute capability", d.ComputeCapability, "9.0"},
		{"compute mode", d.ComputeMode, "Default"},
	}
	for _, c := range str {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	u32s := []struct {
		name string
		got  *uint32
		want uint32
	}{
		{"power usage", d.PowerUsageMW, 118010},
		{"power limit", d.PowerLimitMW, 700000},
		{"enforced limit", d.EnforcedPowerLimitMW, 700000},
		{"default limit", d.DefaultPowerLimitMW, 700000},
		{"min limit", d.MinPowerLimitMW, 200000},
		{"max limit", d.MaxPowerLimitMW, 700000},
		{"graphics clock", d.Clocks.GraphicsMHz, 1980},
		{"max memory clock", d.Clocks.MaxMemoryMHz, 2619},
		{"temperature", d.TemperatureC, 39},
		{"shutdown", d.ShutdownC, 92},
		{"slowdown", d.SlowdownC, 89},
		{"gpu max", d.GPUMaxC, 87},
		{"memory max", d.MemoryMaxC, 95},
		{"utilization", d.UtilizationGPU, 0},
	}
	for _, c := range u32s {
		if c.got == nil || *c.got != c.want {
			t.Errorf("%s = %v, want %d", c.name, c.got, c.want)
		}
	}
	if d.MemoryTotalBytes == nil || *d.MemoryTotalBytes != 81559<<20 || d.MemoryUsedBytes == nil || *d.MemoryUsedBytes != 9221<<20 {
		t.Errorf("memory = %v / %v", d.MemoryTotalBytes, d.MemoryUsedBytes)
	}
	if d.InfoROMValid == nil || !*d.InfoROMValid {
		t.Errorf("inforom valid = %v, want true", d.InfoROMValid)
	}
	if d.PerformanceState == nil || *d.PerformanceState != 0 {
		t.Errorf("performance state = %v, want 0", d.PerformanceState)
	}
	if d.Persistence == nil || !*d.Persistence || d.ECCEnabled == nil || !*d.ECCEnabled || d.ECCPending == nil || !*d.ECCPending {
		t.Errorf("persistence %v, ecc %v pending %v; want all true", d.Persistence, d.ECCEnabled, d.ECCPending)
	}
	if d.ECCAggregateUncorrected == nil || *d.ECCAggregateUncorrected != 0 {
		t.Errorf("aggregate uncorrected = %v, want 0", d.ECCAggregateUncorrected)
	}
	if d.RemappedRows == nil || d.RemappedRows.Pending || d.RemappedRows.Correctable != 0 {
		t.Errorf("remapped rows = %+v", d.RemappedRows)
	}
	if d.PCIeCurrentGen == nil || *d.PCIeCurrentGen != 5 || d.PCIeMaxWidth == nil || *d.PCIeMaxWidth != 16 {
		t.Errorf("pcie gen %v width %v; want 5, 16", d.PCIeCurrentGen, d.PCIeMaxWidth)
	}
	if d.PCIeReplays == nil || *d.PCIeReplays != 58 {
		t.Errorf("pcie replays = %v, want 58", d.PCIeReplays)
	}
	if d.ClockEventReasons == nil || *d.ClockEventReasons != 0xa4 {
		t.Errorf("clock event mask = %v, want 0xa4", d.ClockEventReasons)
	}
	active := map[string]bool{}
	for _, tr := range d.Throttle {
		active[tr.Name] = tr.Active
	}
	if len(d.Throttle) != 9 || !active["sw_power_cap"] || !active["sw_thermal_slowdown"] ||
		!active["hw_power_brake_slowdown"] || active["hw_slowdown"] || active["idle"] {
		t.Errorf("throttle = %+v; want 9 reasons, sw_power_cap, sw_thermal_slowdown and hw_power_brake_slowdown active", d.Throttle)
	}
	if d.MIGEnabled == nil || *d.MIGEnabled || len(d.MIGDevices) != 0 {
		t.Errorf("mig = %v %v; want disabled, none", d.MIGEnabled, d.MIGDevices)
	}
	if len(d.NVLinks) != 18 {
		t.Fatalf("nvlinks = %d, want 18", len(d.NVLinks))
	}
	if l := d.NVLinks[0]; !l.Active || l.Version != 4 || l.RemotePCI != "0000:05:00.0" || l.RemoteType != "nvswitch" {
		t.Errorf("link 0 = %+v", l)
	}
	if l := d.NVLinks[17]; l.Active || l.RemotePCI != "" || l.Version != 0 {
		t.Errorf("inactive link 17 = %+v; want no remote read", l)
	}
	if d.Fabric == nil || d.Fabric.State != "Completed" || d.Fabric.Status != "Success" {
		t.Errorf("fabric = %+v; want Completed/Success", d.Fabric)
	}
	if d.NUMANode == nil || *d.NUMANode != 1 {
		t.Errorf("numa = %v, want 1", d.NUMANode)
	}
	if len(d.Failures) != 0 {
		t.Errorf("failures = %q; not-supported calls must not be failures", d.Failures)
	}
}

func TestCollectNVMLUnsupportedStaysUnset(t *testing.T) {
	r := collectFake(t)
	d := r.Devices[0]
	if d.Fans != nil {
		t.Errorf("fans = %+v; NumFans is not supported, want none", d.Fans)
	}
	if d.RetiredPagesSingleBit != nil || d.RetiredPagesDoubleBit != nil || d.RetiredPagesPending != nil {
		t.Errorf("retired pages set although not supported")
	}

	m := r.Devices[1]
	if m.Serial != "" {
		t.Errorf("serial = %q; the call failed, want empty", m.Serial)
	}
	if len(m.Failures) != 1 || m.Failures[0] != "nvmlDeviceGetSerial: Insufficient Permissions" {
		t.Errorf("failures = %q; want only the serial's", m.Failures)
	}
	if m.NUMANode != nil || m.Fabric != nil || m.NVLinks != nil {
		t.Errorf("numa %v fabric %v nvlinks %v; want all unset", m.NUMANode, m.Fabric, m.NVLinks)
	}
	if m.InfoROMValid == nil || *m.InfoROMValid {
		t.Errorf("inforom valid = %v; want false for a corrupted InfoROM", m.InfoROMValid)
	}
}

func TestCollectNVMLMIG(t *testing.T) {
	m := collectFake(t).Devices[1]
	if m.MIGEnabled == nil || !*m.MIGEnabled || m.MIGPending == nil || !*m.MIGPending {
		t.Fatalf("mig = %v pending %v; want enabled", m.MIGEnabled, m.MIGPending)
	}
	if len(m.MIGDevices) != 2 {
		t.Fatalf("mig devices = %+v; want 2 (the empty slot skipped)", m.MIGDevices)
	}
	a, b := m.MIGDevices[0], m.MIGDevices[1]
	if a.GPUInstance != 1 || a.ComputeInstance != 0 || a.Profile != "3g.40gb" || a.SMs != 60 || a.MemoryBytes != 40192<<20 {
		t.Errorf("mig 0 = %+v", a)
	}
	if a.Start == nil || *a.Start != 0 || a.Size == nil || *a.Size != 4 {
		t.Errorf("mig 0 placement = %v/%v, want 0/4", a.Start, a.Size)
	}
	if b.GPUInstance != 5 || b.Profile != "1g.10gb" || b.SMs != 16 || b.Start != nil || b.MemoryUsedBytes == nil || *b.MemoryUsedBytes != 13<<20 {
		t.Errorf("mig 1 = %+v; want gi 5, 1g.10gb, 16 SMs, no placement", b)
	}
}

func TestDecodeClockEventReasons(t *testing.T) {
	tests := []struct {
		mask   uint64
		active []string
	}{
		{0, nil},
		{0x1, []string{"idle"}},
		{0xa4, []string{"sw_power_cap", "sw_thermal_slowdown", "hw_power_brake_slowdown"}},
		{0x48, []string{"hw_slowdown", "hw_thermal_slowdown"}},
		{0x1ff, []string{"idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
			"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"}},
		{0x8000000000000000, nil}, // an unknown bit is not invented into a name
	}
	for _, tt := range tests {
		got := decodeClockEventReasons(tt.mask)
		if len(got) != 9 {
			t.Fatalf("mask %#x: %d reasons, want 9", tt.mask, len(got))
		}
		var active []string
		for _, r := range got {
			if r.Active {
				active = append(active, r.Name)
			}
		}
		if !reflect.DeepEqual(active, tt.active) {
			t.Errorf("mask %#x: active %q, want %q", tt.mask, active, tt.active)
		}
	}
}

func TestCUDAVersionString(t *testing.T) {
	for in, want := range map[int]string{12020: "12.2", 11080: "11.8", 12090: "12.9", 13000: "13.0", 10010: "10.1", 0: "", -1: ""} {
		if got := cudaVersionString(in); got != want {
			t.Errorf("cudaVersionString(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestMIGProfileFromName(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3 MIG 1g.10gb":    "1g.10gb",
		"NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb": "1c.3g.40gb",
		"NVIDIA H100 80GB HBM3":                "",
		"MIG ":                                 "",
		"NVIDIA A100 MIG 7g.80gb+me":           "7g.80gb+me",
	} {
		if got := migProfileFromName(in); got != want {
			t.Errorf("migProfileFromName(%q) = %q, want %q", in, got, want)
		}
	}
}

// sysfsSnapshot is what the sysfs source finds on the H100 node: the GPU's
// PCI identity, link and place in the PCIe tree, but nothing NVML knows.
func sysfsSnapshot() *snapshot.Snapshot {
	s := snapshot.New()
	s.Sources = []snapshot.Source{{Kind: "sysfs"}}
	s.Drivers.NVIDIAKernel = "535.183.01"
	s.GPUs = []snapshot.GPU{{
		Index: 0, Vendor: snapshot.VendorNVIDIA, PCIAddress: "0000:75:00.0", DeviceID: "2330",
		PCIe:     &snapshot.PCIeLink{CurrentGen: 5, MaxGen: 5, CurrentWidth: 16, MaxWidth: 16},
		Upstream: []string{"0000:74:00.0", "0000:73:00.0"},
		NUMANode: snapshot.Ptr(0),
	}}
	return s
}

func TestApplyMergesWithSysfsGPU(t *testing.T) {
	s := sysfsSnapshot()
	collectFake(t).Apply(s)

	if len(s.GPUs) != 2 {
		t.Fatalf("GPUs = %d, want 2 (75:00.0 merged, 86:00.0 added, the lost one skipped)", len(s.GPUs))
	}
	g := s.GPUs[0]
	if g.PCIAddress != "0000:75:00.0" || g.Index != 0 {
		t.Fatalf("GPU 0 is %s index %d", g.PCIAddress, g.Index)
	}
	if g.UUID != "GPU-973565ff-45cf-12ea-4e91-33386720f7bb" || g.Model != "NVIDIA H100 80GB HBM3" || g.SubsystemID != "10de:16c1" {
		t.Errorf("NVML identity not merged: %q %q %q", g.UUID, g.Model, g.SubsystemID)
	}
	if !reflect.DeepEqual(g.Upstream, []string{"0000:74:00.0", "0000:73:00.0"}) {
		t.Errorf("upstream = %q; sysfs's PCIe path must be kept", g.Upstream)
	}
	if g.NUMANode == nil || *g.NUMANode != 0 {
		t.Errorf("numa = %v; the value sysfs read (0) must be kept over NVML's (1)", g.NUMANode)
	}
	if g.PCIe == nil || g.PCIe.CurrentGen != 5 || g.PCIe.Replays == nil || *g.PCIe.Replays != 58 {
		t.Errorf("pcie = %+v; want sysfs's link and NVML's 58 replays", g.PCIe)
	}
	if g.Power == nil || g.Power.DrawW == nil || *g.Power.DrawW != 118.01 || *g.Power.LimitW != 700 || *g.Power.MinLimitW != 200 {
		t.Errorf("power = %+v; want 118.01 W of 700 W, min 200 W", g.Power)
	}
	if g.Temperature == nil || *g.Temperature.GPUC != 39 || *g.Temperature.SlowdownC != 89 || *g.Temperature.MaxOpC != 87 {
		t.Errorf("temperature = %+v", g.Temperature)
	}
	if g.PerformanceState != "P0" || g.ComputeMode != "Default" || g.ComputeCapability != "9.0" || g.MemoryTotalBytes != 81559<<20 {
		t.Errorf("pstate %q mode %q cc %q mem %d", g.PerformanceState, g.ComputeMode, g.ComputeCapability, g.MemoryTotalBytes)
	}
	if g.InfoROM == nil || g.InfoROM.Image != "G520.0200.00.05" || g.InfoROM.Valid == nil || !*g.InfoROM.Valid {
		t.Errorf("inforom = %+v", g.InfoROM)
	}
	if g.ECC == nil || g.ECC.Enabled == nil || !*g.ECC.Enabled || g.ECC.VolatileUncorrectable == nil {
		t.Errorf("ecc = %+v", g.ECC)
	}
	if g.RetiredPages != nil {
		t.Errorf("retired pages = %+v; not supported on Hopper, want nil", g.RetiredPages)
	}
	if g.Fans != nil {
		t.Errorf("fans = %+v; want none", g.Fans)
	}
	brake := false
	for _, tr := range g.Throttle {
		if tr.Name == "hw_power_brake_slowdown" {
			brake = tr.Active
		}
	}
	if !brake {
		t.Errorf("GPU 0000:75:00.0 must have throttle reason hw_power_brake_slowdown active: %+v", g.Throttle)
	}
	if len(g.NVLinks) != 18 || g.NVLinks[0].State != "active" || g.NVLinks[17].State != "inactive" || g.NVLinks[0].RemoteKind != snapshot.KindNVSwitch {
		t.Errorf("nvlinks = %+v", g.NVLinks)
	}
	if g.MIG == nil || g.MIG.Enabled {
		t.Errorf("mig = %+v; want present and disabled", g.MIG)
	}

	added := s.GPUs[1]
	if added.Index != 1 || added.PCIAddress != "0000:86:00.0" || added.Vendor != snapshot.VendorNVIDIA {
		t.Errorf("added GPU = index %d at %q vendor %q", added.Index, added.PCIAddress, added.Vendor)
	}
	if added.MIG == nil || !added.MIG.Enabled || len(added.MIG.Instances) != 2 || added.MIG.Instances[1].Profile != "1g.10gb" {
		t.Errorf("added GPU mig = %+v", added.MIG)
	}
	if added.InfoROM == nil || added.InfoROM.Valid == nil || *added.InfoROM.Valid {
		t.Errorf("added GPU inforom = %+v; want invalid", added.InfoROM)
	}

	dr := s.Drivers
	if dr.NVIDIAKernel != "535.183.01" || dr.NVIDIAUser != "535.183.01" || dr.NVML != "12.535.183.01" || dr.CUDADriver != "12.2" {
		t.Errorf("drivers = %+v", dr)
	}
	if dr.FabricManager == nil || dr.FabricManager.State != "Completed" || dr.FabricManager.Status != "Success" {
		t.Errorf("fabric manager = %+v; want Completed/Success", dr.FabricManager)
	}
	if len(s.Sources) != 2 || s.Sources[1].Kind != "nvml" || s.Sources[1].Version != "12.535.183.01" {
		t.Errorf("sources = %+v", s.Sources)
	}
	var notes []string
	for _, n := range s.Notes {
		notes = append(notes, n.Message)
	}
	joined := strings.Join(notes, "\n")
	if !strings.Contains(joined, "GPU 0000:86:00.0: nvmlDeviceGetSerial: Insufficient Permissions") ||
		!strings.Contains(joined, "GPU index 2: nvmlDeviceGetHandleByIndex(2): GPU is lost") {
		t.Errorf("notes = %q; want the serial failure and the lost GPU", notes)
	}
}

func TestApplyKeepsSnapshotValues(t *testing.T) {
	s := sysfsSnapshot()
	s.Drivers.NVIDIAUser = "550.54.15"
	s.Drivers.FabricManager = &snapshot.FabricManager{Running: snapshot.Ptr(true)}
	collectFake(t).Apply(s)
	if s.Drivers.NVIDIAUser != "550.54.15" {
		t.Errorf("NVIDIAUser = %q; a value already there is kept", s.Drivers.NVIDIAUser)
	}
	if fm := s.Drivers.FabricManager; fm.Running == nil || !*fm.Running || fm.State != "Completed" {
		t.Errorf("fabric manager = %+v; want Running kept and State added", fm)
	}
}

func TestApplyFabricInProgress(t *testing.T) {
	lib := fakeH100Node()
	second := h100()
	second.pci.BusID = "00000000:86:00.0"
	second.fabric = nvmlFabric{State: 2}
	lib.devices = []*fakeDevice{h100(), second}
	r, err := collectNVML(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	s := snapshot.New()
	r.Apply(s)
	if fm := s.Drivers.FabricManager; fm == nil || fm.State != "In Progress" {
		t.Errorf("fabric manager = %+v; one GPU still registering must show In Progress", fm)
	}
	if len(s.GPUs) != 2 || s.GPUs[0].Index != 0 || s.GPUs[1].Index != 1 {
		t.Errorf("GPUs on an empty snapshot: %+v", s.GPUs)
	}
}

func TestNVMLReadingsReplay(t *testing.T) {
	r := collectFake(t)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var back NVMLReadings
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, &back) {
		t.Fatalf("readings changed through JSON:\n%s", b)
	}
	// Unknown stays unknown in the record: no "fans" key for the SXM GPU,
	// and a zero utilisation stays a recorded 0.
	if strings.Contains(string(b), `"fans"`) || !strings.Contains(string(b), `"utilization_gpu": 0`) {
		t.Errorf("record:\n%s", b)
	}
	a, c := sysfsSnapshot(), sysfsSnapshot()
	r.Apply(a)
	back.Apply(c)
	if !reflect.DeepEqual(a, c) {
		t.Errorf("replayed readings apply differently")
	}
}

func FuzzNVMLReadingsApply(f *testing.F) {
	r, err := collectNVML(context.Background(), fakeH100Node())
	if err != nil {
		f.Fatal(err)
	}
	seed, _ := json.Marshal(r)
	f.Add(seed)
	f.Add([]byte(`{"devices":[{"index":0,"pci_bus_id":"zz:75","performance_state":-3,"pcie_current_gen":-1,"numa_node":-1,"mig_enabled":true,"mig_devices":[{"gi":-1,"ci":-1,"sms":-5,"start":-1}],"nvlinks":[{"link":0,"active":true,"remote_pci":"bad"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r NVMLReadings
		if json.Unmarshal(data, &r) != nil {
			return
		}
		s := sysfsSnapshot()
		r.Apply(s)
		for _, g := range s.GPUs {
			if g.PCIAddress != "" {
				if c, err := snapshot.CanonicalPCI(g.PCIAddress); err != nil || c != g.PCIAddress {
					t.Fatalf("GPU address %q is not canonical", g.PCIAddress)
				}
			}
			if g.PCIe != nil && (g.PCIe.CurrentGen < 0 || g.PCIe.MaxGen < 0 || g.PCIe.CurrentWidth < 0 || g.PCIe.MaxWidth < 0) {
				t.Fatalf("negative PCIe link %+v", g.PCIe)
			}
			if g.NUMANode != nil && *g.NUMANode < 0 {
				t.Fatalf("negative NUMA node")
			}
			for _, l := range g.NVLinks {
				if l.RemotePCI != "" {
					if c, err := snapshot.CanonicalPCI(l.RemotePCI); err != nil || c != l.RemotePCI {
						t.Fatalf("NVLink remote %q is not canonical", l.RemotePCI)
					}
				}
			}
			if g.MIG != nil {
				for _, m := range g.MIG.Instances {
					if m.SMs < 0 || (m.Start != nil && *m.Start < 0) || (m.Size != nil && *m.Size < 0) {
						t.Fatalf("negative MIG counts %+v", m)
					}
				}
			}
			if g.PerformanceState != "" && !strings.HasPrefix(g.PerformanceState, "P") {
				t.Fatalf("performance state %q", g.PerformanceState)
			}
		}
	})
}

func TestCollectNVMLLinkFailureReportedOnce(t *testing.T) {
	d := h100()
	d.errs["NVLink"] = errors.New("Insufficient Permissions")
	r, err := collectNVML(context.Background(), &fakeLib{devices: []*fakeDevice{d}})
	if err != nil {
		t.Fatal(err)
	}
	got := r.Devices[0]
	if got.NVLinks != nil || len(got.Failures) != 1 || got.Failures[0] != "nvmlDeviceGetNvLinkState(0): Insufficient Permissions" {
		t.Errorf("nvlinks %+v, failures %q; want no links and one failure", got.NVLinks, got.Failures)
	}
}
