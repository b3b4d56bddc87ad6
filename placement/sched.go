package placement

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/sched"
	"kiln.dev/kiln/snapshot"
)

// SchedPlacer places leases with the sched engine: whole GPUs on the set
// with the best links (NVLink before a PCIe switch before the host bridge)
// that keeps well-connected sets whole, fractions packed onto GPUs already
// shared, MIG instances by profile, gangs across nodes. It is the server's
// default Placer.
//
// It keeps a sched.Cluster built from the nodes' Snapshots (rebuilt when a
// node joins or sends a new snapshot) and a sched.State in step with what
// the views show as held: each node's use (leases, drains, devices held by
// lost leases, reservations) is one allocation in the State, replaced when
// the node's view changes. Views are compared by identity first (the server
// keeps a node's view until the node changes), then by content, so a call
// with hypothetical views (the queue's estimates, preemption) costs only
// the nodes that differ.
type SchedPlacer struct {
	// Scheduler is the policy; nil: sched.Default(0).
	Scheduler *sched.Scheduler
	// KB names models and MIG geometries; nil: kb.Default().
	KB     *kb.KB
	Logger *slog.Logger

	mu      sync.Mutex
	nodes   map[string]*schedNode
	cluster *sched.Cluster
	state   *sched.State
	byIndex []*schedNode // by cluster index
	epoch   uint64
	// last are the views of the last call, lastNodes their nodes.
	last      []*NodeView
	lastNodes []*schedNode
	ff        FirstFit
}

// schedNode is one node as the placer knows it.
type schedNode struct {
	id    string
	snap  *snapshot.Snapshot
	node  *sched.Node // nil when the snapshot cannot be read by sched
	index int         // in the cluster; -1 when not in it
	// view is the view last synced into the state, held what the node's
	// allocation holds per device (nil: nothing).
	view      *NodeView
	held      []devHold
	committed bool // held is an allocation in the state
	// epoch is the call that last saw the node; nodes not in a call's
	// views are not ready and get nothing.
	epoch uint64
	// dev maps a sched device to the view's device, migs an existing MIG
	// instance (device, GI) to the view's device; profiles are the MIG
	// profiles of the view's instances as sched reads them (the snapshot
	// may name none).
	dev       []int
	migs      map[[2]int]int
	profiles  map[int]string
	instances [][]migUnit // per sched device
	// mapSnap and mapLen are what the maps were made for.
	mapSnap *snapshot.Snapshot
	mapLen  int
}

type devHold struct {
	milli int
	mem   uint64
	slots []sched.Slot
}

func (h devHold) zero() bool { return h.milli == 0 && h.mem == 0 && len(h.slots) == 0 }

func (h devHold) equal(o devHold) bool {
	if h.milli != o.milli || h.mem != o.mem || len(h.slots) != len(o.slots) {
		return false
	}
	for i := range h.slots {
		if h.slots[i] != o.slots[i] {
			return false
		}
	}
	return true
}

// heldID is the request id of a node's allocation in the state.
func heldID(node string) string { return "\x00held/" + node }

// Place implements Placer.
func (p *SchedPlacer) Place(req Request, views []*NodeView) (Placement, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.MIG != "" && !looksLikeMIGProfile(req.MIG) {
		// A MIG device by UUID: there is nothing to choose.
		return p.ff.Place(req, views)
	}
	if err := p.sync(views); err != nil {
		p.logger().Warn("sched placement unavailable, placing first-fit", "err", err)
		return p.ff.Place(req, views)
	}
	sc := p.scheduler(req, views)
	switch {
	case req.MIG != "":
		return p.placeMIG(sc, req, views)
	case req.MilliGPU > 0:
		return p.placeFraction(sc, req, views)
	case req.GPUs > 0:
		return p.placeWhole(sc, req)
	}
	return Placement{}, &NoFit{Reason: "the request asks for no GPU"}
}

func (p *SchedPlacer) logger() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

// looksLikeMIGProfile tells "3g.40gb" from a MIG device UUID.
func looksLikeMIGProfile(s string) bool {
	return !strings.HasPrefix(strings.ToUpper(s), "MIG-") && strings.Contains(s, "g.")
}

