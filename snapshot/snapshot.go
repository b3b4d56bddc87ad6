// Package snapshot defines kiln's model of one node: the host, its driver
// stack, every GPU with its PCIe path and links, the PCIe tree around the
// GPUs, and the kernel log events that concern them.
//
// A Snapshot is produced by the live discovery sources (package discover) or
// by the offline importers (package capture), and consumed by every analysis
// package (topo, doctor, and later compat, plan and sched). It is plain data:
// no methods here do I/O.
//
// Unknown values are left empty (zero string, nil pointer). A parser never
// invents a value it did not read: "N/A" in a capture stays unknown.
package snapshot

import "time"

// SchemaVersion is the version of the JSON model written by this package.
// It changes when a field changes meaning or is removed; adding an optional
// field does not change it.
const SchemaVersion = 1

// Vendor names used in GPU.Vendor and PCIDevice.Vendor.
const (
	VendorNVIDIA = "nvidia"
	VendorAMD    = "amd"
	VendorIntel  = "intel"
)

// Snapshot is one node at one moment.
type Snapshot struct {
	SchemaVersion int       `json:"schema_version"`
	CollectedAt   time.Time `json:"collected_at,omitzero"`
	// Sources lists what produced this snapshot: live sources or capture files.
	Sources []Source `json:"sources,omitempty"`

	Host    Host    `json:"host"`
	Drivers Drivers `json:"drivers"`

	GPUs []GPU `json:"gpus"`
	// Links are device-to-device interconnects (NVLink, xGMI) aggregated per
	// pair of endpoints. Per-link NVLink state lives in GPU.NVLinks.
	Links []Link `json:"links,omitempty"`
	// PCI holds the PCIe tree around the GPUs: root ports, switch ports,
	// bridges, NICs, NVMe drives, NVSwitches, and the GPUs' own functions.
	PCI []PCIDevice `json:"pci,omitempty"`
	// Matrix is a topology matrix imported as is (nvidia-smi topo -m,
	// rocm-smi --showtopo) when the PCI tree itself is not known.
	Matrix *TopoMatrix `json:"matrix,omitempty"`
	// Events are kernel-log and fabric-manager events that concern GPUs,
	// NVSwitches or the PCIe fabric.
	Events []Event `json:"events,omitempty"`
	// Claims are counts that a capture states about itself ("attached_gpus 4"),
	// kept so that a capture that holds less than it claims can be reported.
	Claims []Claim `json:"claims,omitempty"`
	// Notes are things a source wants the reader to know that are not data:
	// "NVML library not found", a warning banner printed by a tool.
	Notes []Note `json:"notes,omitempty"`
	// Measurements are bandwidth and latency figures measured on the node
	// (kiln bench --record), each beside the rating of its link.
	Measurements *Measurements `json:"measurements,omitempty"`
}

// Source says where data came from.
type Source struct {
	// Kind is the importer or live source: sysfs, nvml, kfd, kmsg,
	// nvidia-smi-q, nvidia-smi-q-xml, nvidia-smi, nvidia-smi-topo,
	// nvidia-smi-nvlink, lspci, rocm-smi, amd-smi, dmesg, fabricmanager, record.
	Kind string `json:"kind"`
	// Path is the file or directory read; empty for live API sources.
	Path string `json:"path,omitempty"`
	// Tool version where the source states it (nvidia-smi version, ROCm version).
	Version string `json:"version,omitempty"`
}

// Note is a message from a source that is not a measurement.
type Note struct {
	Source  string `json:"source"`
	Message string `json:"message"`
}

// XidInferred is the Reason of an Xid event kiln read from the driver's
// message (a GSP timeout banner) where the log has no Xid line.
const XidInferred = "inferred"

// Reasons of a tool error.
const (
	// ToolGPULost: the driver lost the GPU (NVML_ERROR_GPU_IS_LOST; the
	// GPU fell off the bus or stopped answering).
	ToolGPULost = "gpu-lost"
	// ToolGPUError: the tool could not read the GPU (Unknown Error, a GPU
	// that requires a reset, fields that all read ERR! or N/A).
	ToolGPUError = "gpu-error"
	// ToolDriverUnreachable: the tool could not talk to the driver at all.
	ToolDriverUnreachable = "driver-unreachable"
	// ToolNoDevices: the tool found no GPU.
	ToolNoDevices = "no-devices"
	// ToolVersionMismatch: the user-space library and the kernel module
	// differ ("Driver/library version mismatch").
	ToolVersionMismatch = "version-mismatch"
	// ToolPermissionDenied: the tool ran without access to the GPU device
	// nodes (amd-smi "/dev/kfd: Permission denied"): what it printed as
	// N/A says nothing about the GPUs, and the capture should be taken
	// again with access.
	ToolPermissionDenied = "permission-denied"
)

