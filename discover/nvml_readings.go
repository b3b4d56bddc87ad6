package discover

import (
	"fmt"
	"strings"

	"kiln.dev/kiln/snapshot"
)

// NVMLReadings is everything kiln read from NVML on one machine, in NVML's
// own units (milliwatts, MHz, bytes). It is plain JSON so that a machine's
// readings can be recorded (nvml.json) and replayed without a GPU. A value
// NVML did not give (not supported, or the call failed) is left unset.
type NVMLReadings struct {
	DriverVersion string `json:"driver_version,omitempty"`
	NVMLVersion   string `json:"nvml_version,omitempty"`
	// CUDADriverVersion is NVML's integer form: 12020 is CUDA 12.2.
	CUDADriverVersion int          `json:"cuda_driver_version,omitempty"`
	Devices           []NVMLDevice `json:"devices"`
	// Failures are system-level calls that failed for a reason other than
	// "not supported", as "function: NVML's error text".
	Failures []string `json:"failures,omitempty"`
}

// NVMLDevice is one GPU's readings.
type NVMLDevice struct {
	Index           int    `json:"index"`
	Name            string `json:"name,omitempty"`
	UUID            string `json:"uuid,omitempty"`
	Serial          string `json:"serial,omitempty"`
	BoardPartNumber string `json:"board_part_number,omitempty"`
	// PCIBusID is canonical (dddd:bb:dd.f).
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// PCIDeviceID is the 4-hex-digit device id ("2330"), PCISubsystemID
	// "vvvv:dddd" ("10de:16c1").
	PCIDeviceID    string `json:"pci_device_id,omitempty"`
	PCISubsystemID string `json:"pci_subsystem_id,omitempty"`
	VBIOS          string `json:"vbios,omitempty"`

	InfoROMImage string `json:"inforom_image,omitempty"`
	InfoROMOEM   string `json:"inforom_oem,omitempty"`
	InfoROMECC   string `json:"inforom_ecc,omitempty"`
	InfoROMPower string `json:"inforom_power,omitempty"`
	// InfoROMValid is nvmlDeviceValidateInforom's verdict.
	InfoROMValid *bool `json:"inforom_valid,omitempty"`

	MemoryTotalBytes  *uint64 `json:"memory_total_bytes,omitempty"`
	MemoryUsedBytes   *uint64 `json:"memory_used_bytes,omitempty"`
	ComputeCapability string  `json:"compute_capability,omitempty"` // "9.0"

	PowerUsageMW         *uint32 `json:"power_usage_mw,omitempty"`
	PowerLimitMW         *uint32 `json:"power_limit_mw,omitempty"`
	EnforcedPowerLimitMW *uint32 `json:"enforced_power_limit_mw,omitempty"`
	DefaultPowerLimitMW  *uint32 `json:"default_power_limit_mw,omitempty"`
	MinPowerLimitMW      *uint32 `json:"min_power_limit_mw,omitempty"`
	MaxPowerLimitMW      *uint32 `json:"max_power_limit_mw,omitempty"`
	// EnergyMJ is the energy used since the driver loaded, in millijoules.
	EnergyMJ *uint64 `json:"energy_mj,omitempty"`
	// Activity is what GPM measured between the sampler's last two
	// samples, in percent; only an NVMLSampler sets it.
	Activity *NVMLActivity `json:"activity,omitempty"`

	Clocks *NVMLClocks `json:"clocks,omitempty"`

	TemperatureC *uint32 `json:"temperature_c,omitempty"`
	ShutdownC    *uint32 `json:"shutdown_c,omitempty"`
	SlowdownC    *uint32 `json:"slowdown_c,omitempty"`
	GPUMaxC      *uint32 `json:"gpu_max_c,omitempty"`
	MemoryMaxC   *uint32 `json:"memory_max_c,omitempty"`

	Fans []NVMLFan `json:"fans,omitempty"`
	// PerformanceState is 0 for P0.
	PerformanceState  *int    `json:"performance_state,omitempty"`
	UtilizationGPU    *uint32 `json:"utilization_gpu,omitempty"`
	UtilizationMemory *uint32 `json:"utilization_memory,omitempty"`
	Persistence       *bool   `json:"persistence,omitempty"`
	// ComputeMode as nvidia-smi prints it: Default, Exclusive_Process, Prohibited.
	ComputeMode string `json:"compute_mode,omitempty"`

	ECCEnabled              *bool   `json:"ecc_enabled,omitempty"`
	ECCPending              *bool   `json:"ecc_pending,omitempty"`
	ECCVolatileCorrected    *uint64 `json:"ecc_volatile_corrected,omitempty"`
	ECCVolatileUncorrected  *uint64 `json:"ecc_volatile_uncorrected,omitempty"`
	ECCAggregateCorrected   *uint64 `json:"ecc_aggregate_corrected,omitempty"`
	ECCAggregateUncorrected *uint64 `json:"ecc_aggregate_uncorrected,omitempty"`

	RetiredPagesSingleBit *uint64           `json:"retired_pages_single_bit,omitempty"`
	RetiredPagesDoubleBit *uint64           `json:"retired_pages_double_bit,omitempty"`
	RetiredPagesPending   *bool             `json:"retired_pages_pending,omitempty"`
	RemappedRows          *NVMLRemappedRows `json:"remapped_rows,omitempty"`

	// ClockEventReasons is the raw nvmlClocksEventReasons bitmask; Throttle
	// is the same decoded, every known reason listed with its state.
	ClockEventReasons          *uint64                   `json:"clock_event_reasons,omitempty"`
	SupportedClockEventReasons *uint64                   `json:"supported_clock_event_reasons,omitempty"`
	Throttle                   []snapshot.ThrottleReason `json:"throttle,omitempty"`

	PCIeCurrentGen   *int    `json:"pcie_current_gen,omitempty"`
	PCIeMaxGen       *int    `json:"pcie_max_gen,omitempty"`
	PCIeCurrentWidth *int    `json:"pcie_current_width,omitempty"`
	PCIeMaxWidth     *int    `json:"pcie_max_width,omitempty"`
	PCIeReplays      *uint64 `json:"pcie_replays,omitempty"`

	MIGEnabled *bool           `json:"mig_enabled,omitempty"`
	MIGPending *bool           `json:"mig_pending,omitempty"`
	MIGDevices []NVMLMIGDevice `json:"mig_devices,omitempty"`

	NVLinks  []NVMLLink  `json:"nvlinks,omitempty"`
	Fabric   *NVMLFabric `json:"fabric,omitempty"`
	NUMANode *int        `json:"numa_node,omitempty"`

	// Processes are the compute and graphics processes on the GPU;
	// ProcessesListed says NVML listed them (none is then a reading).
	Processes       []NVMLProcess `json:"processes,omitempty"`
	ProcessesListed bool          `json:"processes_listed,omitempty"`

	// Failures are calls that failed for a reason other than "not
	// supported" ("nvmlDeviceGetSerial: Insufficient Permissions").
	Failures []string `json:"failures,omitempty"`
}