// sync brings the cluster and the state in step with views. Views come
// mostly as the server keeps them: the same nodes in the same order, most
// of them the very same values as last time; only the others are looked
// at.
func (p *SchedPlacer) sync(views []*NodeView) error {
	if p.nodes == nil {
		p.nodes = map[string]*schedNode{}
	}
	if p.cluster != nil && len(views) == len(p.last) {
		fast := true
		for i, v := range views {
			if v == p.last[i] {
				continue
			}
			if v.ID != p.last[i].ID || v.Snapshot != p.lastNodes[i].snap {
				fast = false
				break
			}
		}
		if fast {
			for i, v := range views {
				if v == p.last[i] {
					continue
				}
				sn := p.lastNodes[i]
				if sn.index >= 0 && sn.view != v {
					if err := p.hold(sn, v); err != nil {
						p.cluster, p.state, p.last = nil, nil, nil
						return err
					}
				}
				p.last[i] = v
			}
			return nil
		}
	}
	rebuild := p.cluster == nil
	for _, v := range views {
		sn := p.nodes[v.ID]
		if sn == nil || sn.snap != v.Snapshot {
			if sn == nil {
				sn = &schedNode{id: v.ID, index: -1}
				p.nodes[v.ID] = sn
			}
			sn.snap = v.Snapshot
			sn.node = nil
			if v.Snapshot != nil {
				n, err := sched.NodeFromSnapshotKB(v.Snapshot, nil, nil, p.kb())
				if err != nil {
					p.logger().Warn("node cannot be placed on by sched", "node", v.ID, "err", err)
				} else {
					n.Name = v.ID
					n.Unhealthy = nil // drains come through the views
					n.CPUMilli, n.MemoryBytes = 0, 0
					sn.node = n
				}
			}
			rebuild = true
		}
	}
	if rebuild {
		if err := p.rebuild(); err != nil {
			p.last = nil
			return err
		}
	}
	// A new set of nodes: mark the ones of this call (the others are not
	// ready) and sync them.
	p.epoch++
	p.last, p.lastNodes = p.last[:0], p.lastNodes[:0]
	for _, v := range views {
		sn := p.nodes[v.ID]
		sn.epoch = p.epoch
		if sn.index >= 0 && sn.view != v {
			if err := p.hold(sn, v); err != nil {
				// Start afresh next time rather than trust a state half
				// synced.
				p.cluster, p.state, p.last = nil, nil, nil
				return err
			}
		}
		p.last = append(p.last, v)
		p.lastNodes = append(p.lastNodes, sn)
	}
	return nil
}

func (p *SchedPlacer) kb() *kb.KB {
	if p.KB != nil {
		return p.KB
	}
	return kb.Default()
}

