package sched

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"kiln.dev/kiln/doctor"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/topo"
)

// NodeFromSnapshot builds the scheduler's view of one node from its
// Snapshot, its link matrix and the doctor's report, with the built-in
// knowledge base. A nil matrix is built with topo.Build; a nil report means
// no health information (every device is taken as healthy).
func NodeFromSnapshot(s *snapshot.Snapshot, m *topo.Matrix, r *doctor.Report) (*Node, error) {
	return NodeFromSnapshotKB(s, m, r, kb.Default())
}

// NodeFromSnapshotKB is NodeFromSnapshot with a given knowledge base.
func NodeFromSnapshotKB(s *snapshot.Snapshot, m *topo.Matrix, r *doctor.Report, k *kb.KB) (*Node, error) {
	if s == nil {
		return nil, errors.New("sched: no snapshot to build a node from")
	}
	if k == nil {
		k = kb.Default()
	}
	if m == nil {
		var err error
		if m, err = topo.Build(s, k); err != nil {
			return nil, fmt.Errorf("sched: node %s: %w", s.Host.Hostname, err)
		}
	}
	n := &Node{
		Name:        s.Host.Hostname,
		CPUMilli:    int64(max(s.Host.CPUs, 0)) * 1000,
		MemoryBytes: s.Host.MemoryBytes,
		Driver:      firstNonEmpty(s.Drivers.NVIDIAUser, s.Drivers.NVIDIAKernel),
		CUDA:        s.Drivers.CUDADriver,
		AMDGPU:      s.Drivers.AMDGPU,
		ROCm:        s.Drivers.ROCm,
	}
	gpus := make([]*snapshot.GPU, 0, len(s.GPUs))
	for i := range s.GPUs {
		gpus = append(gpus, &s.GPUs[i])
	}
	slices.SortStableFunc(gpus, func(a, b *snapshot.GPU) int { return a.Index - b.Index })
	if len(gpus) > MaxDevices {
		return nil, fmt.Errorf("sched: node %s has %d GPUs; at most %d are supported", n.Name, len(gpus), MaxDevices)
	}
	for i, g := range gpus {
		n.Devices = append(n.Devices, deviceFromGPU(n, i, g, k))
	}
	n.Links = linksFromMatrix(n, m)
	if r != nil {
		applyHealth(n, r)
	}
	if err := n.validate(); err != nil {
		return nil, fmt.Errorf("sched: %w", err)
	}
	return n, nil
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if strings.TrimSpace(s) != "" {
			return strings.TrimSpace(s)
		}
	}
	return ""
}

func deviceFromGPU(n *Node, i int, g *snapshot.GPU, k *kb.KB) Device {
	d := Device{
		Index:             i,
		UUID:              g.UUID,
		Vendor:            strings.ToLower(g.Vendor),
		Model:             strings.TrimSpace(g.Model),
		Architecture:      g.Architecture,
		ComputeCapability: g.ComputeCapability,
		GFXTarget:         g.GFXTarget,
		MemoryBytes:       g.MemoryTotalBytes,
		NUMA:              -1,
	}
	if c, err := snapshot.CanonicalPCI(g.PCIAddress); err == nil && g.PCIAddress != "" {
		d.PCI = c
	}
	if g.NUMANode != nil && *g.NUMANode >= 0 {
		d.NUMA = *g.NUMANode
	}
	model, known := kb.GPUModel{}, false
	if g.Model != "" {
		model, known = k.GPUByName(g.Model)
	}
	if !known && g.DeviceID != "" {
		model, known = k.GPUByDeviceID(g.Vendor, g.DeviceID)
	}
	if known {
		d.Model = model.Name
		d.Vendor = firstNonEmpty(d.Vendor, model.Vendor)
		d.Architecture = firstNonEmpty(d.Architecture, model.Architecture)
		d.ComputeCapability = firstNonEmpty(d.ComputeCapability, model.ComputeCapability)
		d.GFXTarget = firstNonEmpty(d.GFXTarget, model.GFXTarget)
		if d.MemoryBytes == 0 && model.MemoryGB > 0 {
			d.MemoryBytes = uint64(model.MemoryGB * 1e9)
		}
		if model.MIG {
			if geo, ok := k.MIGProfiles(model.Name); ok {
				d.MIG = &geo
			}
		}
	}
	if g.MIG != nil && g.MIG.Enabled {
		d.MIGEnabled = true
		if d.MIG == nil {
			d.Unhealthy = append(d.Unhealthy, "MIG is enabled but kiln has no MIG geometry for "+firstNonEmpty(d.Model, "this model"))
			return d
		}
		inst, err := migInstances(*d.MIG, g.MIG.Instances)
		if err != nil {
			d.Unhealthy = append(d.Unhealthy, "MIG instances cannot be read: "+err.Error())
		}
		d.MIGInstances = inst
	}
	return d
}

