// Package kb is kiln's knowledge base: facts about GPUs, links, drivers and
// error codes, kept as embedded data files (kb/data/*.yaml) where every row
// names its source. Code looks facts up here instead of branching on model
// names, so a new GPU or a new driver release is a data change.
package kb

import (
	"embed"
	"errors"
	"fmt"
	"sync"

	"sigs.k8s.io/yaml"
)

//go:embed data/*.yaml
var dataFS embed.FS

// KB holds every table. The zero value is empty; use Default.
type KB struct {
	// xids is the Xid catalogue, read on first use (XIDTable): at 177
	// codes it is half of the data, and most commands never look an Xid
	// up (loading it cost every kiln doctor run 4 ms and 1.8 MB).
	xids lazyXIDs
	// ptx is the PTX ISA and target table (kb/data/ptx.yaml), read on
	// first use (kb/ptx.go).
	ptx lazyPTX
	// The compat tables below are read on first use (compat()).
	compatOnce sync.Once
	compatSrc  fileReader
	compatErr  error

	GPUs          []GPUModel     `json:"gpus"`
	PCIe          []PCIeGen      `json:"pcie"`
	Interconnects []Interconnect `json:"interconnects"`
	CUDA          []CUDARelease  `json:"cuda"`
	MIG           []MIGModel     `json:"mig"`
	// CUDAArchs, ForwardCompat, Frameworks, ROCm and ROCmKMD are the
	// tables kiln compat reads (kb/compat.go); read them through its
	// lookups, which load them on first use.
	CUDAArchs     []CUDAArch          `json:"cuda_archs"`
	ForwardCompat []ForwardCompatRule `json:"forward_compat"`
	Frameworks    []FrameworkBuild    `json:"frameworks"`
	ROCm          []ROCmRelease       `json:"rocm"`
	ROCmKMD       []ROCmKMD           `json:"rocm_kmd"`
}

// GPUModel is one GPU model (one PCI device id, or one marketing name).
type GPUModel struct {
	// Name is kiln's normal form ("H100-SXM5-80GB").
	Name   string `json:"name"`
	Vendor string `json:"vendor"` // nvidia, amd, intel
	// DeviceIDs are PCI device ids (lowercase hex, "2330"); several SKUs may share a row.
	DeviceIDs []string `json:"device_ids,omitempty"`
	// Match are substrings of the names tools print ("H100 80GB HBM3").
	Match []string `json:"match,omitempty"`
	// Class: datacenter, workstation, consumer.
	Class               string  `json:"class"`
	Architecture        string  `json:"architecture,omitempty"`
	ComputeCapability   string  `json:"compute_capability,omitempty"`
	GFXTarget           string  `json:"gfx_target,omitempty"`
	MemoryGB            float64 `json:"memory_gb,omitempty"`             // the board's, as its data sheet gives it
	MemoryBandwidthGBps float64 `json:"memory_bandwidth_gbps,omitempty"` // the board's; a GCD's: DeviceMemoryBandwidthGBps
	PCIeGen             int     `json:"pcie_gen,omitempty"`
	PCIeWidth           int     `json:"pcie_width,omitempty"`
	// Interconnect is the GPU-to-GPU link kind ("nvlink", "xgmi") and
	// version, and how many links one GPU has.
	Interconnect      string `json:"interconnect,omitempty"`
	InterconnectGen   int    `json:"interconnect_gen,omitempty"`
	InterconnectLinks int    `json:"interconnect_links,omitempty"`
	ECC               bool   `json:"ecc,omitempty"`
	MIG               bool   `json:"mig,omitempty"`
	// NVSwitch is true for boards whose GPUs meet through NVSwitches (HGX),
	// which need the fabric manager.
	NVSwitch bool    `json:"nvswitch,omitempty"`
	TDPW     float64 `json:"tdp_w,omitempty"`
	// Thermal limits where the vendor publishes them.
	MaxTempC float64 `json:"max_temp_c,omitempty"`
	// GCDs is how many graphics compute dies the board has, each a GPU of
	// its own to the OS (MI250, MI250X: 2); 0 means one.
	GCDs int `json:"gcds,omitempty"`
	// Multiprocessors is the board's number of streaming multiprocessors
	// (NVIDIA) or compute units (AMD) as shipped; one GCD's:
	// DeviceMultiprocessors. 0 where no source states it.
	Multiprocessors int    `json:"multiprocessors,omitempty"`
	Source          string `json:"source"`
}