// NVMLActivity is GPM's metrics between two samples, in percent.
type NVMLActivity struct {
	GraphicsPercent *float64 `json:"graphics_pct,omitempty"`
	SMPercent       *float64 `json:"sm_pct,omitempty"`
	TensorPercent   *float64 `json:"tensor_pct,omitempty"`
	DRAMPercent     *float64 `json:"dram_pct,omitempty"`
}

// NVMLProcess is a process on a GPU.
type NVMLProcess struct {
	PID int `json:"pid"`
	// UsedMemoryBytes is unset where NVML does not say (it answers "not
	// available" without the host's PID namespace, and on WDDM).
	UsedMemoryBytes *uint64 `json:"used_memory_bytes,omitempty"`
	// GPUInstance and ComputeInstance are set on MIG instances.
	GPUInstance     *int `json:"gi,omitempty"`
	ComputeInstance *int `json:"ci,omitempty"`
	// SMUtil is its SM use in percent in NVML's latest sample, where NVML
	// samples processes.
	SMUtil *uint32 `json:"sm_util,omitempty"`
}

// NVMLClocks are current and maximum clocks in MHz.
type NVMLClocks struct {
	GraphicsMHz    *uint32 `json:"graphics_mhz,omitempty"`
	SMMHz          *uint32 `json:"sm_mhz,omitempty"`
	MemoryMHz      *uint32 `json:"memory_mhz,omitempty"`
	MaxGraphicsMHz *uint32 `json:"max_graphics_mhz,omitempty"`
	MaxSMMHz       *uint32 `json:"max_sm_mhz,omitempty"`
	MaxMemoryMHz   *uint32 `json:"max_memory_mhz,omitempty"`
}