// Claim is a count a capture states about the machine.
type Claim struct {
	Source string `json:"source"`
	// What is counted: "gpus".
	What  string `json:"what"`
	Count int    `json:"count"`
	// Detail says where the claim was read ("attached_gpus", "system block lists 8 DRM devices").
	Detail string `json:"detail,omitempty"`
}

// Host describes the machine outside its GPUs.
type Host struct {
	Hostname     string     `json:"hostname,omitempty"`
	OS           string     `json:"os,omitempty"`         // ID from os-release: debian, ubuntu, rhel
	OSVersion    string     `json:"os_version,omitempty"` // VERSION_ID
	OSPrettyName string     `json:"os_pretty_name,omitempty"`
	Kernel       string     `json:"kernel,omitempty"`
	Arch         string     `json:"arch,omitempty"` // x86_64, aarch64
	CPUModel     string     `json:"cpu_model,omitempty"`
	CPUs         int        `json:"cpus,omitempty"`
	MemoryBytes  uint64     `json:"memory_bytes,omitempty"`
	Virtualized  string     `json:"virtualized,omitempty"` // hypervisor or pass-through mode when known
	NUMANodes    []NUMANode `json:"numa_nodes,omitempty"`
	// CPUSet is the set of CPUs the collecting process could run on, in
	// kernel list form ("0-63"). When it is smaller than the host's CPUs the
	// capture describes a container's cpuset, not the host.
	CPUSet string `json:"cpuset,omitempty"`
	// OnlineCPUs is the host's online CPU list in kernel list form.
	OnlineCPUs string `json:"online_cpus,omitempty"`
}

// NUMANode is one NUMA node of the host.
type NUMANode struct {
	ID   int    `json:"id"`
	CPUs string `json:"cpus,omitempty"` // kernel list form, "0-63,128-191"
	// MemoryBytes is the node's memory when known.
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
}

// Drivers is the node's GPU software stack.
type Drivers struct {
	// NVIDIAKernel is the loaded kernel module's version
	// (/sys/module/nvidia/version or /proc/driver/nvidia/version).
	NVIDIAKernel string `json:"nvidia_kernel,omitempty"`
	// NVIDIAUser is the user-space driver version (NVML's system driver
	// version, nvidia-smi's "Driver Version").
	NVIDIAUser string `json:"nvidia_user,omitempty"`
	NVML       string `json:"nvml,omitempty"`
	// CUDADriver is the highest CUDA version the driver supports, "12.2".
	CUDADriver string `json:"cuda_driver,omitempty"`
	// NVIDIAOpenKernel is true when the open kernel modules are loaded.
	NVIDIAOpenKernel *bool          `json:"nvidia_open_kernel,omitempty"`
	FabricManager    *FabricManager `json:"fabric_manager,omitempty"`

	AMDGPU string `json:"amdgpu,omitempty"` // amdgpu module version
	ROCm   string `json:"rocm,omitempty"`
	// NouveauLoaded is nil when unknown.
	NouveauLoaded *bool `json:"nouveau_loaded,omitempty"`
	// Toolkits are CUDA or ROCm toolkits found installed on the node.
	Toolkits []Toolkit `json:"toolkits,omitempty"`
}

// Toolkit is an installed CUDA or ROCm toolkit.
type Toolkit struct {
	Kind    string `json:"kind"` // cuda, rocm
	Version string `json:"version"`
	Path    string `json:"path,omitempty"`
}

// FabricManager is the state of NVIDIA's fabric manager, required on
// NVSwitch systems.
type FabricManager struct {
	// Installed, Running: nil when unknown.
	Installed *bool  `json:"installed,omitempty"`
	Running   *bool  `json:"running,omitempty"`
	Version   string `json:"version,omitempty"`
	// State is the GPU fabric state as nvidia-smi or NVML reports it
	// ("Completed", "In Progress", "Not Started").
	State  string `json:"state,omitempty"`
	Status string `json:"status,omitempty"` // "Success" or an error
}

