package placement

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/units"
)

// Placer chooses devices for a lease. The server keeps the queue, the
// fairness and the bookkeeping; a Placer only answers "where, now".
// SchedPlacer (the sched package's engine) is the default; FirstFit is the
// simple one.
type Placer interface {
	// Place picks devices for req among the free capacity the views show,
	// or returns an error that says why nothing fits. It must not keep or
	// change the views.
	Place(req Request, nodes []*NodeView) (Placement, error)
}

// Request is what placement needs to know of a lease.
type Request struct {
	// GPUs whole GPUs, or one fraction of MilliGPU thousandths with
	// MemoryBytes of memory, or one MIG instance (profile or UUID).
	GPUs        int
	MilliGPU    int
	MemoryBytes uint64
	MIG         string
	Constraints api.Constraints
}

// NodeView is a node's free capacity as placement sees it.
type NodeView struct {
	ID string
	// Snapshot is the node's last snapshot; placers may keep what they
	// derive from it until the pointer changes. It must not be changed.
	Snapshot *snapshot.Snapshot
	// Driver is the NVIDIA driver version, CUDA the highest CUDA version it
	// supports; AMDGPU the amdgpu driver version.
	Driver  string
	CUDA    string
	AMDGPU  string
	Devices []DeviceView
	// FreeWhole counts devices free for a whole-GPU lease.
	FreeWhole int
}

// NewNodeView starts the view of a node from its snapshot (its drivers)
// with room for n devices, which the caller fills.
func NewNodeView(id string, snap *snapshot.Snapshot, n int) *NodeView {
	v := &NodeView{ID: id, Snapshot: snap, Devices: make([]DeviceView, 0, n)}
	if snap != nil {
		v.Driver = snap.Drivers.NVIDIAUser
		if v.Driver == "" {
			v.Driver = snap.Drivers.NVIDIAKernel
		}
		v.CUDA = snap.Drivers.CUDADriver
		v.AMDGPU = snap.Drivers.AMDGPU
	}
	return v
}

// DeviceView is a device with what is left of it. Device points at the
// server's own record of the device (a view is made on every change, and
// copying each device made it the largest allocation per lease): placers
// read it and never write it.
type DeviceView struct {
	*api.Device
	// Usable is false for a drained device, one held by a lost lease, one
	// reserved for another lease, or a GPU in MIG mode (its instances are
	// leased instead).
	Usable     bool
	FreeMilli  int
	FreeMemory uint64
	// Whole is true when no lease holds any part of the device.
	Whole bool
}

// Placement is the devices chosen, per node.
type Placement struct {
	Allocations []api.Allocation
}

// NoFit is the error a Placer returns when nothing fits now.
type NoFit struct {
	// Reason is the whole refusal: "no node has 2 free GPUs (model A100):
	// 0/3 nodes are available: 3 have no GPU of model A100".
	Reason string
	// Wanted is what no node has, with the constraints ("2 free GPUs
	// (model A100)"), and Why the nodes counted per reason, when known;
	// both empty for a refusal of another form.
	Wanted, Why string
}

// noNodeHas is the refusal "no node has <wanted>[: <why>]".
func noNodeHas(wanted, why string) *NoFit {
	r := "no node has " + wanted
	if why != "" {
		r += ": " + why
	}
	return &NoFit{Reason: r, Wanted: wanted, Why: why}
}

func (e *NoFit) Error() string { return e.Reason }

// FirstFit places on the first node (in the order given) that fits, taking
// the lowest-numbered devices; fractions go preferably where the isolation
// is strongest (MIG, then MPS, then time-slicing) and onto GPUs already
// shared, to keep whole GPUs free.
type FirstFit struct{}

// Place implements Placer.
func (FirstFit) Place(req Request, nodes []*NodeView) (Placement, error) {
	switch {
	case req.MIG != "":
		return placeMIG(req, nodes)
	case req.MilliGPU > 0:
		return placeFraction(req, nodes)
	case req.GPUs > 0:
		return placeWhole(req, nodes)
	}
	return Placement{}, &NoFit{Reason: "the request asks for no GPU"}
}

// matcher judges devices against one request's constraints with
// sched.MatchDevice, the predicate every policy shares.
type matcher struct {
	c     sched.Constraints
	nodes []string
}

func newMatcher(c api.Constraints) *matcher {
	return &matcher{c: constraintsOf(c), nodes: c.Nodes}
}