// NVMLFan is one fan's speed in percent of its maximum.
type NVMLFan struct {
	Fan     int     `json:"fan"`
	Percent *uint32 `json:"percent,omitempty"`
}

// NVMLRemappedRows is nvmlDeviceGetRemappedRows' answer.
type NVMLRemappedRows struct {
	Correctable   uint64 `json:"correctable"`
	Uncorrectable uint64 `json:"uncorrectable"`
	Pending       bool   `json:"pending"`
	Failure       bool   `json:"failure"`
}

// NVMLMIGDevice is one MIG device. GPUInstance and ComputeInstance are -1
// when NVML did not say.
type NVMLMIGDevice struct {
	GPUInstance     int    `json:"gi"`
	ComputeInstance int    `json:"ci"`
	UUID            string `json:"uuid,omitempty"`
	Name            string `json:"name,omitempty"`
	// Profile is taken from the name ("1g.10gb").
	Profile         string  `json:"profile,omitempty"`
	SMs             int     `json:"sms,omitempty"`
	MemoryBytes     uint64  `json:"memory_bytes,omitempty"`
	MemoryUsedBytes *uint64 `json:"memory_used_bytes,omitempty"`
	Start           *int    `json:"start,omitempty"`
	Size            *int    `json:"size,omitempty"`
}

// NVMLLink is one NVLink. Version, RemotePCI and RemoteType are read for
// active links only.
type NVMLLink struct {
	Link   int  `json:"link"`
	Active bool `json:"active"`
	// Version is NVML's number for the link's version, as the driver gives it.
	Version   uint32 `json:"version,omitempty"`
	RemotePCI string `json:"remote_pci,omitempty"`
	// RemoteType is "gpu", "nvswitch" or "ibmnpu".
	RemoteType string `json:"remote_type,omitempty"`
	// Errors are the link's data-link error counters; TxKiB and RxKiB its
	// data sent and received (KiB, since the driver loaded).
	Errors *NVMLLinkErrors `json:"errors,omitempty"`
	TxKiB  *uint64         `json:"tx_kib,omitempty"`
	RxKiB  *uint64         `json:"rx_kib,omitempty"`
}

// NVMLLinkErrors are an NVLink's error counters.
type NVMLLinkErrors struct {
	Replay   uint64 `json:"replay"`
	Recovery uint64 `json:"recovery"`
	CRCFlit  uint64 `json:"crc_flit"`
	CRCData  uint64 `json:"crc_data"`
}

// NVMLFabric is a GPU's NVSwitch fabric registration.
type NVMLFabric struct {
	// State as nvidia-smi prints it: "Not Started", "In Progress", "Completed".
	State string `json:"state"`
	// Status is "Success" or NVML's error text, once State is Completed.
	Status      string `json:"status,omitempty"`
	CliqueID    uint32 `json:"clique_id,omitempty"`
	ClusterUUID string `json:"cluster_uuid,omitempty"`
}

// clockEventReasons are NVML's clock event (throttle) reason bits, in bit
// order, with kiln's snake_case names.
var clockEventReasons = []struct {
	bit  uint64
	name string
}{
	{0x001, "idle"},
	{0x002, "applications_clocks_setting"},
	{0x004, "sw_power_cap"},
	{0x008, "hw_slowdown"},
	{0x010, "sync_boost"},
	{0x020, "sw_thermal_slowdown"},
	{0x040, "hw_thermal_slowdown"},
	{0x080, "hw_power_brake_slowdown"},
	{0x100, "display_clock_setting"},
}

// decodeClockEventReasons lists every known reason with its state in mask.
func decodeClockEventReasons(mask uint64) []snapshot.ThrottleReason {
	out := make([]snapshot.ThrottleReason, 0, len(clockEventReasons))
	for _, r := range clockEventReasons {
		out = append(out, snapshot.ThrottleReason{Name: r.name, Active: mask&r.bit != 0})
	}
	return out
}