// DeviceMultiprocessors is the number of SMs or CUs of one GPU the OS
// sees: the board's, shared among its GCDs (an MI250X GCD has 110 of
// 220). It is 0 when the catalog has no figure.
func (m GPUModel) DeviceMultiprocessors() int {
	if m.GCDs > 1 {
		return m.Multiprocessors / m.GCDs
	}
	return m.Multiprocessors
}

// DeviceMemoryBandwidthGBps is the memory bandwidth of one GPU the OS
// sees: the board's, shared among its GCDs (an MI250 GCD has half of the
// board's 3,276.8 GB/s). It is 0 when the catalog has no figure.
func (m GPUModel) DeviceMemoryBandwidthGBps() float64 {
	if m.GCDs > 1 {
		return m.MemoryBandwidthGBps / float64(m.GCDs)
	}
	return m.MemoryBandwidthGBps
}

// PCIeGen is one PCIe generation's per-lane rate.
type PCIeGen struct {
	Gen int `json:"gen"`
	// GTps is the raw transfer rate per lane.
	GTps float64 `json:"gtps"`
	// GBpsPerLaneUni is the usable rate per lane per direction after line
	// encoding, in GB/s.
	GBpsPerLaneUni float64 `json:"gbps_per_lane_uni"`
	Encoding       string  `json:"encoding"`
	Source         string  `json:"source"`
}

// Interconnect is one GPU-to-GPU link generation.
type Interconnect struct {
	Kind string `json:"kind"` // nvlink, xgmi
	Gen  int    `json:"gen"`
	// GBpsPerLinkUni is one link's bandwidth per direction in GB/s.
	GBpsPerLinkUni float64 `json:"gbps_per_link_uni"`
	Source         string  `json:"source"`
}

// CUDARelease is one CUDA toolkit release and the drivers it needs.
type CUDARelease struct {
	Version string `json:"version"` // "12.4" or "12.4.1"
	// MinDriverLinux is the toolkit's own minimum driver ("550.54.14").
	MinDriverLinux string `json:"min_driver_linux"`
	// MinorCompatDriver is the lowest driver that runs it under minor-version
	// compatibility ("525.60.13" for 12.x).
	MinorCompatDriver string `json:"minor_compat_driver,omitempty"`
	Source            string `json:"source"`
}

// XID is one NVIDIA Xid code.
type XID struct {
	Code     int    `json:"code"`
	Mnemonic string `json:"mnemonic"`
	Meaning  string `json:"meaning"`
	// Severity kiln gives the finding: critical (hardware, needs reset or
	// RMA), warning (application class), info. It follows
	// XIDSeverityFor(Action, Investigate) unless SeverityReason says why not.
	Severity string `json:"severity"`
	// Action is NVIDIA's immediate resolution bucket (RESTART_APP, RESET_GPU, RESTART_BM ...).
	Action string `json:"action"`
	// Investigate is NVIDIA's investigatory resolution bucket
	// (CONTACT_SUPPORT, WORKFLOW_XID_13, INVESTIGATE_SW ...), "" where
	// NVIDIA publishes none.
	Investigate string `json:"investigate"`
	// SeverityReason says why Severity differs from XIDSeverityFor(Action,
	// Investigate); empty when it follows the rule.
	SeverityReason string `json:"severity_reason,omitempty"`
	// SideEffect is true where NVIDIA describes the code as usually the
	// consequence of, or a companion to, another Xid (45, 94/95, 154 ...).
	// It does not lower Severity; it tells the doctor to lead with the
	// other Xid when both are present.
	SideEffect bool `json:"side_effect,omitempty"`
	// Remedy in words for the report.
	Remedy string `json:"remedy"`
	Source string `json:"source"`
}