// constraintsOf is what api's constraints mean to sched (node and
// locality constraints aside).
func constraintsOf(c api.Constraints) sched.Constraints {
	sc := sched.Constraints{Vendor: c.Vendor, Architecture: c.Architecture, MinMemoryBytes: c.MinMemoryBytes,
		MinComputeCapability: c.MinComputeCapability, MinDriver: c.MinDriver, MinCUDA: c.MinCUDA}
	if c.Model != "" {
		sc.Models = []string{c.Model}
	}
	return sc
}

// eligible reports whether a device matches the constraints, whatever its use.
func (m *matcher) eligible(n *NodeView, d *DeviceView) bool {
	if len(m.nodes) > 0 && !slices.Contains(m.nodes, n.ID) {
		return false
	}
	sn := sched.Node{Driver: n.Driver, CUDA: n.CUDA, AMDGPU: n.AMDGPU}
	sd := sched.Device{Vendor: d.Vendor, Model: d.Model, Architecture: d.Architecture, MemoryBytes: d.MemoryBytes,
		ComputeCapability: d.ComputeCapability}
	return sched.MatchDevice(&m.c, &sn, &sd) == ""
}

func grant(d *DeviceView, milli int, mem uint64, iso string) api.DeviceGrant {
	return api.DeviceGrant{ID: d.ID, Vendor: d.Vendor, Index: d.Index, PCIAddress: d.PCIAddress, UUID: d.UUID,
		Model: d.Model, MilliGPU: milli, MemoryBytes: mem, Isolation: iso}
}

func placeWhole(req Request, nodes []*NodeView) (Placement, error) {
	c := req.Constraints
	m := newMatcher(c)
	for _, n := range nodes {
		if n.FreeWhole < req.GPUs {
			continue
		}
		groups := map[string][]*DeviceView{}
		var keys []string
		for i := range n.Devices {
			d := &n.Devices[i]
			if !d.Usable || !d.Whole || d.MIGMode || d.Parent != "" || !m.eligible(n, d) {
				continue
			}
			key := ""
			if c.SameNVLinkIsland {
				key = d.Island
				if key == "" {
					key = "alone:" + d.ID // a GPU with no NVLink is an island of one
				}
			}
			if c.SameNUMA {
				if d.NUMANode == nil || *d.NUMANode < 0 {
					if req.GPUs > 1 {
						continue // unknown NUMA cannot be shown to be the same
					}
					key += "|numa?"
				} else {
					key += "|numa" + strconv.Itoa(*d.NUMANode)
				}
			}
			if _, ok := groups[key]; !ok {
				keys = append(keys, key)
			}
			groups[key] = append(groups[key], d)
		}
		for _, k := range keys {
			if g := groups[k]; len(g) >= req.GPUs {
				a := api.Allocation{Node: n.ID}
				for _, d := range g[:req.GPUs] {
					a.Devices = append(a.Devices, grant(d, 1000, d.MemoryBytes, api.IsolationExclusive))
				}
				return Placement{Allocations: []api.Allocation{a}}, nil
			}
		}
	}
	if c.Gang {
		var p Placement
		left := req.GPUs
		for _, n := range nodes {
			a := api.Allocation{Node: n.ID}
			for i := range n.Devices {
				d := &n.Devices[i]
				if left == 0 {
					break
				}
				if d.Usable && d.Whole && !d.MIGMode && d.Parent == "" && m.eligible(n, d) {
					a.Devices = append(a.Devices, grant(d, 1000, d.MemoryBytes, api.IsolationExclusive))
					left--
				}
			}
			if len(a.Devices) > 0 {
				p.Allocations = append(p.Allocations, a)
			}
			if left == 0 {
				return p, nil
			}
		}
	}
	return Placement{}, noNodeHas(fmt.Sprintf("%d free GPUs%s", req.GPUs, describe(c)), "")
}

