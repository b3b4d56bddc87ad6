// Package cdi writes Container Device Interface (CDI) specs for the GPUs
// kiln found on a node, so that a container runtime (containerd, podman,
// CRI-O, or kiln's own container executor) can hand a job exactly the GPUs
// of its lease.
//
// Every GPU becomes a device of kind kiln.dev/gpu, named both by its index
// ("kiln.dev/gpu=0") and by its UUID ("kiln.dev/gpu=GPU-5c8a…"); each MIG
// instance is named "<gpu>:<gi>:<ci>" and by its MIG UUID; "all" holds
// every whole GPU. A device carries:
//
//   - NVIDIA: /dev/nvidiaN, /dev/nvidiactl, /dev/nvidia-uvm,
//     /dev/nvidia-uvm-tools, and for a MIG instance the two
//     /dev/nvidia-caps/nvidia-capN nodes that grant its GPU and compute
//     instance; the driver's user-space libraries and tools are bind-mounted
//     read-only where the caller says they are (FindNVIDIADriverFiles finds
//     them), under /usr/local/nvidia/lib64 and /usr/local/nvidia/bin, the
//     directories CUDA images already search.
//   - AMD: /dev/kfd and the GPU's /dev/dri/renderD* nodes (one per
//     partition), plus /dev/dri/card* when sysfs lists it.
//   - Intel: the GPU's /dev/dri/renderD* and /dev/dri/card* nodes.
//
// What a snapshot does not hold (device minors, MIG capability minors,
// render nodes, dynamic majors) is read from the host's /proc and /sys
// through Options.Root. A GPU whose nodes cannot be read is left out with a
// note, never guessed, unless Options.AssumeNodes asks for the usual
// numbering (recorded machines in a demo).
package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"

	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"kiln.dev/kiln/snapshot"
)

// Names of kiln's CDI devices.
const (
	Vendor = "kiln.dev"
	Class  = "gpu"
	// Kind is the CDI kind of every device kiln writes.
	Kind = Vendor + "/" + Class
	// AllDevices is the name of the device that holds every whole GPU.
	AllDevices = "all"
)

// Where the NVIDIA driver's files appear inside containers by default:
// CUDA base images put these directories on LD_LIBRARY_PATH and PATH.
const (
	DefaultLibraryDir = "/usr/local/nvidia/lib64"
	DefaultBinaryDir  = "/usr/local/nvidia/bin"
)

// Options says where the host's facts and the driver's files are.
type Options struct {
	// Root is the host's root file system, read for /proc and /sys facts;
	// nil means the running host (os.DirFS("/")).
	Root fs.FS
	// NVIDIALibraries are host paths of the NVIDIA driver's user-space
	// libraries (libcuda.so.<version>, libnvidia-ml.so.<version>, ...),
	// mounted read-only into LibraryDir, once under their own name and once
	// under their ELF soname (libcuda.so.1) when it differs.
	NVIDIALibraries []string
	// NVIDIABinaries are host paths of driver tools (nvidia-smi, ...),
	// mounted read-only into BinaryDir.
	NVIDIABinaries []string
	// LibraryDir and BinaryDir are the directories inside the container;
	// empty means DefaultLibraryDir and DefaultBinaryDir.
	LibraryDir string
	BinaryDir  string
	// AssumeNodes uses the usual numbering when the host does not say
	// (/dev/nvidia<index>, /dev/dri/renderD<128+index>), for recorded
	// machines that are not this host. Each assumption is noted.
	AssumeNodes bool
}

// Device is one CDI device in a generated spec.
type Device struct {
	// Name is the device's name within kind kiln.dev/gpu ("0",
	// "GPU-5c8a…", "0:1:0", "all").
	Name string `json:"name"`
	// QualifiedName is "kiln.dev/gpu=<Name>", what a runtime is asked for.
	QualifiedName string `json:"qualified_name"`
	Vendor        string `json:"vendor,omitempty"`
	// GPUIndex is the snapshot index of the GPU; -1 for "all".
	GPUIndex   int    `json:"gpu_index"`
	PCIAddress string `json:"pci_address,omitempty"`
	UUID       string `json:"uuid,omitempty"`
	// MIG is set for a MIG instance.
	MIG *MIGRef `json:"mig,omitempty"`
	// Nodes are the device nodes the container gets.
	Nodes []string `json:"nodes"`
}

// MIGRef names one MIG instance of a GPU.
type MIGRef struct {
	GPUInstance     int `json:"gi"`
	ComputeInstance int `json:"ci"`
}

// Result is a generated spec, the devices in it, and what was left out.
type Result struct {
	Spec    *cdispec.Spec `json:"spec"`
	Devices []Device      `json:"devices"`
	// Notes say which GPU or node was left out or assumed, and why.
	Notes []string `json:"notes,omitempty"`
}

// QualifiedName returns the fully qualified CDI name of a kiln device.
func QualifiedName(name string) string { return parser.QualifiedName(Vendor, Class, name) }

// GPUName is the device name of a whole GPU by its index.
func GPUName(index int) string { return strconv.Itoa(index) }

// MIGName is the device name of a MIG instance.
func MIGName(gpuIndex, gi, ci int) string { return fmt.Sprintf("%d:%d:%d", gpuIndex, gi, ci) }

// ErrNoDevices is returned when no GPU of the snapshot could be described.
var ErrNoDevices = errors.New("no GPU of the snapshot could be described as a CDI device")

// Generate builds the CDI spec for every GPU of snap.
func Generate(snap *snapshot.Snapshot, opts Options) (*Result, error) {
	if snap == nil {
		return nil, errors.New("cdi: no snapshot")
	}
	if opts.Root == nil {
		opts.Root = os.DirFS("/")
	}
	if opts.LibraryDir == "" {
		opts.LibraryDir = DefaultLibraryDir
	}
	if opts.BinaryDir == "" {
		opts.BinaryDir = DefaultBinaryDir
	}
	for _, dir := range []string{opts.LibraryDir, opts.BinaryDir} {
		if !path.IsAbs(dir) || path.Clean(dir) != dir {
			return nil, fmt.Errorf("cdi: container directory %q must be an absolute, clean path", dir)
		}
	}
	g := newGenerator(opts)

	gpus := make([]snapshot.GPU, len(snap.GPUs))
	copy(gpus, snap.GPUs)
	sort.SliceStable(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })

	var all []*cdispec.DeviceNode
	for i := range gpus {
		gpu := &gpus[i]
		var nodes []*cdispec.DeviceNode
		switch gpu.Vendor {
		case snapshot.VendorNVIDIA:
			nodes = g.nvidia(gpu)
		case snapshot.VendorAMD:
			nodes = g.amd(gpu)
		case snapshot.VendorIntel:
			nodes = g.intel(gpu)
		default:
			g.note("GPU %s: vendor %q has no CDI devices in kiln; left out", gpuLabel(gpu), gpu.Vendor)
		}
		all = appendNodes(all, nodes...)
	}
	if len(g.spec.Devices) == 0 {
		return g.finish(), fmt.Errorf("%w (%d GPUs in it)", ErrNoDevices, len(snap.GPUs))
	}
	var mounts []*cdispec.Mount
	if g.hasNVIDIA {
		mounts = g.nvidiaMounts()
	}
	g.add(Device{Name: AllDevices, GPUIndex: -1}, []string{AllDevices}, all, mounts)
	return g.finish(), nil
}
