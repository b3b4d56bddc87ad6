package discover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"kiln.dev/kiln/snapshot"
)

// ErrNoNVML means NVIDIA's NVML library could not be used on this machine:
// libnvidia-ml.so.1 is not installed, the NVIDIA kernel driver is not loaded,
// or kiln was built without cgo. Callers treat it as "no NVML source", not as
// a failure of the node.
var ErrNoNVML = errors.New("NVIDIA NVML is not available")

// noCgoError is ErrNoNVML when kiln was built without cgo: go-nvml loads
// the library through cgo, so such a kiln can never read NVML, whatever the
// machine has installed. The way out is a build with cgo.
type noCgoError struct{ lib string }

func (e noCgoError) Error() string {
	return "this kiln was built without cgo and cannot read NVIDIA GPUs through NVML (it cannot load " + e.lib + "); build it with scripts/install.sh"
}

func (noCgoError) Is(target error) bool { return target == ErrNoNVML }

// nvmlNote is the note a discovery on NVIDIA GPUs writes when NVML cannot
// be read; err wraps ErrNoNVML.
func nvmlNote(err error) string {
	const unknown = "GPU health, clocks, ECC and NVLink state are unknown"
	if errors.As(err, new(noCgoError)) {
		return err.Error() + " (" + unknown + ")"
	}
	return "NVML library not found: " + unknown + " (" + err.Error() + ")"
}

// Errors that an nvmlLib implementation returns for NVML's return codes that
// collection handles on its own. Every other code is a plain error with
// NVML's text.
var (
	// errNVMLNotSupported: NVML_ERROR_NOT_SUPPORTED, or the function is
	// missing from an older driver's library (NVML_ERROR_FUNCTION_NOT_FOUND).
	errNVMLNotSupported = errors.New("not supported")
	// errNVMLNotFound: NVML_ERROR_NOT_FOUND (an empty MIG device slot).
	errNVMLNotFound = errors.New("not found")
	// errNVMLInvalidArgument: NVML_ERROR_INVALID_ARGUMENT (an NVLink index
	// past the device's last link).
	errNVMLInvalidArgument = errors.New("invalid argument")
	// errNVMLCorruptedInfoROM: NVML_ERROR_CORRUPTED_INFOROM.
	errNVMLCorruptedInfoROM = errors.New("infoROM is corrupted")
)

// nvmlMaxLinks is the number of NVLink indices probed per GPU
// (NVML_NVLINK_MAX_LINKS in the NVML headers kiln is built against).
const nvmlMaxLinks = 36

// clockKind selects a clock domain.
type clockKind int

const (
	clockGraphics clockKind = iota
	clockSM
	clockMemory
)

// tempThreshold selects a temperature threshold.
type tempThreshold int

const (
	thresholdShutdown tempThreshold = iota
	thresholdSlowdown
	thresholdMemoryMax
	thresholdGPUMax
)

// inforomObject selects an InfoROM object whose version is read.
type inforomObject int

const (
	inforomOEM inforomObject = iota
	inforomECC
	inforomPower
)

// NVLink remote device types as NVML numbers them
// (nvmlIntNvLinkDeviceType_t).
const (
	nvlinkRemoteGPU    = 0
	nvlinkRemoteIBMNPU = 1
	nvlinkRemoteSwitch = 2
)

// nvmlPCI is the part of nvmlPciInfo_t kiln reads.
type nvmlPCI struct {
	BusID string // as NVML prints it: "00000000:75:00.0"
	// DeviceID is (device << 16) | vendor, SubsystemID likewise.
	DeviceID    uint32
	SubsystemID uint32
}

// nvmlRemap is nvmlDeviceGetRemappedRows' answer.
type nvmlRemap struct {
	Correctable, Uncorrectable int
	Pending, Failure           bool
}

// nvmlFabric is nvmlDeviceGetGpuFabricInfo's answer.
type nvmlFabric struct {
	State       int    // NVML_GPU_FABRIC_STATE_*
	Status      error  // nil when the fabric registration succeeded
	CliqueID    uint32 //
	ClusterUUID string
}

// nvmlLib is the part of NVML that kiln reads, in plain Go types, so that
// collection is tested without a GPU and builds without cgo. The real
// implementation wraps github.com/NVIDIA/go-nvml (nvml_cgo.go).
type nvmlLib interface {
	DriverVersion() (string, error)
	NVMLVersion() (string, error)
	CUDADriverVersion() (int, error)
	DeviceCount() (int, error)
	Device(i int) (nvmlDevice, error)
	Shutdown() error
}

