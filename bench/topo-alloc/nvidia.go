package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// Link types of go-gpuallocator, the values of the P2PLinkType constants
// of its internal links package.
const (
	p2pCrossCPU     = 1 // SYS
	p2pSameCPU      = 2 // NODE
	p2pHostBridge   = 3 // PHB
	p2pMultiSwitch  = 4 // PXB
	p2pSingleSwitch = 5 // PIX
	// p2pNVLinks is the type of one NVLink; n bonded links are
	// p2pNVLinks+n-1, up to 18.
	p2pNVLinks  = 7
	maxNVLinks  = 18
	p2pNVLink18 = p2pNVLinks + maxNVLinks - 1
)

// nvidiaPicker hands the choice of GPUs to NVIDIA's go-gpuallocator
// BestEffort policy, the library itself (the policy NVIDIA's Kubernetes
// device plugin asks for a preferred allocation). Its devices are built
// from kiln's topology of the node the way the library's NewDevices builds
// them from NVML: for every pair, one link for the PCIe level (NVML's
// common ancestor) and one for the NVLinks bonded between the two GPUs.
//
// Through NVSwitches the library, reading NVML, would find no NVLink
// between GPUs (each link ends at a switch); here it is told NV18 for every
// pair as kiln's topology says. On that layout every set is the best class
// anyway, so the comparison does not depend on it.
type nvidiaPicker struct {
	devices []*gpuallocator.Device // by sched device index
	policy  gpuallocator.Policy
}

// newNVIDIAPicker builds the library's devices for node, read from the
// snapshot s it was made of.
func newNVIDIAPicker(s *snapshot.Snapshot, node *sched.Node, k *kb.KB) (*nvidiaPicker, error) {
	full, err := topo.Build(s, k)
	if err != nil {
		return nil, err
	}
	// The same node without NVLink gives the PCIe class of the pairs that
	// the full matrix names by their NVLinks.
	bare := *s
	bare.Links, bare.Matrix = nil, nil
	bare.GPUs = slices.Clone(s.GPUs)
	for i := range bare.GPUs {
		bare.GPUs[i].NVLinks = nil
	}
	pcie, err := topo.Build(&bare, k)
	if err != nil {
		return nil, err
	}
	rowF, err := gpuRows(full, node)
	if err != nil {
		return nil, err
	}
	rowP, err := gpuRows(pcie, node)
	if err != nil {
		return nil, err
	}
	devs := make([]*gpuallocator.Device, len(node.Devices))
	for i := range devs {
		devs[i] = &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
	}
	for i := range devs {
		for j := i + 1; j < len(devs); j++ {
			c := full.Cells[rowF[i]][rowF[j]]
			pc := c
			if c.Kind != topo.LinkPCIe {
				pc = pcie.Cells[rowP[i]][rowP[j]]
			}
			if t, ok := pcieType(pc.Class); ok {
				link(devs, i, j, t)
			}
			if n := nvlinks(c); n > 0 {
				link(devs, i, j, p2pNVLinks+n-1)
			}
		}
	}
	return &nvidiaPicker{devices: devs, policy: gpuallocator.NewBestEffortPolicy()}, nil
}

// link adds the link both ways: the policy refuses one-sided links.
func link(devs []*gpuallocator.Device, i, j, t int) {
	ij, ji := gpuallocator.P2PLink{GPU: devs[j]}, gpuallocator.P2PLink{GPU: devs[i]}
	setType(&ij.Type, t)
	setType(&ji.Type, t)
	devs[i].Links[j] = append(devs[i].Links[j], ij)
	devs[j].Links[i] = append(devs[j].Links[i], ji)
}

// setType stores a link type into the library's P2PLinkType, whose
// package is internal to the module and so cannot be named here.
func setType[T ~uint](dst *T, t int) { *dst = T(t) }

// gpuRows maps sched device indexes to the GPU rows of m, by PCI address.
func gpuRows(m *topo.Matrix, node *sched.Node) ([]int, error) {
	byPCI := map[string]int{}
	for _, r := range m.GPUs() {
		byPCI[m.Devices[r].PCI] = r
	}
	rows := make([]int, len(node.Devices))
	for i, d := range node.Devices {
		r, ok := byPCI[d.PCI]
		if !ok || d.PCI == "" {
			return nil, fmt.Errorf("GPU %d (%q) is not in the topology matrix", i, d.PCI)
		}
		rows[i] = r
	}
	return rows, nil
}

// pcieType is the library's link type for a PCIe class of nvidia-smi.
func pcieType(class string) (int, bool) {
	switch strings.ToUpper(class) {
	case topo.ClassPIX:
		return p2pSingleSwitch, true
	case topo.ClassPXB:
		return p2pMultiSwitch, true
	case topo.ClassPHB:
		return p2pHostBridge, true
	case topo.ClassNode:
		return p2pSameCPU, true
	case topo.ClassSys:
		return p2pCrossCPU, true
	}
	return 0, false
}

// nvlinks is the number of NVLinks of a cell, at most 18.
func nvlinks(c topo.Cell) int {
	if c.Kind != topo.LinkNVLink {
		return 0
	}
	n := c.Links
	if n <= 0 {
		n, _ = strconv.Atoi(strings.TrimPrefix(strings.ToUpper(c.Class), "NV"))
	}
	return min(max(n, 0), maxNVLinks)
}

// Pick implements sched.Picker with the library's Allocate on the free
// GPUs, listed in index order. Requests with a locality (which the
// library has no notion of) are left to kiln's picker; the scenario makes
// none.
func (p *nvidiaPicker) Pick(t *sched.Topology, free uint64, k int, loc sched.Locality) (uint64, bool) {
	if loc != (sched.Locality{}) {
		return sched.TopologyPicker{}.Pick(t, free, k, loc)
	}
	var avail []*gpuallocator.Device
	for i, d := range p.devices {
		if free&(1<<i) != 0 {
			avail = append(avail, d)
		}
	}
	got := p.policy.Allocate(avail, nil, k)
	if len(got) != k {
		return 0, false
	}
	var set uint64
	for _, d := range got {
		set |= 1 << d.Index
	}
	return set, true
}