// GPU is one physical GPU (or, for AMD partition modes, one physical package
// with its partitions listed).
type GPU struct {
	Index  int    `json:"index"`
	Vendor string `json:"vendor"`
	Model  string `json:"model,omitempty"`
	// PCIAddress is canonical: dddd:bb:dd.f, lowercase. Empty when the
	// source gives none (plain nvidia-smi topo -m).
	PCIAddress string `json:"pci_address,omitempty"`
	// DeviceID and SubsystemID are PCI ids as 4-hex-digit lowercase strings
	// ("2330"), SubsystemID as "vvvv:dddd".
	DeviceID    string `json:"device_id,omitempty"`
	SubsystemID string `json:"subsystem_id,omitempty"`
	UUID        string `json:"uuid,omitempty"`
	Serial      string `json:"serial,omitempty"`
	BoardPart   string `json:"board_part,omitempty"`
	// Name as read from the source when it differs from Model's normal form.
	Architecture string `json:"architecture,omitempty"`
	// ComputeCapability is NVIDIA's "9.0"; GFXTarget is AMD's "gfx942".
	ComputeCapability string `json:"compute_capability,omitempty"`
	GFXTarget         string `json:"gfx_target,omitempty"`

	MemoryTotalBytes uint64 `json:"memory_total_bytes,omitempty"`
	MemoryUsedBytes  uint64 `json:"memory_used_bytes,omitempty"`
	// MemoryUsedPercent is the share of memory allocated, where a tool
	// prints only a percentage (rocm-smi's VRAM%); nil when unknown.
	MemoryUsedPercent *float64 `json:"memory_used_percent,omitempty"`
	// MemoryVisibleBytes is the CPU-visible part of the memory (the BAR
	// size; AMD's VIS_VRAM). Much smaller than the total means no
	// resizable BAR.
	MemoryVisibleBytes uint64 `json:"memory_visible_bytes,omitempty"`
	// UniqueID is AMD's per-ASIC unique id in hex ("0x79ccd55167a2124a"),
	// as rocm-smi prints it; KFD's decimal unique_id is converted to it.
	UniqueID string `json:"unique_id,omitempty"`

	VBIOS    string            `json:"vbios,omitempty"`
	InfoROM  *InfoROM          `json:"inforom,omitempty"`
	Firmware map[string]string `json:"firmware,omitempty"` // AMD: name -> version

	Power       *Power       `json:"power,omitempty"`
	Clocks      *Clocks      `json:"clocks,omitempty"`
	Temperature *Temperature `json:"temperature,omitempty"`
	Fans        []Fan        `json:"fans,omitempty"`
	// PerformanceState is "P0".."P15" where the vendor reports one.
	PerformanceState string `json:"performance_state,omitempty"`
	// PerfLevel is AMD's DPM performance level (auto, low, high, manual,
	// profile_peak ...), as the driver reports it.
	PerfLevel string `json:"perf_level,omitempty"`
	// UtilizationGPU is percent busy, nil when unknown.
	UtilizationGPU *float64 `json:"utilization_gpu,omitempty"`
	// Activity is the profiling counters' view of the last sample period,
	// where the GPU has them.
	Activity *Activity `json:"activity,omitempty"`
	// Persistence is nil when unknown (Windows: N/A).
	Persistence *bool  `json:"persistence,omitempty"`
	ComputeMode string `json:"compute_mode,omitempty"`
	DriverModel string `json:"driver_model,omitempty"` // WDDM, TCC on Windows
	// Virtualization is "Pass-Through", "VGPU", "None" where reported.
	Virtualization string `json:"virtualization,omitempty"`
	Processes      int    `json:"processes,omitempty"`
	// ProcessesRead says the driver or the tool listed the GPU's
	// processes: Processes is then a count, zero included. Without it a
	// zero says nothing.
	ProcessesRead bool `json:"processes_read,omitempty"`
	// ProcessList is the processes using the GPU where the driver lists
	// them (NVML), with what each uses.
	ProcessList []GPUProcess `json:"process_list,omitempty"`

	ECC          *ECC          `json:"ecc,omitempty"`
	RetiredPages *RetiredPages `json:"retired_pages,omitempty"`
	RemappedRows *RemappedRows `json:"remapped_rows,omitempty"`
	// Throttle lists the clock-event (throttle) reasons, active or not.
	Throttle []ThrottleReason `json:"throttle,omitempty"`

	MIG *MIG `json:"mig,omitempty"`
	// Partition is AMD's compute and memory partition mode.
	Partition *Partition `json:"partition,omitempty"`

	PCIe *PCIeLink `json:"pcie,omitempty"`
	// Upstream lists the PCI addresses of the bridges between the GPU and its
	// root port, nearest first, root port last. Their links are in Snapshot.PCI.
	Upstream []string `json:"upstream,omitempty"`
	// NUMANode is nil when the source says nothing; -1 when the platform
	// reports no NUMA affinity (sysfs numa_node -1, rocm-smi "Numa Affinity -1").
	NUMANode    *int   `json:"numa_node,omitempty"`
	CPUAffinity string `json:"cpu_affinity,omitempty"` // kernel list form

	NVLinks []NVLink `json:"nvlinks,omitempty"`
	// KFDNodes are the KFD topology node ids of this GPU (one per partition).
	KFDNodes []int `json:"kfd_nodes,omitempty"`
	// XGMIHive is the AMD xGMI hive id; GPUs with the same id share a hive.
	XGMIHive string `json:"xgmi_hive,omitempty"`
	// Matrix name of this GPU in an imported topology matrix ("GPU0").
	MatrixName string `json:"matrix_name,omitempty"`
}

