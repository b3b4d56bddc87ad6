package topo

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
)

// Build computes the connection matrix of the node s describes. It never
// guesses: a pair that no source describes gets class "?" and a note.
func Build(s *snapshot.Snapshot, k *kb.KB) (*Matrix, error) {
	if s == nil {
		return nil, errors.New("topo: no snapshot to build a matrix from")
	}
	if k == nil {
		return nil, errors.New("topo: no knowledge base to rate links with")
	}
	b := newBuilder(s, k)
	b.collectDevices()
	b.collectLinks()
	n := len(b.devs)
	b.m.Cells = make([][]Cell, n)
	for i := range b.m.Cells {
		b.m.Cells[i] = make([]Cell, n)
		b.m.Cells[i][i] = Cell{Class: ClassSelf}
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			c := b.cell(i, j)
			b.m.Cells[i][j] = c
			b.m.Cells[j][i] = c
		}
	}
	b.flushNotes()
	return b.m, nil
}

// devInfo is what the builder knows about one matrix device.
type devInfo struct {
	gpu *snapshot.GPU
	pci *snapshot.PCIDevice
	// addr is the canonical PCI address, empty when unknown.
	addr string
	// matrixName is the device's name in the imported matrix, if any.
	matrixName string
	// hint is GPU.Upstream, canonical.
	hint []string
	// model is the knowledge-base row of a GPU, when found.
	model *kb.GPUModel
}

type builder struct {
	s    *snapshot.Snapshot
	k    *kb.KB
	m    *Matrix
	devs []devInfo
	pci  map[string]*snapshot.PCIDevice
	// matrixIndex maps an imported matrix's device name to its row.
	matrixIndex map[string]int
	fabric      fabric
	chains      map[int]chainInfo
	// notes groups pairs by the reason they are noted, in first-seen order.
	noteOrder []string
	notePairs map[string][]string
	plain     []string
}

func newBuilder(s *snapshot.Snapshot, k *kb.KB) *builder {
	b := &builder{
		s:           s,
		k:           k,
		m:           &Matrix{},
		pci:         map[string]*snapshot.PCIDevice{},
		matrixIndex: map[string]int{},
		notePairs:   map[string][]string{},
		chains:      map[int]chainInfo{},
	}
	for i := range s.PCI {
		d := &s.PCI[i]
		if a := canon(d.Address); a != "" {
			if _, dup := b.pci[a]; !dup {
				b.pci[a] = d
			}
		}
	}
	if mx := s.Matrix; mx != nil {
		for i, name := range mx.Devices {
			name = strings.TrimSpace(name)
			if _, dup := b.matrixIndex[name]; name != "" && !dup {
				b.matrixIndex[name] = i
			}
		}
	}
	return b
}

// canon returns the canonical form of a PCI address, or "" when it is not one.
func canon(a string) string {
	if strings.TrimSpace(a) == "" {
		return ""
	}
	c, err := snapshot.CanonicalPCI(a)
	if err != nil {
		return ""
	}
	return c
}

