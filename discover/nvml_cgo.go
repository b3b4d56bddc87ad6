//go:build cgo

package discover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

const defaultNVMLLibrary = "libnvidia-ml.so.1"

// openNVML loads the NVML library at run time and initialises it.
func openNVML(libPath string) (nvmlLib, error) {
	if libPath == "" {
		libPath = defaultNVMLLibrary
	}
	// Try the library first on our own to report the loader's reason; NVML's
	// own answer is only "library not found".
	probe := dl.New(libPath, dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := probe.Open(); err != nil {
		return nil, fmt.Errorf("%w: cannot load %s (is the NVIDIA driver installed?): %v", ErrNoNVML, libPath, err)
	}
	defer func() { _ = probe.Close() }()
	// go-nvml resolves NVML's functions lazily: a library without them would
	// end the process at the first call instead of failing.
	if err := probe.Lookup("nvmlInit_v2"); err != nil {
		return nil, fmt.Errorf("%w: %s is not an NVML library (no nvmlInit_v2)", ErrNoNVML, libPath)
	}

	lib := nvml.New(nvml.WithLibraryPath(libPath))
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("%w: cannot load %s (is the NVIDIA driver installed?)", ErrNoNVML, libPath)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("%w: %s is installed but the NVIDIA kernel driver is not loaded", ErrNoNVML, libPath)
	default:
		return nil, fmt.Errorf("nvml: cannot initialise NVML: %s", lib.ErrorString(ret))
	}
	return &goNVML{lib: lib, syms: map[string]bool{}}, nil
}

// goNVML implements nvmlLib with go-nvml.
type goNVML struct {
	lib  nvml.Interface
	syms map[string]bool
}

// has reports whether the loaded library exports sym. go-nvml resolves
// symbols lazily: calling a function an older driver lacks would end the
// process, so functions newer than the oldest supported drivers are checked
// first.
func (g *goNVML) has(sym string) bool {
	v, seen := g.syms[sym]
	if !seen {
		v = g.lib.Extensions().LookupSymbol(sym) == nil
		g.syms[sym] = v
	}
	return v
}

// nvmlErr turns an NVML return code into kiln's errors.
func nvmlErr(ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return errNVMLNotSupported
	case nvml.ERROR_NOT_FOUND:
		return errNVMLNotFound
	case nvml.ERROR_INVALID_ARGUMENT:
		return errNVMLInvalidArgument
	case nvml.ERROR_CORRUPTED_INFOROM:
		return errNVMLCorruptedInfoROM
	}
	return errors.New(ret.Error())
}

func (g *goNVML) DriverVersion() (string, error) {
	v, ret := g.lib.SystemGetDriverVersion()
	return v, nvmlErr(ret)
}

func (g *goNVML) NVMLVersion() (string, error) {
	v, ret := g.lib.SystemGetNVMLVersion()
	return v, nvmlErr(ret)
}

func (g *goNVML) CUDADriverVersion() (int, error) {
	if g.has("nvmlSystemGetCudaDriverVersion_v2") {
		v, ret := g.lib.SystemGetCudaDriverVersion_v2()
		return v, nvmlErr(ret)
	}
	if !g.has("nvmlSystemGetCudaDriverVersion") {
		return 0, errNVMLNotSupported
	}
	v, ret := g.lib.SystemGetCudaDriverVersion()
	return v, nvmlErr(ret)
}

func (g *goNVML) DeviceCount() (int, error) {
	n, ret := g.lib.DeviceGetCount()
	return n, nvmlErr(ret)
}

func (g *goNVML) Device(i int) (nvmlDevice, error) {
	d, ret := g.lib.DeviceGetHandleByIndex(i)
	if err := nvmlErr(ret); err != nil {
		return nil, err
	}
	return &goDevice{g: g, d: d}, nil
}

func (g *goNVML) Shutdown() error { return nvmlErr(g.lib.Shutdown()) }

// goDevice implements nvmlDevice (and nvmlMIGDevice) with go-nvml.
type goDevice struct {
	g *goNVML
	d nvml.Device
}

// guard returns errNVMLNotSupported when the library lacks sym.
func (x *goDevice) guard(sym string) error {
	if !x.g.has(sym) {
		return errNVMLNotSupported
	}
	return nil
}