// GPUProcess is a process using a GPU, as the driver lists it.
type GPUProcess struct {
	// PID is in the driver's (the host's) PID namespace.
	PID int `json:"pid"`
	// MemoryBytes is the GPU memory it uses; nil where the driver does not
	// say (it hides it from a container without the host's PIDs).
	MemoryBytes *uint64 `json:"memory_bytes,omitempty"`
	// GPUInstance and ComputeInstance place it on a MIG instance.
	GPUInstance     *int `json:"gi,omitempty"`
	ComputeInstance *int `json:"ci,omitempty"`
	// SMPercent is its share of the SMs' time in the driver's last
	// samples, where the driver samples processes (not under MIG).
	SMPercent *float64 `json:"sm_percent,omitempty"`
}

// InfoROM holds NVIDIA InfoROM versions and validity.
type InfoROM struct {
	Image string `json:"image,omitempty"`
	OEM   string `json:"oem,omitempty"`
	ECC   string `json:"ecc,omitempty"`
	Power string `json:"power,omitempty"`
	// Valid is false when the driver reports the InfoROM as corrupted
	// ("Inforom Validation: Failed" / NVML checksum error); nil when unknown.
	Valid *bool `json:"valid,omitempty"`
}

// Power is power draw and limits, in watts.
type Power struct {
	DrawW         *float64 `json:"draw_w,omitempty"`
	LimitW        *float64 `json:"limit_w,omitempty"` // current power limit
	EnforcedW     *float64 `json:"enforced_w,omitempty"`
	DefaultLimitW *float64 `json:"default_limit_w,omitempty"`
	MinLimitW     *float64 `json:"min_limit_w,omitempty"`
	MaxLimitW     *float64 `json:"max_limit_w,omitempty"`
	// EnergyJ is the energy the GPU used since the driver loaded.
	EnergyJ *float64 `json:"energy_j,omitempty"`
}

// Activity is what a GPU's profiling counters say of the last sample
// period (NVIDIA's GPM on Hopper and newer), as shares of the time, 0 to
// 1: the graphics engine, SMs, tensor cores and DRAM busy.
type Activity struct {
	Graphics *float64 `json:"graphics,omitempty"`
	SM       *float64 `json:"sm,omitempty"`
	Tensor   *float64 `json:"tensor,omitempty"`
	DRAM     *float64 `json:"dram,omitempty"`
}

// Clocks in MHz.
type Clocks struct {
	GraphicsMHz    *float64 `json:"graphics_mhz,omitempty"`
	SMMHz          *float64 `json:"sm_mhz,omitempty"`
	MemoryMHz      *float64 `json:"memory_mhz,omitempty"`
	MaxGraphicsMHz *float64 `json:"max_graphics_mhz,omitempty"`
	MaxSMMHz       *float64 `json:"max_sm_mhz,omitempty"`
	MaxMemoryMHz   *float64 `json:"max_memory_mhz,omitempty"`
}