// nvmlDevice is one physical GPU's handle. Every method reads; none changes
// a setting.
type nvmlDevice interface {
	Name() (string, error)
	UUID() (string, error)
	Serial() (string, error)
	BoardPartNumber() (string, error)
	PCIInfo() (nvmlPCI, error)
	VBIOSVersion() (string, error)
	InfoROMImageVersion() (string, error)
	InfoROMVersion(inforomObject) (string, error)
	// ValidateInfoROM returns nil for a valid InfoROM and
	// errNVMLCorruptedInfoROM for a corrupted one.
	ValidateInfoROM() error
	MemoryInfo() (total, used uint64, err error)
	CUDAComputeCapability() (major, minor int, err error)

	PowerUsage() (uint32, error) // milliwatts, and so are the limits
	PowerLimit() (uint32, error)
	EnforcedPowerLimit() (uint32, error)
	DefaultPowerLimit() (uint32, error)
	PowerLimitConstraints() (min, max uint32, err error)

	Clock(clockKind) (uint32, error) // MHz
	MaxClock(clockKind) (uint32, error)
	Temperature() (uint32, error) // GPU core, degrees C
	TemperatureThreshold(tempThreshold) (uint32, error)
	NumFans() (int, error)
	FanSpeed(fan int) (uint32, error) // percent
	PerformanceState() (int, error)   // 0 for P0; 32 unknown
	Utilization() (gpu, memory uint32, err error)
	PersistenceMode() (bool, error)
	ComputeMode() (int, error) // NVML_COMPUTEMODE_*

	ECCMode() (current, pending bool, err error)
	TotalECCErrors(uncorrected, aggregate bool) (uint64, error)
	RetiredPages(doubleBit bool) (int, error) // count of pages
	RetiredPagesPending() (bool, error)
	RemappedRows() (nvmlRemap, error)

	ClocksEventReasons() (uint64, error)
	SupportedClocksEventReasons() (uint64, error)

	PCIeCurrentGen() (int, error)
	PCIeMaxGen() (int, error)
	PCIeCurrentWidth() (int, error)
	PCIeMaxWidth() (int, error)
	PCIeReplayCounter() (int, error)

	MIGMode() (current, pending bool, err error)
	MaxMIGDeviceCount() (int, error)
	MIGDevice(i int) (nvmlMIGDevice, error)
	// GPUInstancePlacement is the placement of GPU instance gi (it needs
	// root on most drivers).
	GPUInstancePlacement(gi int) (start, size int, err error)

	NVLinkState(link int) (active bool, err error)
	NVLinkVersion(link int) (uint32, error)
	NVLinkRemotePCI(link int) (string, error)
	NVLinkRemoteDeviceType(link int) (int, error)
	// NVLinkErrors are a link's replay, recovery, CRC flit and CRC data
	// error counters.
	NVLinkErrors(link int) ([4]uint64, error)
	// NVLinkTraffic is the data a link sent and received, in KiB.
	NVLinkTraffic(link int) (tx, rx uint64, err error)

	FabricInfo() (nvmlFabric, error)
	NUMANode() (int, error)

	// TotalEnergy is the energy used since the driver loaded, in
	// millijoules.
	TotalEnergy() (uint64, error)
	// GPM is the device's performance monitoring (Hopper and newer);
	// errNVMLNotSupported elsewhere.
	GPM() (nvmlGPM, error)

	// Processes are the compute and graphics processes on the GPU, each
	// PID once.
	Processes() ([]nvmlProcess, error)
	// ProcessUtilization is NVML's per-process samples taken after since
	// (microseconds since the epoch).
	ProcessUtilization(since uint64) ([]nvmlProcessUtil, error)
}

// nvmlGPM takes GPM samples of one device; two samples some time apart
// give its activity between them. A sample is the library's and must be
// freed.
type nvmlGPM interface {
	Sample() (gpmSample, error)
	Between(earlier, later gpmSample) (NVMLActivity, error)
	Free(gpmSample)
}

// gpmSample is a GPM sample, opaque to kiln.
type gpmSample any

// nvmlProcess is a process on a GPU; memory is noMemory where NVML does
// not say, gi and ci noInstance outside MIG.
type nvmlProcess struct {
	pid    uint32
	memory uint64
	gi, ci uint32
}