// rebuild makes a new cluster of every node sched can read and an empty
// state over it; the views are synced again.
func (p *SchedPlacer) rebuild() error {
	ids := make([]string, 0, len(p.nodes))
	for id, sn := range p.nodes {
		sn.index, sn.view, sn.held, sn.committed = -1, nil, nil, false
		sn.dev = nil
		if sn.node != nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	nodes := make([]*sched.Node, len(ids))
	p.byIndex = make([]*schedNode, len(ids))
	for i, id := range ids {
		sn := p.nodes[id]
		sn.index = i
		nodes[i] = sn.node
		p.byIndex[i] = sn
	}
	c, err := sched.NewCluster(nodes)
	if err != nil {
		for _, sn := range p.nodes {
			sn.index = -1
		}
		p.cluster, p.state, p.byIndex = nil, nil, nil
		return err
	}
	p.cluster, p.state = c, sched.NewState(c)
	return nil
}

// mapDevices works out which of the view's devices each sched device is
// (by PCI address, else by index), and which view device each existing
// MIG instance is. It depends only on the snapshot and the view's list of
// devices, so it is kept until either changes.
func (sn *schedNode) mapDevices(v *NodeView) {
	if sn.mapSnap == v.Snapshot && sn.mapLen == len(v.Devices) && sn.dev != nil {
		return
	}
	n := sn.node
	sn.mapSnap, sn.mapLen = v.Snapshot, len(v.Devices)
	sn.dev = make([]int, len(n.Devices))
	sn.migs = map[[2]int]int{}
	sn.profiles = map[int]string{}
	sn.instances = make([][]migUnit, len(n.Devices))
	byPCI := map[string]int{}
	byIndex := map[int]int{}
	for i := range v.Devices {
		d := &v.Devices[i]
		if d.Parent != "" {
			continue
		}
		if c, err := snapshot.CanonicalPCI(d.PCIAddress); err == nil && d.PCIAddress != "" {
			byPCI[c] = i
		}
		if _, ok := byIndex[d.Index]; !ok {
			byIndex[d.Index] = i
		}
	}
	order := snapIndexes(sn.snap)
	for k := range n.Devices {
		sd := &n.Devices[k]
		vi, ok := -1, false
		if sd.PCI != "" {
			vi, ok = byPCI[sd.PCI]
		}
		if !ok && k < len(order) {
			vi, ok = byIndex[order[k]]
		}
		if !ok {
			vi = -1
		}
		sn.dev[k] = vi
		if vi < 0 || !sd.MIGEnabled {
			continue
		}
		parent := v.Devices[vi].ID
		for i := range v.Devices {
			if v.Devices[i].Parent != parent {
				continue
			}
			gi, ok := migGI(v.Devices[i].ID)
			if !ok {
				continue
			}
			for _, mi := range sd.MIGInstances {
				if mi.GI == gi {
					sn.migs[[2]int{k, gi}] = i
					sn.profiles[i] = mi.Profile
					sn.instances[k] = append(sn.instances[k], migUnit{view: i,
						slot: sched.Slot{Profile: mi.Profile, Start: mi.Start, Size: mi.Size, Compute: mi.Compute, Existing: gi}})
				}
			}
		}
	}
}

// migUnit is an existing MIG instance: its place in the view and its slot.
type migUnit struct {
	view int
	slot sched.Slot
}

// hold makes the node's allocation in the state what view v shows as
// held.
func (p *SchedPlacer) hold(sn *schedNode, v *NodeView) error {
	n := sn.node
	sn.mapDevices(v)
	want := make([]devHold, len(n.Devices))
	for k := range n.Devices {
		sd := &n.Devices[k]
		vi := sn.dev[k]
		if vi < 0 {
			// The view does not show the GPU: keep it out of reach.
			if !sd.MIGEnabled {
				want[k] = devHold{milli: 1000, mem: sd.MemoryBytes}
			}
			continue
		}
		if sd.MIGEnabled {
			for _, in := range sn.instances[k] {
				if d := &v.Devices[in.view]; !d.Usable || !d.Whole {
					want[k].slots = append(want[k].slots, in.slot)
				}
			}
			continue
		}
		d := &v.Devices[vi]
		if !d.Usable {
			want[k] = devHold{milli: 1000, mem: sd.MemoryBytes}
			continue
		}
		h := devHold{milli: max(1000-d.FreeMilli, 0)}
		if d.MemoryBytes > d.FreeMemory {
			h.mem = min(d.MemoryBytes-d.FreeMemory, sd.MemoryBytes)
		}
		if !d.Whole && h.milli == 0 {
			h.milli = 1
		}
		if h.milli >= 1000 {
			h.milli, h.mem = 1000, sd.MemoryBytes
		}
		want[k] = h
	}
	same := sn.held != nil && len(sn.held) == len(want)
	for k := range want {
		if !same {
			break
		}
		same = sn.held[k].equal(want[k])
	}
	if same {
		sn.view = v
		return nil
	}
	id := heldID(sn.id)
	if sn.committed {
		if err := p.state.Release(id); err != nil {
			return err
		}
		sn.held, sn.committed = nil, false
	}
	a := sched.Allocation{RequestID: id, Node: sn.id, NodeIndex: sn.index}
	for k, h := range want {
		if h.zero() {
			continue
		}
		if len(h.slots) > 0 {
			for i := range h.slots {
				s := h.slots[i]
				a.Devices = append(a.Devices, sched.Share{Device: k, MIG: &s})
			}
			continue
		}
		a.Devices = append(a.Devices, sched.Share{Device: k, Milli: h.milli, MemoryBytes: h.mem})
	}
	if len(a.Devices) > 0 {
		if err := p.state.CommitOne(a); err != nil {
			return fmt.Errorf("node %s: %w", sn.id, err)
		}
		sn.committed = true
	}
	sn.held, sn.view = want, v
	return nil
}

// snapIndexes are the snapshot's GPU indexes in sched's device order.
func snapIndexes(s *snapshot.Snapshot) []int {
	if s == nil {
		return nil
	}
	idx := make([]int, len(s.GPUs))
	for i, g := range s.GPUs {
		idx[i] = g.Index
	}
	sort.SliceStable(idx, func(a, b int) bool { return idx[a] < idx[b] })
	return idx
}

// migGI reads the GPU instance of a MIG unit id ("gpu0/mig3.0").
func migGI(id string) (int, bool) {
	_, rest, ok := strings.Cut(id, "/mig")
	if !ok {
		return 0, false
	}
	gi, _, _ := strings.Cut(rest, ".")
	var n int
	if _, err := fmt.Sscanf(gi, "%d", &n); err != nil {
		return 0, false
	}
	return n, true
}

// scheduler is the policy for one call: the configured one, plus a filter
// that keeps to the nodes of this call (the ready ones) and to the nodes
// the request allows.
func (p *SchedPlacer) scheduler(req Request, views []*NodeView) *sched.Scheduler {
	base := p.Scheduler
	if base == nil {
		base = sched.Default(0)
		p.Scheduler = base
	}
	sc := *base
	f := &nodeFilter{p: p, epoch: p.epoch}
	if len(req.Constraints.Nodes) > 0 {
		f.allow = map[string]bool{}
		for _, n := range req.Constraints.Nodes {
			f.allow[n] = true
		}
	}
	sc.NodeFilters = append(append([]sched.NodeFilter(nil), base.NodeFilters...), f)
	return &sc
}

// nodeFilter keeps placement to the nodes in the call's views and to the
// nodes the request allows.
type nodeFilter struct {
	p     *SchedPlacer
	epoch uint64
	allow map[string]bool
}

func (f *nodeFilter) Name() string { return "nodes" }

func (f *nodeFilter) FilterNode(_ *sched.Request, ni *sched.NodeInfo) string {
	sn := f.p.byIndex[ni.Index]
	if sn.epoch != f.epoch {
		return "are not ready"
	}
	if f.allow != nil && !f.allow[sn.id] {
		return "are not among the nodes allowed"
	}
	return ""
}

// request turns a lease request into a sched request.
func schedRequest(req Request, id string) sched.Request {
	c := req.Constraints
	r := sched.Request{ID: id, GPUs: req.GPUs, GPUMilli: req.MilliGPU, MIGProfile: req.MIG, Constraints: constraintsOf(c),
		Locality: sched.Locality{SameNVLinkIsland: c.SameNVLinkIsland, SameNUMA: c.SameNUMA}}
	if req.MilliGPU > 0 {
		r.GPUs, r.MIGProfile, r.GPUMemoryBytes = 0, "", req.MemoryBytes
	}
	return r
}

func (p *SchedPlacer) placeWhole(sc *sched.Scheduler, req Request) (Placement, error) {
	if !req.Constraints.Gang && req.GPUs > sched.MaxDevices {
		return Placement{}, &NoFit{Reason: fmt.Sprintf("%d GPUs on one node: no node holds more than %d; a gang (kiln lease --gang, constraints.gang) spreads whole GPUs over nodes",
			req.GPUs, sched.MaxDevices)}
	}
	a, err := sc.Place(p.state, schedRequest(req, "lease"))
	if err == nil {
		return p.placement([]sched.Allocation{a}), nil
	}
	if !req.Constraints.Gang || req.GPUs < 2 {
		return Placement{}, noFit(req, err)
	}
	// A gang: the GPUs may come from several nodes, each part as large as
	// a node can hold, all placed together or not at all.
	var parts []int
	left := req.GPUs
	var plan sched.Plan
	for left > 0 {
		placed := false
		var last error
		for k := min(left, sched.MaxDevices); k >= 1; k-- {
			g := sched.Gang{ID: "gang"}
			for i, n := range append(append([]int(nil), parts...), k) {
				r := schedRequest(req, fmt.Sprintf("gang/%d", i))
				r.GPUs = n
				g.Members = append(g.Members, r)
			}
			pl, err := sc.PlaceGang(p.state, g)
			if err == nil {
				parts, plan, left, placed = append(parts, k), pl, left-k, true
				break
			}
			last = err
		}
		if !placed {
			return Placement{}, &NoFit{Reason: fmt.Sprintf("no set of nodes has %d free GPUs%s: the gang found room for %d on %d node(s) and no node for 1 more (%v)",
				req.GPUs, describe(req.Constraints), req.GPUs-left, len(parts), last)}
		}
	}
	return p.placement(plan.Allocations), nil
}

func (p *SchedPlacer) placeFraction(sc *sched.Scheduler, req Request, views []*NodeView) (Placement, error) {
	// A free MIG instance isolates in hardware: it goes first, as
	// FirstFit chooses it; so does a GPU with stronger isolation than the
	// one sched picks.
	ff, ffErr := p.ff.Place(req, views)
	a, err := sc.Place(p.state, schedRequest(req, "lease"))
	if err != nil {
		if ffErr == nil {
			return ff, nil
		}
		return Placement{}, noFit(req, err)
	}
	pl := p.placement([]sched.Allocation{a})
	g := &pl.Allocations[0].Devices[0]
	d := p.viewDevice(a.NodeIndex, a.Devices[0].Device)
	if d == nil {
		return ff, ffErr
	}
	g.MemoryBytes = fractionMemory(req, d)
	g.Isolation = d.Isolation
	if g.MemoryBytes == 0 || g.MemoryBytes > d.FreeMemory {
		return ff, ffErr
	}
	if ffErr == nil && isolationRank(ff.Allocations[0].Devices[0].Isolation) < isolationRank(g.Isolation) {
		return ff, nil
	}
	return pl, nil
}

func isolationRank(iso string) int {
	switch iso {
	case api.IsolationExclusive:
		return 0
	case api.IsolationMIG:
		return 1
	case api.IsolationMPS:
		return 2
	}
	return 3
}

func (p *SchedPlacer) placeMIG(sc *sched.Scheduler, req Request, views []*NodeView) (Placement, error) {
	// Only existing instances are leased: keep to the nodes that have a
	// free one of the profile, where sched claims one before it would
	// make a new one.
	f := sc.NodeFilters[len(sc.NodeFilters)-1].(*nodeFilter)
	allow := map[string]bool{}
	for _, v := range views {
		sn := p.nodes[v.ID]
		if (f.allow != nil && !f.allow[v.ID]) || sn == nil || sn.index < 0 {
			continue
		}
		for i := range v.Devices {
			d := &v.Devices[i]
			if d.Parent != "" && d.Usable && d.Whole && (strings.EqualFold(d.MIGProfile, req.MIG) || strings.EqualFold(sn.profiles[i], req.MIG)) {
				allow[v.ID] = true
			}
		}
	}
	f.allow = allow
	a, err := sc.Place(p.state, schedRequest(req, "lease"))
	if err != nil || len(a.Devices) != 1 || a.Devices[0].MIG == nil || a.Devices[0].MIG.Existing < 0 {
		return p.ff.Place(req, views)
	}
	pl := p.placement([]sched.Allocation{a})
	if len(pl.Allocations) == 0 || len(pl.Allocations[0].Devices) == 0 {
		return p.ff.Place(req, views)
	}
	return pl, nil
}

// viewDevice is the view's device for a sched device of a node.
func (p *SchedPlacer) viewDevice(index, dev int) *DeviceView {
	sn := p.byIndex[index]
	if dev < 0 || dev >= len(sn.dev) || sn.dev[dev] < 0 {
		return nil
	}
	return &sn.view.Devices[sn.dev[dev]]
}

// placement turns sched allocations into the server's, one per node.
func (p *SchedPlacer) placement(as []sched.Allocation) Placement {
	var pl Placement
	at := map[string]int{}
	for _, a := range as {
		sn := p.byIndex[a.NodeIndex]
		i, ok := at[sn.id]
		if !ok {
			i = len(pl.Allocations)
			at[sn.id] = i
			pl.Allocations = append(pl.Allocations, api.Allocation{Node: sn.id})
		}
		for _, sh := range a.Devices {
			if sh.MIG != nil {
				vi, ok := sn.migs[[2]int{sh.Device, sh.MIG.Existing}]
				if !ok {
					continue
				}
				d := &sn.view.Devices[vi]
				milli := MIGMilli(d.MIGProfile)
				if geo := sn.node.Devices[sh.Device].MIG; geo != nil && geo.ComputeSlices > 0 {
					milli = sh.MIG.Compute * 1000 / geo.ComputeSlices
				}
				pl.Allocations[i].Devices = append(pl.Allocations[i].Devices, grant(d, milli, d.MemoryBytes, api.IsolationMIG))
				continue
			}
			d := p.viewDevice(a.NodeIndex, sh.Device)
			if d == nil {
				continue
			}
			iso := api.IsolationExclusive
			mem := d.MemoryBytes
			if sh.Milli < 1000 {
				iso, mem = d.Isolation, sh.MemoryBytes
			}
			pl.Allocations[i].Devices = append(pl.Allocations[i].Devices, grant(d, sh.Milli, mem, iso))
		}
	}
	return pl
}

// noFit words sched's refusal for the queue.
func noFit(req Request, err error) error {
	var ue *sched.UnschedulableError
	if errors.As(err, &ue) {
		what := fmt.Sprintf("%d free GPUs", req.GPUs)
		switch {
		case req.MilliGPU > 0:
			what = fmt.Sprintf("a GPU with %d‰ of its compute and %s of memory free", req.MilliGPU, bytesText(req.MemoryBytes))
		case req.MIG != "":
			what = "a free MIG instance " + req.MIG
		}
		return noNodeHas(what+describe(req.Constraints), ue.Summary())
	}
	return &NoFit{Reason: err.Error()}
}