// Temperature in degrees Celsius. Edge and Junction are AMD's names; GPU is
// NVIDIA's core temperature.
type Temperature struct {
	GPUC      *float64 `json:"gpu_c,omitempty"`
	MemoryC   *float64 `json:"memory_c,omitempty"`
	EdgeC     *float64 `json:"edge_c,omitempty"`
	JunctionC *float64 `json:"junction_c,omitempty"`
	// Thresholds reported by the driver.
	SlowdownC *float64 `json:"slowdown_c,omitempty"`
	ShutdownC *float64 `json:"shutdown_c,omitempty"`
	MaxOpC    *float64 `json:"max_operating_c,omitempty"` // GPU target / max operating temp
	MemMaxC   *float64 `json:"memory_max_c,omitempty"`
	CriticalC *float64 `json:"critical_c,omitempty"` // AMD temp*_crit
}

// Fan is one fan reading.
type Fan struct {
	// Percent is nil when unknown or in error.
	Percent *float64 `json:"percent,omitempty"`
	RPM     *float64 `json:"rpm,omitempty"`
	// Error is the raw text when the tool reported a fault ("ERR!").
	Error string `json:"error,omitempty"`
}

// ECC is the ECC mode and error counters.
type ECC struct {
	// Enabled/Pending: nil when unknown or not supported.
	Enabled *bool `json:"enabled,omitempty"`
	Pending *bool `json:"pending,omitempty"`
	// Supported is false when the GPU has no ECC (most consumer cards).
	Supported *bool `json:"supported,omitempty"`
	// Counters since the last driver load (volatile) and over the GPU's life (aggregate).
	VolatileCorrectable    *uint64 `json:"volatile_correctable,omitempty"`
	VolatileUncorrectable  *uint64 `json:"volatile_uncorrectable,omitempty"`
	AggregateCorrectable   *uint64 `json:"aggregate_correctable,omitempty"`
	AggregateUncorrectable *uint64 `json:"aggregate_uncorrectable,omitempty"`
}

// RetiredPages is NVIDIA's page retirement (pre-Ampere).
type RetiredPages struct {
	SingleBit *uint64 `json:"single_bit,omitempty"`
	DoubleBit *uint64 `json:"double_bit,omitempty"`
	Pending   *bool   `json:"pending,omitempty"`
}

// RemappedRows is NVIDIA's row remapping (Ampere and later).
type RemappedRows struct {
	Correctable   *uint64 `json:"correctable,omitempty"`
	Uncorrectable *uint64 `json:"uncorrectable,omitempty"`
	Pending       *bool   `json:"pending,omitempty"`
	Failure       *bool   `json:"failure,omitempty"`
}

// ThrottleReason is one clock-event reason. Names are normalised to
// snake_case: idle, applications_clocks_setting, sw_power_cap, hw_slowdown,
// hw_thermal_slowdown, hw_power_brake_slowdown, sw_thermal_slowdown,
// sync_boost, display_clock_setting; AMD adds its own.
type ThrottleReason struct {
	Name   string `json:"name"`
	Active bool   `json:"active"`
	// Microseconds is the accumulated time in this state where reported.
	Microseconds *uint64 `json:"us,omitempty"`
}

// MIG is NVIDIA Multi-Instance GPU state.
type MIG struct {
	// Current and Pending mode; Pending differs from Current until a GPU reset.
	Enabled        bool          `json:"enabled"`
	PendingEnabled *bool         `json:"pending_enabled,omitempty"`
	Instances      []MIGInstance `json:"instances,omitempty"`
}

// MIGInstance is one MIG device (GPU instance plus compute instance).
type MIGInstance struct {
	GPUInstance     int    `json:"gi"`
	ComputeInstance int    `json:"ci"`
	Profile         string `json:"profile,omitempty"` // "1g.10gb" when known
	UUID            string `json:"uuid,omitempty"`
	SMs             int    `json:"sms,omitempty"`
	MemoryBytes     uint64 `json:"memory_bytes,omitempty"`
	// Placement start slot and size where known.
	Start *int `json:"start,omitempty"`
	Size  *int `json:"size,omitempty"`
}

// Partition is AMD's compute/memory partitioning of one GPU.
type Partition struct {
	Compute string `json:"compute,omitempty"` // SPX, DPX, TPX, QPX, CPX
	Memory  string `json:"memory,omitempty"`  // NPS1, NPS4
	Count   int    `json:"count,omitempty"`   // partitions seen
}