// nvmlProcessUtil is one per-process sample.
type nvmlProcessUtil struct {
	pid uint32
	at  uint64 // microseconds since the epoch
	sm  uint32 // percent
}

// NVML's "not available" answers in process lists.
const (
	noMemory   = ^uint64(0)
	noInstance = ^uint32(0)
)

// nvmlMIGDevice is one MIG device (GPU instance + compute instance).
type nvmlMIGDevice interface {
	GPUInstanceID() (int, error)
	ComputeInstanceID() (int, error)
	UUID() (string, error)
	Name() (string, error)
	// Attributes returns the multiprocessor count and memory size in MiB.
	Attributes() (sms int, memoryMiB uint64, err error)
	MemoryInfo() (total, used uint64, err error)
}

// nvmlMu serialises CollectNVML: go-nvml keeps package-level state while a
// library is loaded.
var nvmlMu sync.Mutex

// CollectNVML reads every GPU that NVML sees. libPath names the NVML library
// to load ("" means libnvidia-ml.so.1 from the loader's path). When the
// library or the driver is missing it returns an error wrapping ErrNoNVML.
// A reading that a GPU does not support, or that fails, is left unset; such
// failures are listed in the readings, not returned.
//
// CollectNVML only reads: it changes no GPU setting.
func CollectNVML(ctx context.Context, libPath string) (*NVMLReadings, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	lib, err := openNVML(libPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lib.Shutdown() }()
	return collectNVML(ctx, lib)
}

// collectNVML reads everything from an opened library.
func collectNVML(ctx context.Context, lib nvmlLib) (*NVMLReadings, error) {
	r := &NVMLReadings{}
	c := &collector{fail: &r.Failures}
	if v, err := lib.DriverVersion(); c.ok("nvmlSystemGetDriverVersion", err) {
		r.DriverVersion = strings.TrimSpace(v)
	}
	if v, err := lib.NVMLVersion(); c.ok("nvmlSystemGetNVMLVersion", err) {
		r.NVMLVersion = strings.TrimSpace(v)
	}
	if v, err := lib.CUDADriverVersion(); c.ok("nvmlSystemGetCudaDriverVersion", err) && v > 0 {
		r.CUDADriverVersion = v
	}
	n, err := lib.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("nvml: cannot count GPUs: %w", err)
	}
	r.Devices = []NVMLDevice{}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d := NVMLDevice{Index: i}
		dev, err := lib.Device(i)
		if err != nil {
			d.Failures = append(d.Failures, fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d): %v", i, err))
			r.Devices = append(r.Devices, d)
			continue
		}
		readDevice(ctx, dev, &d)
		r.Devices = append(r.Devices, d)
	}
	return r, nil
}

// collector turns NVML answers into "set or leave unset" decisions and
// keeps the failures that are not "not supported".
type collector struct {
	fail *[]string
}

// ok reports whether err is nil. A failure other than "not supported" is
// recorded under the NVML function's name.
func (c *collector) ok(call string, err error) bool {
	if err == nil {
		return true
	}
	if !errors.Is(err, errNVMLNotSupported) {
		*c.fail = append(*c.fail, call+": "+err.Error())
	}
	return false
}