func placeFraction(req Request, nodes []*NodeView) (Placement, error) {
	c := req.Constraints
	m := newMatcher(c)
	type cand struct {
		n    *NodeView
		d    *DeviceView
		rank int
	}
	var best *cand
	for _, n := range nodes {
		for i := range n.Devices {
			d := &n.Devices[i]
			if !d.Usable || d.MIGMode || !m.eligible(n, d) {
				continue
			}
			var rank int
			switch {
			case d.Parent != "": // a MIG instance: hardware isolation
				// A fraction that names no memory gets the instance's.
				if !d.Whole || d.MemoryBytes < req.MemoryBytes || MIGMilli(d.MIGProfile) < req.MilliGPU {
					continue
				}
				rank = 0
			default:
				mem := fractionMemory(req, d)
				if d.FreeMilli < req.MilliGPU || mem == 0 || d.FreeMemory < mem {
					continue
				}
				rank = 2
				if d.Isolation == api.IsolationTimeSlicing {
					rank = 4
				}
				if d.Whole {
					rank++ // keep whole GPUs whole when a shared one fits
				}
			}
			if best == nil || rank < best.rank {
				best = &cand{n, d, rank}
			}
		}
		if best != nil && best.rank == 0 {
			break
		}
	}
	if best == nil {
		return Placement{}, &NoFit{Reason: fmt.Sprintf("no GPU has %d‰ of its compute and %s of memory free%s", req.MilliGPU, bytesText(req.MemoryBytes), describe(c))}
	}
	d := best.d
	g := grant(d, req.MilliGPU, fractionMemory(req, d), d.Isolation)
	if d.Parent != "" {
		g = grant(d, MIGMilli(d.MIGProfile), d.MemoryBytes, api.IsolationMIG)
	}
	return Placement{Allocations: []api.Allocation{{Node: best.n.ID, Devices: []api.DeviceGrant{g}}}}, nil
}

// fractionMemory is the memory a fraction gets: what it asked for, else its
// compute share of the GPU's memory (0 when the memory is unknown).
func fractionMemory(req Request, d *DeviceView) uint64 {
	if req.MemoryBytes > 0 {
		return req.MemoryBytes
	}
	return d.MemoryBytes / 1000 * uint64(req.MilliGPU)
}

func placeMIG(req Request, nodes []*NodeView) (Placement, error) {
	m := newMatcher(req.Constraints)
	for _, n := range nodes {
		for i := range n.Devices {
			d := &n.Devices[i]
			if d.Parent == "" || !d.Usable || !d.Whole || !m.eligible(n, d) {
				continue
			}
			if d.MIGProfile == req.MIG || (d.UUID != "" && d.UUID == req.MIG) {
				g := grant(d, MIGMilli(d.MIGProfile), d.MemoryBytes, api.IsolationMIG)
				return Placement{Allocations: []api.Allocation{{Node: n.ID, Devices: []api.DeviceGrant{g}}}}, nil
			}
		}
	}
	return Placement{}, &NoFit{Reason: fmt.Sprintf("no free MIG instance %s%s", req.MIG, describe(req.Constraints))}
}

// MIGMilli is a MIG profile's compute share: "3g.40gb" is 3 of 7 slices.
func MIGMilli(profile string) int {
	i := strings.IndexByte(profile, 'g')
	if i <= 0 {
		return 1000 / 7
	}
	n, err := strconv.Atoi(profile[:i])
	if err != nil || n <= 0 || n > 7 {
		return 1000 / 7
	}
	return n * 1000 / 7
}

func describe(c api.Constraints) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+" "+v)
		}
	}
	add("vendor", c.Vendor)
	add("model", c.Model)
	add("architecture", c.Architecture)
	if c.MinMemoryBytes > 0 {
		add("memory >=", bytesText(c.MinMemoryBytes))
	}
	add("compute capability >=", c.MinComputeCapability)
	add("driver >=", c.MinDriver)
	add("CUDA >=", c.MinCUDA)
	if c.SameNVLinkIsland {
		parts = append(parts, "in one NVLink island")
	}
	if c.SameNUMA {
		parts = append(parts, "on one NUMA node")
	}
	if c.Gang {
		parts = append(parts, "as a gang across nodes")
	}
	if len(c.Nodes) > 0 {
		sort.Strings(c.Nodes)
		add("on", strings.Join(c.Nodes, ","))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// bytesText is a memory size in a refusal; 0 is the share a fraction gets
// when it names none.
func bytesText(b uint64) string {
	if b == 0 {
		return "a share"
	}
	return units.Bytes(b)
}

// Offer is every other device of node n that a whole-GPU lease of req
// could be given now beside the devices it holds (taken): free whole GPUs
// that meet its constraints, by the predicate every policy shares. A
// lease whose devices the cluster's scheduler picks is offered them too
// (api.PlacementScheduler).
func Offer(req Request, n *NodeView, taken []api.DeviceGrant) []api.DeviceGrant {
	m := newMatcher(req.Constraints)
	var out []api.DeviceGrant
	for i := range n.Devices {
		d := &n.Devices[i]
		if !d.Usable || !d.Whole || d.MIGMode || d.Parent != "" || !m.eligible(n, d) {
			continue
		}
		if slices.ContainsFunc(taken, func(g api.DeviceGrant) bool { return g.ID == d.ID }) {
			continue
		}
		out = append(out, grant(d, 1000, d.MemoryBytes, api.IsolationExclusive))
	}
	return out
}