// PCIeLink is a PCIe link's state: generation (1-6) and width (lanes).
// Zero means unknown.
type PCIeLink struct {
	CurrentGen   int `json:"current_gen,omitempty"`
	MaxGen       int `json:"max_gen,omitempty"`
	CurrentWidth int `json:"current_width,omitempty"`
	MaxWidth     int `json:"max_width,omitempty"`
	// HostMaxGen is the slot/host side maximum where the tool reports it
	// (nvidia-smi "Host Max").
	HostMaxGen int `json:"host_max_gen,omitempty"`
	// Replays is the PCIe replay counter since reset (nil: unknown).
	Replays         *uint64 `json:"replays,omitempty"`
	ReplayRollovers *uint64 `json:"replay_rollovers,omitempty"`
	// TX/RX throughput in KB/s where reported.
	TxKBps *float64 `json:"tx_kbps,omitempty"`
	RxKBps *float64 `json:"rx_kbps,omitempty"`
}

// NVLink is one NVLink of a GPU.
type NVLink struct {
	Link int `json:"link"`
	// State: "active", "inactive", "disabled".
	State string `json:"state"`
	// Version as the driver reports it (NVML's enum, not marketing names).
	Version int `json:"version,omitempty"`
	// SpeedGBps is what the tool prints per link; nvidia-smi's figure is
	// per direction.
	SpeedGBps float64 `json:"speed_gbps_uni,omitempty"`
	// RemotePCI is the remote end's PCI address, RemoteKind "gpu" or "nvswitch".
	RemotePCI  string `json:"remote_pci,omitempty"`
	RemoteKind string `json:"remote_kind,omitempty"`
	// Errors are the link's error counters where the driver gives them.
	Errors *NVLinkErrors `json:"errors,omitempty"`
	// TxBytes and RxBytes are the data sent and received over the link
	// since the driver loaded.
	TxBytes *uint64 `json:"tx_bytes,omitempty"`
	RxBytes *uint64 `json:"rx_bytes,omitempty"`
}

// NVLinkErrors are an NVLink's data-link error counters: replays and
// recoveries of the link, and flits and data failing their CRC.
type NVLinkErrors struct {
	Replay   uint64 `json:"replay"`
	Recovery uint64 `json:"recovery"`
	CRCFlit  uint64 `json:"crc_flit"`
	CRCData  uint64 `json:"crc_data"`
}

// Link kinds.
const (
	LinkNVLink = "nvlink"
	LinkXGMI   = "xgmi"
	LinkPCIe   = "pcie"
	LinkC2C    = "c2c"
)

// Link is an interconnect between two devices, aggregated over its lanes or
// links. A and B are PCI addresses when known, else matrix names ("GPU0").
type Link struct {
	A    string `json:"a"`
	B    string `json:"b"`
	Kind string `json:"kind"`
	// Count is the number of NVLinks or xGMI links between A and B. For a
	// link through an NVSwitch fabric, the number of links each GPU has into it.
	Count int `json:"count,omitempty"`
	// Version is the interconnect generation where known (NVLink 4, xGMI 3).
	Version int `json:"version,omitempty"`
	// ViaSwitch is true for NVLink through NVSwitches.
	ViaSwitch bool `json:"via_switch,omitempty"`
	// BandwidthGBpsUni is a bandwidth stated by the source per direction, if any.
	BandwidthGBpsUni float64 `json:"bandwidth_gbps_uni,omitempty"`
	// Weight and Hops as AMD's KFD or rocm-smi reports them.
	Weight int `json:"weight,omitempty"`
	Hops   int `json:"hops,omitempty"`
}

// PCI device kinds.
const (
	KindGPU        = "gpu"
	KindNVSwitch   = "nvswitch"
	KindNIC        = "nic"
	KindNVMe       = "nvme"
	KindRootPort   = "root-port"
	KindSwitchUp   = "switch-upstream"
	KindSwitchDown = "switch-downstream"
	KindBridge     = "bridge"
	KindHostBridge = "host-bridge"
	KindOther      = "other"
)

// PCIDevice is one PCI function in the tree around the GPUs.
type PCIDevice struct {
	Address  string `json:"address"`             // canonical dddd:bb:dd.f
	VendorID string `json:"vendor_id,omitempty"` // "10de"
	DeviceID string `json:"device_id,omitempty"`
	// Class is the 6-hex-digit class code ("030200") or its first 4 digits.
	Class string `json:"class,omitempty"`
	Kind  string `json:"kind"`
	Name  string `json:"name,omitempty"`
	// Parent is the upstream bridge's address; empty on the root complex.
	Parent   string    `json:"parent,omitempty"`
	NUMANode *int      `json:"numa_node,omitempty"`
	Link     *PCIeLink `json:"link,omitempty"`
	ACS      *ACS      `json:"acs,omitempty"`
	AER      *AER      `json:"aer,omitempty"`
	Driver   string    `json:"driver,omitempty"`
	// Interface is the network interface or block device name (mlx5_0, eth0, nvme0n1).
	Interface string `json:"interface,omitempty"`
}