func readDevice(ctx context.Context, dev nvmlDevice, d *NVMLDevice) {
	c := &collector{fail: &d.Failures}
	str := func(call string, f func() (string, error)) string {
		if v, err := f(); c.ok(call, err) {
			return strings.TrimSpace(v)
		}
		return ""
	}
	d.Name = str("nvmlDeviceGetName", dev.Name)
	d.UUID = str("nvmlDeviceGetUUID", dev.UUID)
	d.Serial = str("nvmlDeviceGetSerial", dev.Serial)
	d.BoardPartNumber = str("nvmlDeviceGetBoardPartNumber", dev.BoardPartNumber)
	d.VBIOS = str("nvmlDeviceGetVbiosVersion", dev.VBIOSVersion)
	d.InfoROMImage = str("nvmlDeviceGetInforomImageVersion", dev.InfoROMImageVersion)
	d.InfoROMOEM = str("nvmlDeviceGetInforomVersion(OEM)", func() (string, error) { return dev.InfoROMVersion(inforomOEM) })
	d.InfoROMECC = str("nvmlDeviceGetInforomVersion(ECC)", func() (string, error) { return dev.InfoROMVersion(inforomECC) })
	d.InfoROMPower = str("nvmlDeviceGetInforomVersion(POWER)", func() (string, error) { return dev.InfoROMVersion(inforomPower) })
	switch err := dev.ValidateInfoROM(); {
	case err == nil:
		d.InfoROMValid = snapshot.Ptr(true)
	case errors.Is(err, errNVMLCorruptedInfoROM):
		d.InfoROMValid = snapshot.Ptr(false)
	default:
		c.ok("nvmlDeviceValidateInforom", err)
	}

	if p, err := dev.PCIInfo(); c.ok("nvmlDeviceGetPciInfo", err) {
		if a, err := snapshot.CanonicalPCI(p.BusID); err == nil {
			d.PCIBusID = a
		} else {
			d.Failures = append(d.Failures, "nvmlDeviceGetPciInfo: "+err.Error())
		}
		if p.DeviceID != 0 {
			d.PCIDeviceID = fmt.Sprintf("%04x", p.DeviceID>>16)
		}
		if p.SubsystemID != 0 {
			d.PCISubsystemID = fmt.Sprintf("%04x:%04x", p.SubsystemID&0xffff, p.SubsystemID>>16)
		}
	}
	if total, used, err := dev.MemoryInfo(); c.ok("nvmlDeviceGetMemoryInfo", err) {
		d.MemoryTotalBytes, d.MemoryUsedBytes = &total, &used
	}
	if major, minor, err := dev.CUDAComputeCapability(); c.ok("nvmlDeviceGetCudaComputeCapability", err) && major > 0 {
		d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}

	readPower(dev, d, c)
	readThermals(dev, d, c)
	readHealth(dev, d, c)
	readPCIe(dev, d, c)
	if ctx.Err() != nil {
		return
	}
	readMIG(dev, d, c)
	readNVLinks(dev, d, c)
	if f, err := dev.FabricInfo(); c.ok("nvmlDeviceGetGpuFabricInfo", err) {
		d.Fabric = fabricReading(f)
	}
	if v, err := dev.NUMANode(); c.ok("nvmlDeviceGetNumaNodeId", err) && v >= 0 {
		d.NUMANode = &v
	}
	readProcesses(dev, d, c)
}

// processSampleWindow is how far back readProcesses takes NVML's
// per-process samples.
const processSampleWindow = 10 * time.Second

// readProcesses lists the GPU's processes with their memory and, where
// NVML samples them, their latest SM use.
func readProcesses(dev nvmlDevice, d *NVMLDevice, c *collector) {
	ps, err := dev.Processes()
	if !c.ok("nvmlDeviceGetComputeRunningProcesses", err) {
		return
	}
	d.ProcessesListed = true
	sm := map[uint32]nvmlProcessUtil{}
	if len(ps) > 0 {
		since := uint64(time.Now().Add(-processSampleWindow).UnixMicro())
		// NVML answers "not found" when no process ran in the window; MIG
		// GPUs do not sample processes at all.
		if us, err := dev.ProcessUtilization(since); err == nil {
			for _, u := range us {
				if u.at >= sm[u.pid].at {
					sm[u.pid] = u
				}
			}
		} else if !errors.Is(err, errNVMLNotFound) {
			c.ok("nvmlDeviceGetProcessUtilization", err)
		}
	}
	for _, p := range ps {
		np := NVMLProcess{PID: int(p.pid)}
		if p.memory != noMemory {
			np.UsedMemoryBytes = snapshot.Ptr(p.memory)
		}
		if p.gi != noInstance && p.ci != noInstance {
			np.GPUInstance, np.ComputeInstance = snapshot.Ptr(int(p.gi)), snapshot.Ptr(int(p.ci))
		}
		if u, ok := sm[p.pid]; ok {
			np.SMUtil = snapshot.Ptr(u.sm)
		}
		d.Processes = append(d.Processes, np)
	}
}

func readPower(dev nvmlDevice, d *NVMLDevice, c *collector) {
	one := func(call string, f func() (uint32, error)) *uint32 {
		if v, err := f(); c.ok(call, err) {
			return &v
		}
		return nil
	}
	d.PowerUsageMW = one("nvmlDeviceGetPowerUsage", dev.PowerUsage)
	d.PowerLimitMW = one("nvmlDeviceGetPowerManagementLimit", dev.PowerLimit)
	d.EnforcedPowerLimitMW = one("nvmlDeviceGetEnforcedPowerLimit", dev.EnforcedPowerLimit)
	d.DefaultPowerLimitMW = one("nvmlDeviceGetPowerManagementDefaultLimit", dev.DefaultPowerLimit)
	if v, err := dev.TotalEnergy(); c.ok("nvmlDeviceGetTotalEnergyConsumption", err) {
		d.EnergyMJ = &v
	}
	if lo, hi, err := dev.PowerLimitConstraints(); c.ok("nvmlDeviceGetPowerManagementLimitConstraints", err) {
		d.MinPowerLimitMW, d.MaxPowerLimitMW = &lo, &hi
	}
}