func (b *builder) collectDevices() {
	gpus := make([]*snapshot.GPU, 0, len(b.s.GPUs))
	for i := range b.s.GPUs {
		gpus = append(gpus, &b.s.GPUs[i])
	}
	slices.SortStableFunc(gpus, func(x, y *snapshot.GPU) int { return x.Index - y.Index })
	usedMatrix := map[string]bool{}
	for _, g := range gpus {
		d := devInfo{gpu: g, addr: canon(g.PCIAddress), matrixName: strings.TrimSpace(g.MatrixName)}
		if d.addr != "" {
			d.pci = b.pci[d.addr]
		}
		if _, ok := b.matrixIndex[d.matrixName]; !ok {
			d.matrixName = ""
		}
		usedMatrix[d.matrixName] = true
		for _, u := range g.Upstream {
			if c := canon(u); c != "" {
				d.hint = append(d.hint, c)
			}
		}
		if m, ok := b.lookupModel(g); ok {
			d.model = &m
		}
		b.devs = append(b.devs, d)
	}
	// GPUs that only an imported matrix names.
	if mx := b.s.Matrix; mx != nil {
		for _, name := range mx.Devices {
			name = strings.TrimSpace(name)
			if strings.HasPrefix(name, "GPU") && !usedMatrix[name] {
				usedMatrix[name] = true
				b.devs = append(b.devs, devInfo{matrixName: name})
				b.plain = append(b.plain, fmt.Sprintf("%s appears only in the imported %s matrix; nothing else is known about it", name, matrixSource(mx)))
			}
		}
	}
	for i := range b.devs {
		b.m.Devices = append(b.m.Devices, b.device(i, KindGPU))
	}

	for _, kind := range []string{KindNIC, KindNVMe} {
		var found []devInfo
		for a, d := range b.pci {
			if d.Kind == pciKind(kind) {
				found = append(found, devInfo{pci: d, addr: a})
			}
		}
		slices.SortFunc(found, func(x, y devInfo) int { return strings.Compare(x.addr, y.addr) })
		// Match the imported matrix's NIC names by interface name (NIC
		// Legend "NIC0: mlx5_0").
		if kind == KindNIC && b.s.Matrix != nil {
			for i := range found {
				for name := range b.matrixIndex {
					if strings.HasPrefix(name, "NIC") && !usedMatrix[name] && found[i].pci.Interface != "" &&
						b.s.Matrix.Aliases[name] == found[i].pci.Interface {
						found[i].matrixName = name
						usedMatrix[name] = true
					}
				}
			}
			if len(found) == 0 {
				for _, name := range b.s.Matrix.Devices {
					name = strings.TrimSpace(name)
					if strings.HasPrefix(name, "NIC") && !usedMatrix[name] {
						usedMatrix[name] = true
						found = append(found, devInfo{matrixName: name})
					}
				}
			}
		}
		for _, d := range found {
			b.devs = append(b.devs, d)
			b.m.Devices = append(b.m.Devices, b.device(len(b.devs)-1, kind))
		}
	}
	// Number NICs and NVMe drives in matrix order.
	counts := map[string]int{}
	for i := range b.m.Devices {
		d := &b.m.Devices[i]
		prefix := map[string]string{KindGPU: "GPU", KindNIC: "NIC", KindNVMe: "NVME"}[d.Kind]
		d.Name = prefix + strconv.Itoa(counts[d.Kind])
		counts[d.Kind]++
	}
}

func pciKind(kind string) string {
	if kind == KindNIC {
		return snapshot.KindNIC
	}
	return snapshot.KindNVMe
}

func matrixSource(mx *snapshot.TopoMatrix) string {
	if mx.Source != "" {
		return mx.Source
	}
	return "topology"
}

func (b *builder) lookupModel(g *snapshot.GPU) (kb.GPUModel, bool) {
	if g.DeviceID != "" && g.Vendor != "" {
		if m, ok := b.k.GPUByDeviceID(g.Vendor, g.DeviceID); ok {
			return m, true
		}
	}
	if g.Model != "" {
		return b.k.GPUByName(g.Model)
	}
	return kb.GPUModel{}, false
}

// device fills the public Device of b.devs[i].
func (b *builder) device(i int, kind string) Device {
	d := b.devs[i]
	out := Device{Kind: kind, PCI: d.addr}
	if d.gpu != nil {
		out.Model = d.gpu.Model
		out.NUMANode = d.gpu.NUMANode
		out.CPUAffinity = d.gpu.CPUAffinity
	}
	if d.pci != nil {
		if out.Model == "" {
			out.Model = d.pci.Name
		}
		out.Interface = d.pci.Interface
	}
	if out.NUMANode == nil {
		out.NUMANode = b.numaOf(i)
	}
	if mx := b.s.Matrix; mx != nil && d.matrixName != "" {
		if out.NUMANode == nil {
			if n, ok := mx.NUMA[d.matrixName]; ok && n >= 0 {
				out.NUMANode = snapshot.Ptr(n)
			}
		}
		if out.CPUAffinity == "" {
			out.CPUAffinity = mx.CPUAffinity[d.matrixName]
		}
		if out.Interface == "" {
			out.Interface = mx.Aliases[d.matrixName]
		}
	}
	if out.CPUAffinity == "" && out.NUMANode != nil {
		for _, n := range b.s.Host.NUMANodes {
			if n.ID == *out.NUMANode {
				out.CPUAffinity = n.CPUs
			}
		}
	}
	if out.NUMANode != nil && *out.NUMANode < 0 {
		out.NUMANode = nil
	}
	return out
}