func (x *goDevice) Name() (string, error) {
	v, ret := x.d.GetName()
	return v, nvmlErr(ret)
}

func (x *goDevice) UUID() (string, error) {
	v, ret := x.d.GetUUID()
	return v, nvmlErr(ret)
}

func (x *goDevice) Serial() (string, error) {
	v, ret := x.d.GetSerial()
	return v, nvmlErr(ret)
}

func (x *goDevice) BoardPartNumber() (string, error) {
	v, ret := x.d.GetBoardPartNumber()
	return v, nvmlErr(ret)
}

func (x *goDevice) PCIInfo() (nvmlPCI, error) {
	p, ret := x.d.GetPciInfo()
	if err := nvmlErr(ret); err != nil {
		return nvmlPCI{}, err
	}
	return nvmlPCI{BusID: cString(p.BusId[:]), DeviceID: p.PciDeviceId, SubsystemID: p.PciSubSystemId}, nil
}

func (x *goDevice) VBIOSVersion() (string, error) {
	v, ret := x.d.GetVbiosVersion()
	return v, nvmlErr(ret)
}

func (x *goDevice) InfoROMImageVersion() (string, error) {
	v, ret := x.d.GetInforomImageVersion()
	return v, nvmlErr(ret)
}

func (x *goDevice) InfoROMVersion(o inforomObject) (string, error) {
	obj := map[inforomObject]nvml.InforomObject{inforomOEM: nvml.INFOROM_OEM, inforomECC: nvml.INFOROM_ECC, inforomPower: nvml.INFOROM_POWER}[o]
	v, ret := x.d.GetInforomVersion(obj)
	return v, nvmlErr(ret)
}

func (x *goDevice) ValidateInfoROM() error { return nvmlErr(x.d.ValidateInforom()) }

func (x *goDevice) MemoryInfo() (uint64, uint64, error) {
	m, ret := x.d.GetMemoryInfo()
	return m.Total, m.Used, nvmlErr(ret)
}

func (x *goDevice) CUDAComputeCapability() (int, int, error) {
	a, b, ret := x.d.GetCudaComputeCapability()
	return a, b, nvmlErr(ret)
}

func (x *goDevice) PowerUsage() (uint32, error) {
	v, ret := x.d.GetPowerUsage()
	return v, nvmlErr(ret)
}

func (x *goDevice) PowerLimit() (uint32, error) {
	v, ret := x.d.GetPowerManagementLimit()
	return v, nvmlErr(ret)
}