var (
	defaultOnce sync.Once
	defaultKB   *KB
	defaultErr  error
)

// Default returns the knowledge base built into the binary.
func Default() *KB {
	defaultOnce.Do(func() { defaultKB, defaultErr = Load(dataFS) })
	if defaultErr != nil {
		// The embedded data is tested; a broken file is a build defect.
		panic(defaultErr)
	}
	return defaultKB
}

type fileReader interface {
	ReadFile(name string) ([]byte, error)
}

// Load reads the tables from a file system laid out like kb/data.
func Load(fsys fileReader) (*KB, error) {
	k := &KB{}
	files := []struct {
		name string
		dst  any
	}{
		{"data/gpus.yaml", &k.GPUs},
		{"data/pcie.yaml", &k.PCIe},
		{"data/interconnects.yaml", &k.Interconnects},
		{"data/cuda.yaml", &k.CUDA},
		{"data/mig.yaml", &k.MIG},
	}
	for _, f := range files {
		if err := loadTable(fsys, f.name, f.dst); err != nil {
			return nil, err
		}
	}
	k.xids.src = fsys
	k.ptx.src = fsys
	k.compatSrc = fsys
	return k, k.validate()
}

func loadTable(fsys fileReader, name string, dst any) error {
	b, err := fsys.ReadFile(name)
	if err != nil {
		return fmt.Errorf("kb: %w", err)
	}
	var doc struct {
		Rows any `json:"rows"`
	}
	doc.Rows = dst
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		return fmt.Errorf("kb: %s: %w", name, err)
	}
	return nil
}

// compat reads the tables kiln compat uses (CUDA architectures, forward
// compatibility, framework builds, ROCm releases) on first use: the other
// commands never need them. A KB built in memory (tests) keeps its own.
func (k *KB) compat() error {
	k.compatOnce.Do(func() {
		if k.compatSrc == nil {
			return
		}
		for _, f := range []struct {
			name string
			dst  any
		}{
			{"data/cuda-arch.yaml", &k.CUDAArchs},
			{"data/cuda-forward-compat.yaml", &k.ForwardCompat},
			{"data/frameworks.yaml", &k.Frameworks},
			{"data/rocm.yaml", &k.ROCm},
			{"data/rocm-kmd.yaml", &k.ROCmKMD},
		} {
			if err := loadTable(k.compatSrc, f.name, f.dst); err != nil {
				k.compatErr = err
				return
			}
		}
		k.compatErr = k.validateCompat()
	})
	return k.compatErr
}

type lazyXIDs struct {
	once sync.Once
	src  fileReader
	rows []XID
	err  error
}

// XIDTable returns the Xid catalogue (kb/data/xid.yaml), reading it on the
// first call.
func (k *KB) XIDTable() ([]XID, error) {
	x := &k.xids
	x.once.Do(func() {
		if x.src == nil {
			return
		}
		b, err := x.src.ReadFile("data/xid.yaml")
		if err != nil {
			x.err = fmt.Errorf("kb: %w", err)
			return
		}
		var doc struct {
			Rows []XID `json:"rows"`
		}
		if err := yaml.UnmarshalStrict(b, &doc); err != nil {
			x.err = fmt.Errorf("kb: data/xid.yaml: %w", err)
			return
		}
		for i, r := range doc.Rows {
			if r.Code <= 0 || r.Severity == "" || r.Source == "" {
				x.err = errors.Join(x.err, fmt.Errorf("kb: xid row %d: code, severity and source are required", i))
			}
		}
		x.rows = doc.Rows
	})
	return x.rows, x.err
}