// numaOf is the NUMA node of a device from the PCI tree: its own, else the
// nearest ancestor's. Nil when unknown.
func (b *builder) numaOf(i int) *int {
	d := b.devs[i]
	if d.gpu != nil && d.gpu.NUMANode != nil && *d.gpu.NUMANode >= 0 {
		return d.gpu.NUMANode
	}
	for _, a := range b.chain(i).path {
		if p := b.pci[a]; p != nil && p.NUMANode != nil && *p.NUMANode >= 0 {
			return p.NUMANode
		}
	}
	return nil
}

// cell decides the connection between devices i and j (i < j).
func (b *builder) cell(i, j int) Cell {
	if c, ok := b.fabricCell(i, j); ok {
		return c
	}
	imported, hasImported := b.importedCell(i, j)
	if hasImported && (imported.Kind == LinkNVLink || imported.Kind == LinkXGMI) {
		return imported
	}
	c, ok, reason := b.pcieCell(i, j)
	if ok {
		if hasImported && !sameClass(imported.Class, c.Class) {
			b.note(fmt.Sprintf("the PCIe tree and the imported %s matrix disagree; the tree's class is reported", matrixSource(b.s.Matrix)),
				fmt.Sprintf("%s (tree %s, matrix %s)", b.pair(i, j), c.Class, imported.Class))
		}
		return c
	}
	if hasImported {
		return imported
	}
	if c, ok := b.numaCell(i, j); ok {
		return c
	}
	if reason == "" {
		reason = "connection unknown: no NVLink/xGMI data, no complete PCIe path and no imported matrix covers the pair"
	}
	b.note(reason, b.pair(i, j))
	return Cell{Class: ClassUnknown, Basis: "not known from the sources read"}
}

func (b *builder) pair(i, j int) string {
	return b.m.Devices[i].Name + "-" + b.m.Devices[j].Name
}

// note records that a pair is concerned by a reason; notes are grouped.
func (b *builder) note(reason, pair string) {
	if _, ok := b.notePairs[reason]; !ok {
		b.noteOrder = append(b.noteOrder, reason)
	}
	b.notePairs[reason] = append(b.notePairs[reason], pair)
}

func (b *builder) flushNotes() {
	b.m.Notes = append(b.m.Notes, b.plain...)
	for _, r := range b.noteOrder {
		pairs := b.notePairs[r]
		const show = 12
		list := strings.Join(pairs[:min(len(pairs), show)], ", ")
		if len(pairs) > show {
			list += fmt.Sprintf(" and %d more", len(pairs)-show)
		}
		b.m.Notes = append(b.m.Notes, fmt.Sprintf("%s: %s", r, list))
	}
}

// numaCell decides SYS for devices on different NUMA nodes when nothing
// else describes their path: whatever the PCIe tree, traffic between them
// crosses the SMP interconnect.
func (b *builder) numaCell(i, j int) (Cell, bool) {
	na, nb := b.m.Devices[i].NUMANode, b.m.Devices[j].NUMANode
	if na == nil || nb == nil || *na == *nb {
		return Cell{}, false
	}
	var hops []hop
	for _, x := range []int{i, j} {
		l := b.endpointLink(x)
		hops = append(hops, hop{child: b.addrOrName(x), childLink: l})
	}
	route := fmt.Sprintf("across NUMA nodes %d and %d (the PCIe path itself is not known; only the two devices' own links are rated; the inter-socket link is not rated)", *na, *nb)
	c := b.rate(ClassSys, route, hops)
	c.FromNUMA = true
	return c, true
}

// addrOrName is a device's PCI address, or its matrix name when the address
// is not known.
func (b *builder) addrOrName(i int) string {
	if b.devs[i].addr != "" {
		return b.devs[i].addr
	}
	return b.m.Devices[i].Name
}