func (x *goDevice) EnforcedPowerLimit() (uint32, error) {
	if err := x.guard("nvmlDeviceGetEnforcedPowerLimit"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetEnforcedPowerLimit()
	return v, nvmlErr(ret)
}

func (x *goDevice) DefaultPowerLimit() (uint32, error) {
	if err := x.guard("nvmlDeviceGetPowerManagementDefaultLimit"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetPowerManagementDefaultLimit()
	return v, nvmlErr(ret)
}

func (x *goDevice) PowerLimitConstraints() (uint32, uint32, error) {
	if err := x.guard("nvmlDeviceGetPowerManagementLimitConstraints"); err != nil {
		return 0, 0, err
	}
	a, b, ret := x.d.GetPowerManagementLimitConstraints()
	return a, b, nvmlErr(ret)
}

func clockType(k clockKind) nvml.ClockType {
	switch k {
	case clockSM:
		return nvml.CLOCK_SM
	case clockMemory:
		return nvml.CLOCK_MEM
	}
	return nvml.CLOCK_GRAPHICS
}

func (x *goDevice) Clock(k clockKind) (uint32, error) {
	v, ret := x.d.GetClockInfo(clockType(k))
	return v, nvmlErr(ret)
}

func (x *goDevice) MaxClock(k clockKind) (uint32, error) {
	v, ret := x.d.GetMaxClockInfo(clockType(k))
	return v, nvmlErr(ret)
}

func (x *goDevice) Temperature() (uint32, error) {
	// The versioned call first: NVML 13 deprecates nvmlDeviceGetTemperature.
	if x.g.has("nvmlDeviceGetTemperatureV") {
		if t, ret := x.d.GetTemperatureV().V1(); ret == nvml.SUCCESS && t.Temperature >= 0 {
			return uint32(t.Temperature), nil
		}
	}
	if err := x.guard("nvmlDeviceGetTemperature"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetTemperature(nvml.TEMPERATURE_GPU)
	return v, nvmlErr(ret)
}

func (x *goDevice) TemperatureThreshold(t tempThreshold) (uint32, error) {
	th := map[tempThreshold]nvml.TemperatureThresholds{
		thresholdShutdown:  nvml.TEMPERATURE_THRESHOLD_SHUTDOWN,
		thresholdSlowdown:  nvml.TEMPERATURE_THRESHOLD_SLOWDOWN,
		thresholdMemoryMax: nvml.TEMPERATURE_THRESHOLD_MEM_MAX,
		thresholdGPUMax:    nvml.TEMPERATURE_THRESHOLD_GPU_MAX,
	}[t]
	v, ret := x.d.GetTemperatureThreshold(th)
	return v, nvmlErr(ret)
}

func (x *goDevice) NumFans() (int, error) {
	if err := x.guard("nvmlDeviceGetNumFans"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetNumFans()
	return v, nvmlErr(ret)
}

func (x *goDevice) FanSpeed(fan int) (uint32, error) {
	if err := x.guard("nvmlDeviceGetFanSpeed_v2"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetFanSpeed_v2(fan)
	return v, nvmlErr(ret)
}

func (x *goDevice) PerformanceState() (int, error) {
	v, ret := x.d.GetPerformanceState()
	return int(v), nvmlErr(ret)
}

func (x *goDevice) Utilization() (uint32, uint32, error) {
	u, ret := x.d.GetUtilizationRates()
	return u.Gpu, u.Memory, nvmlErr(ret)
}

func (x *goDevice) PersistenceMode() (bool, error) {
	v, ret := x.d.GetPersistenceMode()
	return v == nvml.FEATURE_ENABLED, nvmlErr(ret)
}

func (x *goDevice) ComputeMode() (int, error) {
	v, ret := x.d.GetComputeMode()
	return int(v), nvmlErr(ret)
}

func (x *goDevice) ECCMode() (bool, bool, error) {
	a, b, ret := x.d.GetEccMode()
	return a == nvml.FEATURE_ENABLED, b == nvml.FEATURE_ENABLED, nvmlErr(ret)
}

func (x *goDevice) TotalECCErrors(uncorrected, aggregate bool) (uint64, error) {
	et, ct := nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC
	if uncorrected {
		et = nvml.MEMORY_ERROR_TYPE_UNCORRECTED
	}
	if aggregate {
		ct = nvml.AGGREGATE_ECC
	}
	v, ret := x.d.GetTotalEccErrors(et, ct)
	return v, nvmlErr(ret)
}

func (x *goDevice) RetiredPages(doubleBit bool) (int, error) {
	if err := x.guard("nvmlDeviceGetRetiredPages"); err != nil {
		return 0, err
	}
	cause := nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
	if doubleBit {
		cause = nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
	}
	v, ret := x.d.GetRetiredPages(cause)
	return len(v), nvmlErr(ret)
}

func (x *goDevice) RetiredPagesPending() (bool, error) {
	if err := x.guard("nvmlDeviceGetRetiredPagesPendingStatus"); err != nil {
		return false, err
	}
	v, ret := x.d.GetRetiredPagesPendingStatus()
	return v == nvml.FEATURE_ENABLED, nvmlErr(ret)
}

func (x *goDevice) RemappedRows() (nvmlRemap, error) {
	if err := x.guard("nvmlDeviceGetRemappedRows"); err != nil {
		return nvmlRemap{}, err
	}
	c, u, p, f, ret := x.d.GetRemappedRows()
	return nvmlRemap{Correctable: c, Uncorrectable: u, Pending: p, Failure: f}, nvmlErr(ret)
}

func (x *goDevice) ClocksEventReasons() (uint64, error) {
	if x.g.has("nvmlDeviceGetCurrentClocksEventReasons") {
		v, ret := x.d.GetCurrentClocksEventReasons()
		return v, nvmlErr(ret)
	}
	if err := x.guard("nvmlDeviceGetCurrentClocksThrottleReasons"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetCurrentClocksThrottleReasons()
	return v, nvmlErr(ret)
}

func (x *goDevice) SupportedClocksEventReasons() (uint64, error) {
	if x.g.has("nvmlDeviceGetSupportedClocksEventReasons") {
		v, ret := x.d.GetSupportedClocksEventReasons()
		return v, nvmlErr(ret)
	}
	if err := x.guard("nvmlDeviceGetSupportedClocksThrottleReasons"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetSupportedClocksThrottleReasons()
	return v, nvmlErr(ret)
}

func (x *goDevice) PCIeCurrentGen() (int, error) {
	v, ret := x.d.GetCurrPcieLinkGeneration()
	return v, nvmlErr(ret)
}

func (x *goDevice) PCIeMaxGen() (int, error) {
	v, ret := x.d.GetMaxPcieLinkGeneration()
	return v, nvmlErr(ret)
}

func (x *goDevice) PCIeCurrentWidth() (int, error) {
	v, ret := x.d.GetCurrPcieLinkWidth()
	return v, nvmlErr(ret)
}

func (x *goDevice) PCIeMaxWidth() (int, error) {
	v, ret := x.d.GetMaxPcieLinkWidth()
	return v, nvmlErr(ret)
}

func (x *goDevice) PCIeReplayCounter() (int, error) {
	if err := x.guard("nvmlDeviceGetPcieReplayCounter"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetPcieReplayCounter()
	return v, nvmlErr(ret)
}

func (x *goDevice) MIGMode() (bool, bool, error) {
	if err := x.guard("nvmlDeviceGetMigMode"); err != nil {
		return false, false, err
	}
	a, b, ret := x.d.GetMigMode()
	return a == nvml.DEVICE_MIG_ENABLE, b == nvml.DEVICE_MIG_ENABLE, nvmlErr(ret)
}

func (x *goDevice) MaxMIGDeviceCount() (int, error) {
	if err := x.guard("nvmlDeviceGetMaxMigDeviceCount"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetMaxMigDeviceCount()
	return v, nvmlErr(ret)
}

func (x *goDevice) MIGDevice(i int) (nvmlMIGDevice, error) {
	if err := x.guard("nvmlDeviceGetMigDeviceHandleByIndex"); err != nil {
		return nil, err
	}
	d, ret := x.d.GetMigDeviceHandleByIndex(i)
	if err := nvmlErr(ret); err != nil {
		return nil, err
	}
	return &goDevice{g: x.g, d: d}, nil
}

func (x *goDevice) GPUInstancePlacement(gi int) (int, int, error) {
	if err := x.guard("nvmlDeviceGetGpuInstanceById"); err != nil {
		return 0, 0, err
	}
	inst, ret := x.d.GetGpuInstanceById(gi)
	if err := nvmlErr(ret); err != nil {
		return 0, 0, err
	}
	info, ret := inst.GetInfo()
	if err := nvmlErr(ret); err != nil {
		return 0, 0, err
	}
	return int(info.Placement.Start), int(info.Placement.Size), nil
}

func (x *goDevice) GPUInstanceID() (int, error) {
	if err := x.guard("nvmlDeviceGetGpuInstanceId"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetGpuInstanceId()
	return v, nvmlErr(ret)
}

func (x *goDevice) ComputeInstanceID() (int, error) {
	if err := x.guard("nvmlDeviceGetComputeInstanceId"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetComputeInstanceId()
	return v, nvmlErr(ret)
}

func (x *goDevice) Attributes() (int, uint64, error) {
	if err := x.guard("nvmlDeviceGetAttributes_v2"); err != nil {
		return 0, 0, err
	}
	a, ret := x.d.GetAttributes()
	return int(a.MultiprocessorCount), a.MemorySizeMB, nvmlErr(ret)
}

func (x *goDevice) NVLinkState(link int) (bool, error) {
	v, ret := x.d.GetNvLinkState(link)
	return v == nvml.FEATURE_ENABLED, nvmlErr(ret)
}

func (x *goDevice) NVLinkVersion(link int) (uint32, error) {
	v, ret := x.d.GetNvLinkVersion(link)
	return v, nvmlErr(ret)
}

func (x *goDevice) NVLinkRemotePCI(link int) (string, error) {
	p, ret := x.d.GetNvLinkRemotePciInfo(link)
	if err := nvmlErr(ret); err != nil {
		return "", err
	}
	return cString(p.BusId[:]), nil
}

func (x *goDevice) NVLinkRemoteDeviceType(link int) (int, error) {
	if err := x.guard("nvmlDeviceGetNvLinkRemoteDeviceType"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetNvLinkRemoteDeviceType(link)
	return int(v), nvmlErr(ret)
}

func (x *goDevice) FabricInfo() (nvmlFabric, error) {
	// The versioned call (newer drivers) first, then the original one, which
	// NVML 13 deprecates.
	if x.g.has("nvmlDeviceGetGpuFabricInfoV") {
		if f, ret := x.d.GetGpuFabricInfoV().V2(); ret == nvml.SUCCESS {
			return fabricOf(f.State, f.Status, f.CliqueId, f.ClusterUuid), nil
		}
	}
	if err := x.guard("nvmlDeviceGetGpuFabricInfo"); err != nil {
		return nvmlFabric{}, err
	}
	f, ret := x.d.GetGpuFabricInfo()
	if err := nvmlErr(ret); err != nil {
		return nvmlFabric{}, err
	}
	return fabricOf(f.State, f.Status, f.CliqueId, f.ClusterUuid), nil
}

func fabricOf(state uint8, status, clique uint32, cluster [16]uint8) nvmlFabric {
	out := nvmlFabric{State: int(state), CliqueID: clique, ClusterUUID: uuidString(cluster)}
	if st := nvml.Return(status); st != nvml.SUCCESS {
		out.Status = errors.New(st.Error())
	}
	return out
}

func (x *goDevice) NUMANode() (int, error) {
	if err := x.guard("nvmlDeviceGetNumaNodeId"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetNumaNodeId()
	return v, nvmlErr(ret)
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// uuidString formats a 16-byte UUID; all zeros is no UUID.
func uuidString(u [16]uint8) string {
	if u == [16]uint8{} {
		return ""
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

func (x *goDevice) Processes() ([]nvmlProcess, error) {
	if err := x.guard("nvmlDeviceGetComputeRunningProcesses"); err != nil {
		return nil, err
	}
	compute, ret := x.d.GetComputeRunningProcesses()
	if err := nvmlErr(ret); err != nil {
		return nil, err
	}
	var graphics []nvml.ProcessInfo
	if x.g.has("nvmlDeviceGetGraphicsRunningProcesses") {
		if g, ret := x.d.GetGraphicsRunningProcesses(); ret == nvml.SUCCESS {
			graphics = g
		}
	}
	seen := map[uint32]bool{}
	var out []nvmlProcess
	for _, p := range append(compute, graphics...) {
		if seen[p.Pid] {
			continue
		}
		seen[p.Pid] = true
		out = append(out, nvmlProcess{pid: p.Pid, memory: p.UsedGpuMemory, gi: p.GpuInstanceId, ci: p.ComputeInstanceId})
	}
	return out, nil
}

func (x *goDevice) ProcessUtilization(since uint64) ([]nvmlProcessUtil, error) {
	if err := x.guard("nvmlDeviceGetProcessUtilization"); err != nil {
		return nil, err
	}
	ss, ret := x.d.GetProcessUtilization(since)
	if err := nvmlErr(ret); err != nil {
		return nil, err
	}
	out := make([]nvmlProcessUtil, 0, len(ss))
	for _, s := range ss {
		out = append(out, nvmlProcessUtil{pid: s.Pid, at: s.TimeStamp, sm: s.SmUtil})
	}
	return out, nil
}

func (x *goDevice) TotalEnergy() (uint64, error) {
	if err := x.guard("nvmlDeviceGetTotalEnergyConsumption"); err != nil {
		return 0, err
	}
	v, ret := x.d.GetTotalEnergyConsumption()
	return v, nvmlErr(ret)
}

// goGPM is nvmlGPM on go-nvml.
type goGPM struct {
	g *goNVML
	d nvml.Device
}

func (x *goDevice) GPM() (nvmlGPM, error) {
	if !x.g.has("nvmlGpmQueryDeviceSupport") || !x.g.has("nvmlGpmSampleAlloc") || !x.g.has("nvmlGpmMetricsGet") {
		return nil, errNVMLNotSupported
	}
	sup, ret := x.d.GpmQueryDeviceSupport()
	if err := nvmlErr(ret); err != nil {
		return nil, err
	}
	if sup.IsSupportedDevice == 0 {
		return nil, errNVMLNotSupported
	}
	return &goGPM{g: x.g, d: x.d}, nil
}

func (m *goGPM) Sample() (gpmSample, error) {
	s, ret := m.g.lib.GpmSampleAlloc()
	if err := nvmlErr(ret); err != nil {
		return nil, err
	}
	if err := nvmlErr(m.g.lib.GpmSampleGet(m.d, s)); err != nil {
		_ = m.g.lib.GpmSampleFree(s)
		return nil, err
	}
	return s, nil
}

func (m *goGPM) Free(s gpmSample) {
	if v, ok := s.(nvml.GpmSample); ok {
		_ = m.g.lib.GpmSampleFree(v)
	}
}

// gpmMetrics are the GPM metrics kiln reads.
var gpmMetrics = []nvml.GpmMetricId{nvml.GPM_METRIC_GRAPHICS_UTIL, nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_ANY_TENSOR_UTIL, nvml.GPM_METRIC_DRAM_BW_UTIL}

func (m *goGPM) Between(earlier, later gpmSample) (NVMLActivity, error) {
	a, okA := earlier.(nvml.GpmSample)
	b, okB := later.(nvml.GpmSample)
	if !okA || !okB {
		return NVMLActivity{}, errors.New("nvml: not GPM samples")
	}
	req := &nvml.GpmMetricsGetType{Version: nvml.GPM_METRICS_GET_VERSION, NumMetrics: uint32(len(gpmMetrics)), Sample1: a, Sample2: b}
	for i, id := range gpmMetrics {
		req.Metrics[i].MetricId = uint32(id)
	}
	if err := nvmlErr(m.g.lib.GpmMetricsGet(req)); err != nil {
		return NVMLActivity{}, err
	}
	var out NVMLActivity
	for i := range gpmMetrics {
		r := req.Metrics[i]
		if nvml.Return(r.NvmlReturn) != nvml.SUCCESS {
			continue
		}
		v := r.Value
		switch nvml.GpmMetricId(r.MetricId) {
		case nvml.GPM_METRIC_GRAPHICS_UTIL:
			out.GraphicsPercent = &v
		case nvml.GPM_METRIC_SM_UTIL:
			out.SMPercent = &v
		case nvml.GPM_METRIC_ANY_TENSOR_UTIL:
			out.TensorPercent = &v
		case nvml.GPM_METRIC_DRAM_BW_UTIL:
			out.DRAMPercent = &v
		}
	}
	return out, nil
}

func (x *goDevice) NVLinkErrors(link int) ([4]uint64, error) {
	var out [4]uint64
	if err := x.guard("nvmlDeviceGetNvLinkErrorCounter"); err != nil {
		return out, err
	}
	for i, k := range []nvml.NvLinkErrorCounter{nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA} {
		v, ret := x.d.GetNvLinkErrorCounter(link, k)
		if err := nvmlErr(ret); err != nil {
			return out, err
		}
		out[i] = v
	}
	return out, nil
}

func (x *goDevice) NVLinkTraffic(link int) (uint64, uint64, error) {
	if err := x.guard("nvmlDeviceGetFieldValues"); err != nil {
		return 0, 0, err
	}
	vs := []nvml.FieldValue{{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: uint32(link)}, {FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: uint32(link)}}
	if err := nvmlErr(x.d.GetFieldValues(vs)); err != nil {
		return 0, 0, err
	}
	var out [2]uint64
	for i, v := range vs {
		if err := nvmlErr(nvml.Return(v.NvmlReturn)); err != nil {
			return 0, 0, err
		}
		if nvml.ValueType(v.ValueType) != nvml.VALUE_TYPE_UNSIGNED_LONG_LONG {
			return 0, 0, errNVMLNotSupported
		}
		out[i] = binary.NativeEndian.Uint64(v.Value[:]) // the C union, in the host's byte order
	}
	return out[0], out[1], nil
}