// cudaVersionString turns NVML's 12020 into "12.2".
func cudaVersionString(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}

// Apply merges the readings into s. GPUs are matched by PCI address (then
// UUID); a GPU NVML sees that s lacks is added. A value s already holds is
// kept; NVML fills what is empty. The driver stack (user-space driver, NVML
// and CUDA driver versions) and the fabric state go to s.Drivers.
func (r *NVMLReadings) Apply(s *snapshot.Snapshot) {
	if r == nil || s == nil {
		return
	}
	s.Sources = append(s.Sources, snapshot.Source{Kind: "nvml", Version: r.NVMLVersion})
	setIfEmpty(&s.Drivers.NVIDIAUser, r.DriverVersion)
	setIfEmpty(&s.Drivers.NVML, r.NVMLVersion)
	setIfEmpty(&s.Drivers.CUDADriver, cudaVersionString(r.CUDADriverVersion))
	for _, f := range r.Failures {
		s.Notes = append(s.Notes, snapshot.Note{Source: "nvml", Message: f})
	}

	for _, d := range r.Devices {
		if len(d.Failures) > 0 {
			who := d.PCIBusID
			if who == "" {
				who = fmt.Sprintf("index %d", d.Index)
			}
			s.Notes = append(s.Notes, snapshot.Note{
				Source:  "nvml",
				Message: fmt.Sprintf("GPU %s: %s", who, strings.Join(d.Failures, "; ")),
			})
		}
		if d.PCIBusID != "" {
			a, err := snapshot.CanonicalPCI(d.PCIBusID)
			if err != nil {
				s.Notes = append(s.Notes, snapshot.Note{Source: "nvml", Message: fmt.Sprintf("GPU index %d: %v", d.Index, err)})
			}
			d.PCIBusID = a
		}
		if d.PCIBusID == "" && d.UUID == "" {
			continue // NVML could not say which GPU this is
		}
		g := d.gpu()
		if i := findGPU(s.GPUs, g); i >= 0 {
			fillGPU(&s.GPUs[i], g)
			continue
		}
		g.Index = len(s.GPUs)
		s.GPUs = append(s.GPUs, g)
	}

	if st, status := r.fabric(); st != "" {
		if s.Drivers.FabricManager == nil {
			s.Drivers.FabricManager = &snapshot.FabricManager{}
		}
		setIfEmpty(&s.Drivers.FabricManager.State, st)
		setIfEmpty(&s.Drivers.FabricManager.Status, status)
	}
}

func setIfEmpty(dst *string, v string) {
	if *dst == "" {
		*dst = v
	}
}

// findGPU returns the index in gs of the GPU g describes, or -1.
func findGPU(gs []snapshot.GPU, g snapshot.GPU) int {
	for i, o := range gs {
		switch {
		case g.PCIAddress != "" && o.PCIAddress != "":
			if g.PCIAddress == o.PCIAddress {
				return i
			}
		case g.UUID != "" && o.UUID != "":
			if g.UUID == o.UUID {
				return i
			}
		}
	}
	return -1
}

// fillGPU sets every empty field of dst from src, with snapshot.Merge's
// rules, keeping dst's index.
func fillGPU(dst *snapshot.GPU, src snapshot.GPU) {
	m := snapshot.Merge(&snapshot.Snapshot{GPUs: []snapshot.GPU{*dst}}, &snapshot.Snapshot{GPUs: []snapshot.GPU{src}})
	if len(m.GPUs) != 1 {
		return
	}
	idx := dst.Index
	*dst = m.GPUs[0]
	dst.Index = idx
}

// fabric sums up the GPUs' fabric registration: the least advanced state
// any GPU is in, and the first status that is not a success.
func (r *NVMLReadings) fabric() (state, status string) {
	rank := map[string]int{"Not Started": 0, "In Progress": 1, "Completed": 2}
	best := -1
	for _, d := range r.Devices {
		if d.Fabric == nil {
			continue
		}
		k, known := rank[d.Fabric.State]
		if !known {
			continue
		}
		if best < 0 || k < best {
			best, state = k, d.Fabric.State
		}
		if d.Fabric.Status != "" && (status == "" || status == "Success") {
			status = d.Fabric.Status
		}
	}
	return state, status
}