func readThermals(dev nvmlDevice, d *NVMLDevice, c *collector) {
	clock := func(call string, f func(clockKind) (uint32, error), k clockKind, name string) *uint32 {
		if v, err := f(k); c.ok(call+"("+name+")", err) {
			return &v
		}
		return nil
	}
	var cl NVMLClocks
	cl.GraphicsMHz = clock("nvmlDeviceGetClockInfo", dev.Clock, clockGraphics, "GRAPHICS")
	cl.SMMHz = clock("nvmlDeviceGetClockInfo", dev.Clock, clockSM, "SM")
	cl.MemoryMHz = clock("nvmlDeviceGetClockInfo", dev.Clock, clockMemory, "MEM")
	cl.MaxGraphicsMHz = clock("nvmlDeviceGetMaxClockInfo", dev.MaxClock, clockGraphics, "GRAPHICS")
	cl.MaxSMMHz = clock("nvmlDeviceGetMaxClockInfo", dev.MaxClock, clockSM, "SM")
	cl.MaxMemoryMHz = clock("nvmlDeviceGetMaxClockInfo", dev.MaxClock, clockMemory, "MEM")
	if cl != (NVMLClocks{}) {
		d.Clocks = &cl
	}

	if v, err := dev.Temperature(); c.ok("nvmlDeviceGetTemperature", err) {
		d.TemperatureC = &v
	}
	thr := func(t tempThreshold, name string) *uint32 {
		v, err := dev.TemperatureThreshold(t)
		// A threshold of 0 is how some boards say "none".
		if c.ok("nvmlDeviceGetTemperatureThreshold("+name+")", err) && v > 0 {
			return &v
		}
		return nil
	}
	d.ShutdownC = thr(thresholdShutdown, "SHUTDOWN")
	d.SlowdownC = thr(thresholdSlowdown, "SLOWDOWN")
	d.GPUMaxC = thr(thresholdGPUMax, "GPU_MAX")
	d.MemoryMaxC = thr(thresholdMemoryMax, "MEM_MAX")

	if n, err := dev.NumFans(); c.ok("nvmlDeviceGetNumFans", err) {
		for i := 0; i < n && i < 64; i++ {
			f := NVMLFan{Fan: i}
			if v, err := dev.FanSpeed(i); c.ok(fmt.Sprintf("nvmlDeviceGetFanSpeed_v2(%d)", i), err) {
				f.Percent = &v
			}
			d.Fans = append(d.Fans, f)
		}
	}
	if v, err := dev.PerformanceState(); c.ok("nvmlDeviceGetPerformanceState", err) && v >= 0 && v <= 15 {
		d.PerformanceState = &v
	}
	if g, m, err := dev.Utilization(); c.ok("nvmlDeviceGetUtilizationRates", err) {
		d.UtilizationGPU, d.UtilizationMemory = &g, &m
	}
	if v, err := dev.PersistenceMode(); c.ok("nvmlDeviceGetPersistenceMode", err) {
		d.Persistence = &v
	}
	if v, err := dev.ComputeMode(); c.ok("nvmlDeviceGetComputeMode", err) {
		d.ComputeMode = computeModeName(v)
	}
	if v, err := dev.ClocksEventReasons(); c.ok("nvmlDeviceGetCurrentClocksEventReasons", err) {
		d.ClockEventReasons = &v
		d.Throttle = decodeClockEventReasons(v)
	}
	if v, err := dev.SupportedClocksEventReasons(); c.ok("nvmlDeviceGetSupportedClocksEventReasons", err) {
		d.SupportedClockEventReasons = &v
	}
}