// ACS is the Access Control Services control register of a downstream or
// root port. Enabled redirect bits force peer-to-peer traffic up to the root
// complex.
type ACS struct {
	SrcValid    bool `json:"src_valid"`
	TransBlk    bool `json:"trans_blk"`
	ReqRedir    bool `json:"req_redir"`
	CmpltRedir  bool `json:"cmplt_redir"`
	UpstreamFwd bool `json:"upstream_fwd"`
	EgressCtrl  bool `json:"egress_ctrl"`
	DirectTrans bool `json:"direct_trans"`
}

// AER holds the Advanced Error Reporting status bits set on a device, by
// their lspci names ("RxErr", "BadTLP", "UnsupReq").
type AER struct {
	Correctable   []string `json:"correctable,omitempty"`
	Uncorrectable []string `json:"uncorrectable,omitempty"`
	// Counters from sysfs aer_dev_* files where read: name -> count.
	Counts map[string]uint64 `json:"counts,omitempty"`
}

// Event kinds.
const (
	EventXid          = "xid"
	EventSXid         = "sxid"
	EventFallenOffBus = "fallen-off-bus"
	EventAMDGPU       = "amdgpu"
	EventAER          = "aer"
	EventNVSwitch     = "nvswitch"
	EventProbeFailed  = "probe-failed"
	// EventToolError is a GPU tool's own report that it could not reach a
	// GPU or the driver (nvidia-smi "Unable to determine the device handle
	// for GPU ...: GPU is lost", rocm-smi read errors); Reason classifies it.
	EventToolError = "tool-error"
	// EventInitFailed is a GPU the driver found but could not bring up
	// (NVRM "RmInitAdapter failed!", amdgpu "Fatal error during GPU init").
	EventInitFailed = "init-failed"
)

