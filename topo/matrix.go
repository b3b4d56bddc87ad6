// Package topo builds the link matrix of one node: for every pair of GPUs,
// NICs and NVMe drives, the class of the connection between them (NV18, XGMI,
// PIX, PXB, PHB, NODE, SYS, as nvidia-smi topo -m names them) and the rated
// bandwidth of that connection, per direction and both directions added.
//
// Build is a pure function of a snapshot.Snapshot and the knowledge base. Its
// sources of truth, in order: explicit links (NVLink, xGMI), the PCIe tree,
// and, where the tree is not known, a matrix imported from a vendor tool.
// What none of them says stays unknown (class "?").
package topo

import (
	"strconv"
	"strings"
)

// Device kinds.
const (
	KindGPU  = "gpu"
	KindNIC  = "nic"
	KindNVMe = "nvme"
)

// Connection classes. NV# is "NV" followed by the number of bonded links.
const (
	ClassSelf    = "X"
	ClassXGMI    = "XGMI"
	ClassPIX     = "PIX"
	ClassPXB     = "PXB"
	ClassPHB     = "PHB"
	ClassNode    = "NODE"
	ClassSys     = "SYS"
	ClassUnknown = "?"
)

// Link kinds of a Cell.
const (
	LinkNVLink = "nvlink"
	LinkXGMI   = "xgmi"
	LinkPCIe   = "pcie"
)

// Matrix is the connection matrix of one node. Cells[i][j] describes the
// connection between Devices[i] and Devices[j]; the matrix is symmetric.
type Matrix struct {
	Devices []Device `json:"devices"`
	Cells   [][]Cell `json:"cells"`
	// Notes explain what could not be determined and which assumptions were
	// made, in words for the reader.
	Notes []string `json:"notes,omitempty"`
}

// Device is one row and column of the matrix.
type Device struct {
	// Name is GPU0.., NIC0.., NVME0.. in matrix order.
	Name string `json:"name"`
	Kind string `json:"kind"` // gpu, nic, nvme
	// PCI is the canonical PCI address when known.
	PCI   string `json:"pci,omitempty"`
	Model string `json:"model,omitempty"`
	// NUMANode is nil when unknown.
	NUMANode    *int   `json:"numa_node,omitempty"`
	CPUAffinity string `json:"cpu_affinity,omitempty"`
	// Interface is the network interface or block device (mlx5_0, nvme0n1).
	Interface string `json:"interface,omitempty"`
}

// Cell is the connection between two devices.
type Cell struct {
	// Class is X, NV#, XGMI, PIX, PXB, PHB, NODE, SYS, ? (unknown), or a
	// class an imported matrix printed that kiln does not define.
	Class string `json:"class"`
	// Kind is nvlink, xgmi or pcie; empty on the diagonal and when unknown.
	Kind string `json:"kind,omitempty"`
	// Links is the number of NVLinks or xGMI links bonded between the pair.
	Links int `json:"links,omitempty"`
	// GBpsUni is the rated bandwidth per direction in GB/s; GBpsBidi is both
	// directions added. Zero when unknown.
	GBpsUni  float64 `json:"gbps_uni,omitempty"`
	GBpsBidi float64 `json:"gbps_bidi,omitempty"`
	// NowGBpsUni is the per-direction bandwidth of the PCIe path in its
	// current link state (links train down when idle); zero when unknown
	// or not PCIe.
	NowGBpsUni float64 `json:"now_gbps_uni,omitempty"`
	// Basis says how the number was derived.
	Basis string `json:"basis,omitempty"`
	// FromNUMA is set when the class was inferred from the two devices'
	// NUMA nodes alone: no link, PCIe path or imported matrix described
	// the pair (a bridge between the cards, if any, is not known).
	FromNUMA bool `json:"from_numa,omitempty"`
	// Bottleneck is the PCI address of the device whose upstream link is
	// the slowest hop of a PCIe path.
	Bottleneck string `json:"bottleneck,omitempty"`
}

// Rank orders classes from best to worst: a smaller rank is a better
// connection. X < NV# (more links first) < XGMI < PIX < PXB < PHB < NODE <
// SYS < anything unknown.
func (c Cell) Rank() int {
	switch cls := strings.ToUpper(c.Class); {
	case cls == ClassSelf:
		return 0
	case strings.HasPrefix(cls, "NV"):
		n := c.Links
		if n <= 0 {
			n, _ = strconv.Atoi(cls[2:])
		}
		n = min(max(n, 1), 98)
		return 100 - n
	case cls == ClassXGMI:
		return 200
	case cls == ClassPIX:
		return 300
	case cls == ClassPXB:
		return 400
	case cls == ClassPHB:
		return 500
	case cls == ClassNode:
		return 600
	case cls == "PCIE":
		// rocm-smi prints PCIE without saying how far: somewhere between
		// PIX and SYS, so ranked as no better than NODE.
		return 650
	case cls == ClassSys, cls == "SOC":
		// SOC is the name older nvidia-smi releases printed for SYS.
		return 700
	default:
		return 1000
	}
}

// GPUs returns the indexes into Devices of the GPUs, in order.
func (m *Matrix) GPUs() []int {
	return m.ofKind(KindGPU)
}

func (m *Matrix) ofKind(kind string) []int {
	var out []int
	for i, d := range m.Devices {
		if d.Kind == kind {
			out = append(out, i)
		}
	}
	return out
}

// NearestNIC returns the index into Devices of the NIC best connected to
// the device at index gpu, and the class of that connection. Ties go to the
// lower index. It returns -1 and "" when gpu is out of range or no NIC has a
// known connection to it.
func (m *Matrix) NearestNIC(gpu int) (nic int, class string) {
	if gpu < 0 || gpu >= len(m.Devices) || gpu >= len(m.Cells) {
		return -1, ""
	}
	best, bestRank := -1, 0
	for _, j := range m.ofKind(KindNIC) {
		if j >= len(m.Cells[gpu]) {
			continue
		}
		c := m.Cells[gpu][j]
		r := c.Rank()
		if c.Class == ClassUnknown || r >= 1000 {
			continue
		}
		if best < 0 || r < bestRank {
			best, bestRank = j, r
		}
	}
	if best < 0 {
		return -1, ""
	}
	return best, m.Cells[gpu][best].Class
}

// Index returns the index of the device with the given name, or -1.
func (m *Matrix) Index(name string) int {
	for i, d := range m.Devices {
		if d.Name == name {
			return i
		}
	}
	return -1
}

// Cell returns the cell between two named devices.
func (m *Matrix) Cell(a, b string) (Cell, bool) {
	i, j := m.Index(a), m.Index(b)
	if i < 0 || j < 0 {
		return Cell{}, false
	}
	return m.Cells[i][j], true
}