func readHealth(dev nvmlDevice, d *NVMLDevice, c *collector) {
	if cur, pend, err := dev.ECCMode(); c.ok("nvmlDeviceGetEccMode", err) {
		d.ECCEnabled, d.ECCPending = &cur, &pend
	}
	ecc := func(unc, agg bool) *uint64 {
		name := "nvmlDeviceGetTotalEccErrors("
		name += map[bool]string{false: "CORRECTED", true: "UNCORRECTED"}[unc] + ","
		name += map[bool]string{false: "VOLATILE", true: "AGGREGATE"}[agg] + ")"
		if v, err := dev.TotalECCErrors(unc, agg); c.ok(name, err) {
			return &v
		}
		return nil
	}
	d.ECCVolatileCorrected = ecc(false, false)
	d.ECCVolatileUncorrected = ecc(true, false)
	d.ECCAggregateCorrected = ecc(false, true)
	d.ECCAggregateUncorrected = ecc(true, true)

	if n, err := dev.RetiredPages(false); c.ok("nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT)", err) && n >= 0 {
		d.RetiredPagesSingleBit = snapshot.Ptr(uint64(n))
	}
	if n, err := dev.RetiredPages(true); c.ok("nvmlDeviceGetRetiredPages(DOUBLE_BIT)", err) && n >= 0 {
		d.RetiredPagesDoubleBit = snapshot.Ptr(uint64(n))
	}
	if v, err := dev.RetiredPagesPending(); c.ok("nvmlDeviceGetRetiredPagesPendingStatus", err) {
		d.RetiredPagesPending = &v
	}
	if rr, err := dev.RemappedRows(); c.ok("nvmlDeviceGetRemappedRows", err) && rr.Correctable >= 0 && rr.Uncorrectable >= 0 {
		d.RemappedRows = &NVMLRemappedRows{
			Correctable:   uint64(rr.Correctable),
			Uncorrectable: uint64(rr.Uncorrectable),
			Pending:       rr.Pending,
			Failure:       rr.Failure,
		}
	}
}

func readPCIe(dev nvmlDevice, d *NVMLDevice, c *collector) {
	one := func(call string, f func() (int, error)) *int {
		if v, err := f(); c.ok(call, err) && v > 0 {
			return &v
		}
		return nil
	}
	d.PCIeCurrentGen = one("nvmlDeviceGetCurrPcieLinkGeneration", dev.PCIeCurrentGen)
	d.PCIeMaxGen = one("nvmlDeviceGetMaxPcieLinkGeneration", dev.PCIeMaxGen)
	d.PCIeCurrentWidth = one("nvmlDeviceGetCurrPcieLinkWidth", dev.PCIeCurrentWidth)
	d.PCIeMaxWidth = one("nvmlDeviceGetMaxPcieLinkWidth", dev.PCIeMaxWidth)
	if v, err := dev.PCIeReplayCounter(); c.ok("nvmlDeviceGetPcieReplayCounter", err) && v >= 0 {
		d.PCIeReplays = snapshot.Ptr(uint64(v))
	}
}

func readMIG(dev nvmlDevice, d *NVMLDevice, c *collector) {
	cur, pend, err := dev.MIGMode()
	if !c.ok("nvmlDeviceGetMigMode", err) {
		return
	}
	d.MIGEnabled, d.MIGPending = &cur, &pend
	if !cur {
		return
	}
	n, err := dev.MaxMIGDeviceCount()
	if !c.ok("nvmlDeviceGetMaxMigDeviceCount", err) {
		return
	}
	for i := 0; i < n && i < 64; i++ {
		m, err := dev.MIGDevice(i)
		if errors.Is(err, errNVMLNotFound) {
			continue // an empty slot
		}
		if !c.ok(fmt.Sprintf("nvmlDeviceGetMigDeviceHandleByIndex(%d)", i), err) {
			continue
		}
		md := NVMLMIGDevice{GPUInstance: -1, ComputeInstance: -1}
		if v, err := m.GPUInstanceID(); c.ok("nvmlDeviceGetGpuInstanceId", err) {
			md.GPUInstance = v
		}
		if v, err := m.ComputeInstanceID(); c.ok("nvmlDeviceGetComputeInstanceId", err) {
			md.ComputeInstance = v
		}
		if v, err := m.UUID(); c.ok("nvmlDeviceGetUUID(MIG)", err) {
			md.UUID = strings.TrimSpace(v)
		}
		if v, err := m.Name(); c.ok("nvmlDeviceGetName(MIG)", err) {
			md.Name = strings.TrimSpace(v)
			md.Profile = migProfileFromName(md.Name)
		}
		if sms, mib, err := m.Attributes(); c.ok("nvmlDeviceGetAttributes(MIG)", err) {
			md.SMs = sms
			md.MemoryBytes = mib << 20
		}
		if total, used, err := m.MemoryInfo(); c.ok("nvmlDeviceGetMemoryInfo(MIG)", err) {
			if md.MemoryBytes == 0 {
				md.MemoryBytes = total
			}
			md.MemoryUsedBytes = &used
		}
		if md.GPUInstance >= 0 {
			// Placement needs privileges on most drivers: a refusal is
			// expected and not worth a failure line.
			if start, size, err := dev.GPUInstancePlacement(md.GPUInstance); err == nil {
				md.Start, md.Size = &start, &size
			}
		}
		d.MIGDevices = append(d.MIGDevices, md)
	}
}