// gpu converts one device's readings into kiln's model.
func (d *NVMLDevice) gpu() snapshot.GPU {
	g := snapshot.GPU{
		Index:             d.Index,
		Vendor:            snapshot.VendorNVIDIA,
		Model:             d.Name,
		PCIAddress:        d.PCIBusID,
		DeviceID:          d.PCIDeviceID,
		SubsystemID:       d.PCISubsystemID,
		UUID:              d.UUID,
		Serial:            d.Serial,
		BoardPart:         d.BoardPartNumber,
		ComputeCapability: d.ComputeCapability,
		VBIOS:             d.VBIOS,
		ComputeMode:       d.ComputeMode,
		Persistence:       d.Persistence,
		Throttle:          d.Throttle,
	}
	if d.NUMANode != nil && *d.NUMANode >= 0 {
		g.NUMANode = snapshot.Ptr(*d.NUMANode)
	}
	g.ProcessesRead = d.ProcessesListed
	if len(d.Processes) > 0 {
		g.Processes = len(d.Processes)
		for _, p := range d.Processes {
			gp := snapshot.GPUProcess{PID: p.PID, MemoryBytes: p.UsedMemoryBytes, GPUInstance: p.GPUInstance, ComputeInstance: p.ComputeInstance}
			if p.SMUtil != nil {
				gp.SMPercent = snapshot.Ptr(float64(*p.SMUtil))
			}
			g.ProcessList = append(g.ProcessList, gp)
		}
	}
	if d.MemoryTotalBytes != nil {
		g.MemoryTotalBytes = *d.MemoryTotalBytes
	}
	if d.MemoryUsedBytes != nil {
		g.MemoryUsedBytes = *d.MemoryUsedBytes
	}
	if d.InfoROMImage != "" || d.InfoROMOEM != "" || d.InfoROMECC != "" || d.InfoROMPower != "" || d.InfoROMValid != nil {
		g.InfoROM = &snapshot.InfoROM{Image: d.InfoROMImage, OEM: d.InfoROMOEM, ECC: d.InfoROMECC, Power: d.InfoROMPower, Valid: d.InfoROMValid}
	}
	if p := (snapshot.Power{
		DrawW: watts(d.PowerUsageMW), LimitW: watts(d.PowerLimitMW), EnforcedW: watts(d.EnforcedPowerLimitMW),
		DefaultLimitW: watts(d.DefaultPowerLimitMW), MinLimitW: watts(d.MinPowerLimitMW), MaxLimitW: watts(d.MaxPowerLimitMW),
	}); p != (snapshot.Power{}) || d.EnergyMJ != nil {
		if d.EnergyMJ != nil {
			p.EnergyJ = snapshot.Ptr(float64(*d.EnergyMJ) / 1000)
		}
		g.Power = &p
	}
	if a := d.Activity; a != nil {
		ratio := func(v *float64) *float64 {
			if v == nil {
				return nil
			}
			return snapshot.Ptr(min(max(*v, 0), 100) / 100)
		}
		g.Activity = &snapshot.Activity{Graphics: ratio(a.GraphicsPercent), SM: ratio(a.SMPercent), Tensor: ratio(a.TensorPercent), DRAM: ratio(a.DRAMPercent)}
	}
	if c := d.Clocks; c != nil {
		g.Clocks = &snapshot.Clocks{
			GraphicsMHz: float(c.GraphicsMHz), SMMHz: float(c.SMMHz), MemoryMHz: float(c.MemoryMHz),
			MaxGraphicsMHz: float(c.MaxGraphicsMHz), MaxSMMHz: float(c.MaxSMMHz), MaxMemoryMHz: float(c.MaxMemoryMHz),
		}
	}
	if t := (snapshot.Temperature{
		GPUC: float(d.TemperatureC), ShutdownC: float(d.ShutdownC), SlowdownC: float(d.SlowdownC),
		MaxOpC: float(d.GPUMaxC), MemMaxC: float(d.MemoryMaxC),
	}); t != (snapshot.Temperature{}) {
		g.Temperature = &t
	}
	for _, f := range d.Fans {
		g.Fans = append(g.Fans, snapshot.Fan{Percent: float(f.Percent)})
	}
	if d.PerformanceState != nil && *d.PerformanceState >= 0 && *d.PerformanceState <= 15 {
		g.PerformanceState = fmt.Sprintf("P%d", *d.PerformanceState)
	}
	g.UtilizationGPU = float(d.UtilizationGPU)

	if e := (snapshot.ECC{
		Enabled: d.ECCEnabled, Pending: d.ECCPending,
		VolatileCorrectable: d.ECCVolatileCorrected, VolatileUncorrectable: d.ECCVolatileUncorrected,
		AggregateCorrectable: d.ECCAggregateCorrected, AggregateUncorrectable: d.ECCAggregateUncorrected,
	}); e != (snapshot.ECC{}) {
		if e.Enabled != nil {
			e.Supported = snapshot.Ptr(true)
		}
		g.ECC = &e
	}
	if d.RetiredPagesSingleBit != nil || d.RetiredPagesDoubleBit != nil || d.RetiredPagesPending != nil {
		g.RetiredPages = &snapshot.RetiredPages{SingleBit: d.RetiredPagesSingleBit, DoubleBit: d.RetiredPagesDoubleBit, Pending: d.RetiredPagesPending}
	}
	if rr := d.RemappedRows; rr != nil {
		g.RemappedRows = &snapshot.RemappedRows{
			Correctable: snapshot.Ptr(rr.Correctable), Uncorrectable: snapshot.Ptr(rr.Uncorrectable),
			Pending: snapshot.Ptr(rr.Pending), Failure: snapshot.Ptr(rr.Failure),
		}
	}
	if l := (snapshot.PCIeLink{
		CurrentGen: positive(d.PCIeCurrentGen), MaxGen: positive(d.PCIeMaxGen),
		CurrentWidth: positive(d.PCIeCurrentWidth), MaxWidth: positive(d.PCIeMaxWidth), Replays: d.PCIeReplays,
	}); l != (snapshot.PCIeLink{}) {
		g.PCIe = &l
	}
	if d.MIGEnabled != nil {
		m := &snapshot.MIG{Enabled: *d.MIGEnabled, PendingEnabled: d.MIGPending}
		for _, md := range d.MIGDevices {
			m.Instances = append(m.Instances, snapshot.MIGInstance{
				GPUInstance: md.GPUInstance, ComputeInstance: md.ComputeInstance, Profile: md.Profile,
				UUID: md.UUID, SMs: max(md.SMs, 0), MemoryBytes: md.MemoryBytes,
				Start: nonNegative(md.Start), Size: nonNegative(md.Size),
			})
		}
		g.MIG = m
	}
	for _, l := range d.NVLinks {
		st := "inactive"
		if l.Active {
			st = "active"
		}
		remote, _ := snapshot.CanonicalPCI(l.RemotePCI) // "" when absent or unreadable
		nl := snapshot.NVLink{Link: l.Link, State: st, Version: int(l.Version), RemotePCI: remote, RemoteKind: l.RemoteType}
		if e := l.Errors; e != nil {
			nl.Errors = &snapshot.NVLinkErrors{Replay: e.Replay, Recovery: e.Recovery, CRCFlit: e.CRCFlit, CRCData: e.CRCData}
		}
		if l.TxKiB != nil {
			nl.TxBytes = snapshot.Ptr(*l.TxKiB * 1024)
		}
		if l.RxKiB != nil {
			nl.RxBytes = snapshot.Ptr(*l.RxKiB * 1024)
		}
		g.NVLinks = append(g.NVLinks, nl)
	}
	return g
}

func watts(mw *uint32) *float64 {
	if mw == nil {
		return nil
	}
	return snapshot.Ptr(float64(*mw) / 1000)
}

func float(v *uint32) *float64 {
	if v == nil {
		return nil
	}
	return snapshot.Ptr(float64(*v))
}

// positive is *v when it is a positive number, else 0 (unknown).
func positive(v *int) int {
	if v == nil || *v < 0 {
		return 0
	}
	return *v
}

func nonNegative(v *int) *int {
	if v == nil || *v < 0 {
		return nil
	}
	return snapshot.Ptr(*v)
}