// migInstances turns the instances a snapshot lists (one entry per compute
// instance) into GPU instances with their slots. Where the snapshot gives no
// start, the instances are laid out at legal starts the way the driver
// would (largest first, lowest start).
func migInstances(geo kb.MIGModel, in []snapshot.MIGInstance) ([]MIGInstance, error) {
	seen := map[int]bool{}
	var out []MIGInstance
	var errs []error
	for _, x := range in {
		if seen[x.GPUInstance] {
			continue
		}
		seen[x.GPUInstance] = true
		p, err := geo.Resolve(kb.MIGInstance{Profile: x.Profile, SMs: x.SMs, MemoryMiB: float64(x.MemoryBytes) / (1 << 20)})
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU instance %d: %w", x.GPUInstance, err))
			continue
		}
		mi := MIGInstance{GI: x.GPUInstance, Profile: p.Name, Start: -1, Size: p.MemorySlices, Compute: p.ComputeSlices}
		if x.Start != nil && slices.Contains(p.Placements, *x.Start) {
			mi.Start = *x.Start
		}
		out = append(out, mi)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if !layOut(geo, out) {
		return nil, fmt.Errorf("%d instances do not fit the %s placement rules", len(out), geo.Name)
	}
	return out, nil
}

// layOut gives every instance without a start a legal, non-overlapping
// start; it reports false when no layout exists.
func layOut(geo kb.MIGModel, in []MIGInstance) bool {
	var used uint32
	var todo []int
	for i, x := range in {
		if x.Start >= 0 {
			s := span(x.Start, x.Size)
			if used&s != 0 {
				return false
			}
			used |= s
			continue
		}
		todo = append(todo, i)
	}
	total := 0
	for _, x := range in {
		total += max(x.Size, 0)
	}
	if total > geo.MemorySlices {
		return false
	}
	slices.SortStableFunc(todo, func(a, b int) int { return in[b].Size - in[a].Size })
	// The outcome depends only on the next instance and the slices used.
	failed := map[[2]uint32]bool{}
	var place func(t int, used uint32) bool
	place = func(t int, used uint32) bool {
		if t == len(todo) {
			return true
		}
		if failed[[2]uint32{uint32(t), used}] {
			return false
		}
		x := &in[todo[t]]
		p, ok := geo.Profile(x.Profile)
		if !ok {
			return false
		}
		for _, st := range p.Placements {
			s := span(st, p.MemorySlices)
			if s == 0 || st+p.MemorySlices > geo.MemorySlices || used&s != 0 {
				continue
			}
			x.Start = st
			if place(t+1, used|s) {
				return true
			}
		}
		x.Start = -1
		failed[[2]uint32{uint32(t), used}] = true
		return false
	}
	return place(0, used)
}

// linksFromMatrix copies the GPU-to-GPU cells of the matrix. The matrix
// lists GPUs in the snapshot's index order (topo.Build sorts them so); a
// GPU with a PCI address is matched by it.
func linksFromMatrix(n *Node, m *topo.Matrix) [][]Link {
	rows := m.GPUs()
	byPCI := map[string]int{}
	for _, r := range rows {
		if p := m.Devices[r].PCI; p != "" {
			byPCI[p] = r
		}
	}
	row := make([]int, len(n.Devices))
	for i, d := range n.Devices {
		row[i] = -1
		if r, ok := byPCI[d.PCI]; ok && d.PCI != "" {
			row[i] = r
		} else if i < len(rows) {
			row[i] = rows[i]
		}
	}
	links := make([][]Link, len(n.Devices))
	cells := make([]Link, len(n.Devices)*len(n.Devices)) // one allocation for every row
	unknown := 0
	for i := range links {
		links[i] = cells[i*len(n.Devices) : (i+1)*len(n.Devices) : (i+1)*len(n.Devices)]
		for j := range links[i] {
			if i == j {
				links[i][j] = Link{Class: topo.ClassSelf}
				continue
			}
			a, b := row[i], row[j]
			if a < 0 || b < 0 || a >= len(m.Cells) || b >= len(m.Cells[a]) {
				links[i][j] = Link{Class: topo.ClassUnknown, Rank: rankUnknown}
				unknown++
				continue
			}
			c := m.Cells[a][b]
			links[i][j] = Link{Class: c.Class, Rank: c.Rank(), GBps: finite(c.GBpsUni)}
			if c.Class == topo.ClassUnknown {
				unknown++
			}
		}
	}
	if unknown > 0 {
		n.Notes = append(n.Notes, fmt.Sprintf("%d GPU pairs have an unknown connection; they rank last when choosing GPU sets", unknown/2))
	}
	return links
}

func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0
	}
	return f
}

// applyHealth marks devices named by critical findings as unhealthy; a
// critical finding that names no GPU of the node makes the whole node
// unschedulable.
func applyHealth(n *Node, r *doctor.Report) {
	byPCI := map[string]int{}
	for i, d := range n.Devices {
		if d.PCI != "" {
			byPCI[d.PCI] = i
		}
	}
	for _, f := range r.Findings {
		if f.Severity != doctor.Critical {
			continue
		}
		reason := f.ID + ": " + f.Title
		hit := false
		for _, dev := range f.Devices {
			c, err := snapshot.CanonicalPCI(dev)
			if err != nil {
				continue
			}
			if i, ok := byPCI[c]; ok {
				n.Devices[i].Unhealthy = append(n.Devices[i].Unhealthy, reason)
				hit = true
			}
		}
		if !hit {
			n.Unhealthy = append(n.Unhealthy, reason)
		}
	}
}