// Event is one kernel-log or fabric-manager event. Multi-line messages are
// joined into one event.
type Event struct {
	Time time.Time `json:"time,omitzero"`
	// RawTime is the time as printed when it could not be read as a date
	// (dmesg's seconds since boot).
	RawTime string `json:"raw_time,omitempty"`
	Source  string `json:"source"` // kmsg, dmesg, journal, fabricmanager
	Kind    string `json:"kind"`
	Code    int    `json:"code,omitempty"`
	// Device is the canonical PCI address of the device concerned.
	Device  string `json:"device,omitempty"`
	Process string `json:"process,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Message string `json:"message"`
	// Reason classifies a tool error: one of the Tool constants; for an
	// Xid kiln inferred from its message without an Xid line, "inferred".
	Reason string `json:"reason,omitempty"`
	// Port is the root or switch port that reported a PCIe AER event.
	Port string `json:"port,omitempty"`
	// Repeats counts the events like this one (same kind, code and
	// device, before it) that a long log had and were not kept one by one.
	Repeats int `json:"repeats,omitempty"`
}

// TopoMatrix is a device matrix as printed by a vendor tool.
type TopoMatrix struct {
	Source string `json:"source"` // nvidia-smi-topo, rocm-smi
	// Devices are the row/column names in order ("GPU0", "NIC0").
	Devices []string `json:"devices"`
	// Cells[i][j] is the connection between Devices[i] and Devices[j]
	// as printed ("NV18", "PIX", "SYS", "X", "XGMI").
	Cells [][]string `json:"cells"`
	// Aliases map a matrix name to a real name ("NIC0" -> "mlx5_bond_0").
	Aliases map[string]string `json:"aliases,omitempty"`
	// CPUAffinity and NUMA per device where printed.
	CPUAffinity map[string]string `json:"cpu_affinity,omitempty"`
	NUMA        map[string]int    `json:"numa,omitempty"`
	// Weights and Hops per pair where printed (rocm-smi).
	Weights [][]int `json:"weights,omitempty"`
	Hops    [][]int `json:"hops,omitempty"`
}

// Verdicts of a Measurement.
const (
	// VerdictOK: at or above the threshold share of the rating.
	VerdictOK = "ok"
	// VerdictBelowRating: under the threshold share of the rating.
	VerdictBelowRating = "below-rating"
	// VerdictNotRated: no rating is known for the link.
	VerdictNotRated = "not-rated"
	// VerdictNotJudged: a figure kept for reference (pageable memory,
	// latency), never compared with a rating.
	VerdictNotJudged = "not-judged"
	// VerdictFailed: the test could not run; Error says why.
	VerdictFailed = "failed"
)

// Measurements are the results of one kiln bench run on the node.
type Measurements struct {
	// Tool is "kiln bench" and its version.
	Tool string `json:"tool"`
	// Driver is the GPU API measured through ("cuda", "hip") and its version.
	Driver        string `json:"driver"`
	DriverVersion string `json:"driver_version,omitempty"`
	// Collectives is the collective library ("nccl 2.21.5", "rccl 2.18.3"),
	// empty when none was loaded.
	Collectives string    `json:"collectives,omitempty"`
	At          time.Time `json:"at,omitzero"`
	// ThresholdPercent is the share of the rating below which a figure is
	// below-rating (70 unless set).
	ThresholdPercent float64 `json:"threshold_percent"`
	// Ranks is the number of GPUs in a collective run over several nodes
	// (0 when the collectives ran on this node's GPUs only).
	Ranks   int           `json:"ranks,omitempty"`
	Results []Measurement `json:"results"`
	// Notes say what was not measured and why.
	Notes []string `json:"notes,omitempty"`
}

// Measurement is one figure: the median of repeated runs of one test.
type Measurement struct {
	// Test is h2d, d2h, device, p2p, p2p-bidi, p2p-latency, all-reduce,
	// all-gather or reduce-scatter.
	Test string `json:"test"`
	// Devices are the canonical PCI addresses of the GPUs measured (one for
	// host and device tests, source then destination for p2p, every GPU
	// for collectives); GPUs are their indexes in the Snapshot.
	Devices []string `json:"devices"`
	GPUs    []int    `json:"gpus"`
	// Memory is pinned or pageable for host transfers.
	Memory string `json:"memory,omitempty"`
	// HostNUMANode is the NUMA node of the host memory; HostLocal says
	// whether it is the GPU's own node. Nil when unknown or not placed.
	HostNUMANode *int  `json:"host_numa_node,omitempty"`
	HostLocal    *bool `json:"host_local,omitempty"`
	// PeerAccess says whether the driver gave direct peer access between
	// the two GPUs of a p2p test (false: copies were staged through host
	// memory).
	PeerAccess *bool `json:"peer_access,omitempty"`
	// Bytes is the size of one copy (the buffer size for collectives, as
	// nccl-tests prints it); Copies the copies per timed run.
	Bytes       int64 `json:"bytes"`
	Copies      int   `json:"copies,omitempty"`
	Warmup      int   `json:"warmup"`
	Repetitions int   `json:"repetitions"`
	// Direction is uni (one direction), bidi (both directions added),
	// read+write (device memory: bytes read plus bytes written) or bus
	// (collectives: bus bandwidth, comparable with one direction of the
	// slowest link).
	Direction string `json:"direction,omitempty"`
	// Bandwidth figures in GB/s (10^9 bytes per second): the median of
	// the repetitions, and the slowest and fastest.
	MedianGBps float64 `json:"median_gbps,omitempty"`
	MinGBps    float64 `json:"min_gbps,omitempty"`
	MaxGBps    float64 `json:"max_gbps,omitempty"`
	// AlgGBps is a collective's algorithm bandwidth (size / time), median.
	AlgGBps float64 `json:"alg_gbps,omitempty"`
	// Latency figures in microseconds for latency tests.
	MedianUS float64 `json:"median_us,omitempty"`
	MinUS    float64 `json:"min_us,omitempty"`
	MaxUS    float64 `json:"max_us,omitempty"`
	// Link names what was measured ("GPU0 host link", "GPU0-GPU1 NV18").
	Link string `json:"link,omitempty"`
	// RatedGBps is the link's rating in the same direction as the figure;
	// RatedBasis says where it comes from. Zero when unknown.
	RatedGBps  float64 `json:"rated_gbps,omitempty"`
	RatedBasis string  `json:"rated_basis,omitempty"`
	// Ratio is MedianGBps / RatedGBps.
	Ratio   float64 `json:"ratio,omitempty"`
	Verdict string  `json:"verdict"`
	// Error says why the test failed.
	Error string `json:"error,omitempty"`
}