func readNVLinks(dev nvmlDevice, d *NVMLDevice, c *collector) {
	for l := 0; l < nvmlMaxLinks; l++ {
		active, err := dev.NVLinkState(l)
		if errors.Is(err, errNVMLInvalidArgument) || errors.Is(err, errNVMLNotSupported) {
			continue
		}
		if !c.ok(fmt.Sprintf("nvmlDeviceGetNvLinkState(%d)", l), err) {
			break // one failure line is enough; the other links would repeat it
		}
		nl := NVMLLink{Link: l, Active: active}
		if active {
			if v, err := dev.NVLinkVersion(l); c.ok(fmt.Sprintf("nvmlDeviceGetNvLinkVersion(%d)", l), err) {
				nl.Version = v
			}
			if p, err := dev.NVLinkRemotePCI(l); c.ok(fmt.Sprintf("nvmlDeviceGetNvLinkRemotePciInfo(%d)", l), err) {
				if a, err := snapshot.CanonicalPCI(p); err == nil {
					nl.RemotePCI = a
				}
			}
			if t, err := dev.NVLinkRemoteDeviceType(l); c.ok(fmt.Sprintf("nvmlDeviceGetNvLinkRemoteDeviceType(%d)", l), err) {
				nl.RemoteType = nvlinkRemoteTypeName(t)
			}
			if e, err := dev.NVLinkErrors(l); c.ok(fmt.Sprintf("nvmlDeviceGetNvLinkErrorCounter(%d)", l), err) {
				nl.Errors = &NVMLLinkErrors{Replay: e[0], Recovery: e[1], CRCFlit: e[2], CRCData: e[3]}
			}
			if tx, rx, err := dev.NVLinkTraffic(l); c.ok(fmt.Sprintf("nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_DATA, %d)", l), err) {
				nl.TxKiB, nl.RxKiB = &tx, &rx
			}
		}
		d.NVLinks = append(d.NVLinks, nl)
	}
}

// migProfileFromName takes the profile from a MIG device's name:
// "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb".
func migProfileFromName(name string) string {
	i := strings.LastIndex(name, "MIG ")
	if i < 0 {
		return ""
	}
	p := strings.TrimSpace(name[i+len("MIG "):])
	if p == "" || !strings.Contains(p, "g.") {
		return ""
	}
	return p
}

func computeModeName(m int) string {
	switch m {
	case 0:
		return "Default"
	case 1:
		return "Exclusive_Thread"
	case 2:
		return "Prohibited"
	case 3:
		return "Exclusive_Process"
	}
	return ""
}

func nvlinkRemoteTypeName(t int) string {
	switch t {
	case nvlinkRemoteGPU:
		return snapshot.KindGPU
	case nvlinkRemoteSwitch:
		return snapshot.KindNVSwitch
	case nvlinkRemoteIBMNPU:
		return "ibmnpu"
	}
	return ""
}

// Fabric states as NVML numbers them (NVML_GPU_FABRIC_STATE_*), named as
// nvidia-smi -q prints them.
func fabricStateName(s int) string {
	switch s {
	case 1:
		return "Not Started"
	case 2:
		return "In Progress"
	case 3:
		return "Completed"
	}
	return ""
}

func fabricReading(f nvmlFabric) *NVMLFabric {
	st := fabricStateName(f.State)
	if st == "" {
		return nil // NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: not an NVSwitch system
	}
	out := &NVMLFabric{State: st, CliqueID: f.CliqueID, ClusterUUID: f.ClusterUUID}
	// The status is meaningful once registration has finished.
	if f.State == 3 {
		if f.Status == nil {
			out.Status = "Success"
		} else {
			out.Status = f.Status.Error()
		}
	}
	return out
}
