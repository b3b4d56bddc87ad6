package sched

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// partialBuckets is how many buckets index the largest free share of a
// partly used GPU (50 milli each).
const partialBuckets = 20

// State is the allocation state of a cluster: what every device, node CPU
// and memory holds, and an index of nodes by free capacity. Place reads it;
// only Commit and Release change it.
type State struct {
	c      *Cluster
	use    []nodeUsage
	sum    []summary
	idx    []groupIndex
	allocs map[string]Allocation
}

type nodeUsage struct {
	cpu  int64
	mem  uint64
	devs []devUsage
}

type devUsage struct {
	milli int
	mem   uint64
	mig   []Slot
}

func (u *nodeUsage) clone() *nodeUsage {
	out := &nodeUsage{cpu: u.cpu, mem: u.mem, devs: slices.Clone(u.devs)}
	for i := range out.devs {
		if out.devs[i].mig != nil {
			out.devs[i].mig = slices.Clone(out.devs[i].mig)
		}
	}
	return out
}

// summary is what the index knows of a node.
type summary struct {
	whole   int // free whole GPUs
	partial int // bucket of the largest free share of a partly used GPU; -1 none
	live    bool
}

type groupIndex struct {
	whole   []bitset // by free whole GPUs
	partial [partialBuckets]bitset
	live    bitset // schedulable nodes
}

// NewState returns an empty state over a cluster.
func NewState(c *Cluster) *State {
	st := &State{c: c, use: make([]nodeUsage, len(c.nodes)), sum: make([]summary, len(c.nodes)),
		idx: make([]groupIndex, len(c.groups)), allocs: map[string]Allocation{}}
	for gi, g := range c.groups {
		ix := &st.idx[gi]
		ix.whole = make([]bitset, g.ndev+1)
		for k := range ix.whole {
			ix.whole[k] = newBitset(len(g.nodes))
		}
		for k := range ix.partial {
			ix.partial[k] = newBitset(len(g.nodes))
		}
		ix.live = newBitset(len(g.nodes))
	}
	for i, n := range c.nodes {
		st.use[i].devs = make([]devUsage, len(n.Devices))
		st.sum[i] = summary{partial: -1}
		st.reindex(i)
	}
	return st
}

// Cluster returns the cluster the state is over.
func (st *State) Cluster() *Cluster { return st.c }

// Clone returns an independent copy of the state.
func (st *State) Clone() *State {
	out := &State{c: st.c, use: make([]nodeUsage, len(st.use)), sum: slices.Clone(st.sum),
		idx: make([]groupIndex, len(st.idx)), allocs: make(map[string]Allocation, len(st.allocs))}
	for i := range st.use {
		out.use[i] = *st.use[i].clone()
	}
	for i, ix := range st.idx {
		o := groupIndex{live: ix.live.clone()}
		for _, b := range ix.whole {
			o.whole = append(o.whole, b.clone())
		}
		for k := range ix.partial {
			o.partial[k] = ix.partial[k].clone()
		}
		out.idx[i] = o
	}
	for k, v := range st.allocs {
		out.allocs[k] = v
	}
	return out
}

// Allocation returns the allocation of a request.
func (st *State) Allocation(id string) (Allocation, bool) {
	a, ok := st.allocs[id]
	return a, ok
}

// Allocations returns every allocation, ordered by request id.
func (st *State) Allocations() []Allocation {
	out := make([]Allocation, 0, len(st.allocs))
	for _, a := range st.allocs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Allocation) int { return strings.Compare(a.RequestID, b.RequestID) })
	return out
}

// Len is the number of allocations.
func (st *State) Len() int { return len(st.allocs) }

// Node returns a read-only view of node i's usage.
func (st *State) Node(i int) *NodeInfo {
	return &NodeInfo{Index: i, Node: st.c.nodes[i], Topo: st.c.topos[i], u: &st.use[i]}
}

// summarize computes the index entry of node i from usage u.
func (st *State) summarize(i int, u *nodeUsage) summary {
	n := st.c.nodes[i]
	s := summary{partial: -1, live: len(n.Unhealthy) == 0}
	if !s.live {
		return s
	}
	best := 0
	for k := range n.Devices {
		d := &n.Devices[k]
		if !d.Healthy() || d.MIGEnabled {
			continue
		}
		du := &u.devs[k]
		switch {
		case du.milli == 0 && du.mem == 0:
			s.whole++
		case du.milli < 1000:
			best = max(best, 1000-du.milli)
		}
	}
	if best > 0 {
		s.partial = min(best*partialBuckets/1000, partialBuckets-1)
	}
	return s
}

// reindex moves node i to the buckets its usage puts it in.
func (st *State) reindex(i int) {
	g, p := st.c.nodeGroup[i], st.c.nodePos[i]
	ix := &st.idx[g]
	old := st.sum[i]
	ix.whole[old.whole].clear(p)
	if old.partial >= 0 {
		ix.partial[old.partial].clear(p)
	}
	ix.live.clear(p)
	s := st.summarize(i, &st.use[i])
	st.sum[i] = s
	if !s.live {
		return
	}
	ix.live.set(p)
	ix.whole[s.whole].set(p)
	if s.partial >= 0 {
		ix.partial[s.partial].set(p)
	}
}

// apply adds allocation a to usage u of node n after checking every share;
// on error u is left partly changed (callers work on a clone).
func apply(n *Node, u *nodeUsage, a *Allocation) error {
	if len(n.Unhealthy) > 0 {
		return fmt.Errorf("node %s is unhealthy: %s", n.Name, n.Unhealthy[0])
	}
	if a.CPUMilli < 0 {
		return fmt.Errorf("negative CPU")
	}
	if n.CPUMilli > 0 && a.CPUMilli > n.CPUMilli-u.cpu {
		return fmt.Errorf("node %s: %d milli-CPU asked, %d free", n.Name, a.CPUMilli, n.CPUMilli-u.cpu)
	}
	if n.MemoryBytes > 0 && a.MemoryBytes > n.MemoryBytes-u.mem {
		return fmt.Errorf("node %s: %d bytes of memory asked, %d free", n.Name, a.MemoryBytes, n.MemoryBytes-u.mem)
	}
	u.cpu += a.CPUMilli
	u.mem += a.MemoryBytes
	for _, sh := range a.Devices {
		if sh.Device < 0 || sh.Device >= len(n.Devices) {
			return fmt.Errorf("node %s has no GPU %d", n.Name, sh.Device)
		}
		d := &n.Devices[sh.Device]
		du := &u.devs[sh.Device]
		if !d.Healthy() {
			return fmt.Errorf("node %s GPU %d is unhealthy: %s", n.Name, sh.Device, d.Unhealthy[0])
		}
		if sh.MIG != nil {
			if sh.Milli != 0 || sh.MemoryBytes != 0 {
				return fmt.Errorf("node %s GPU %d: a MIG share holds no milli or memory of its own", n.Name, sh.Device)
			}
			if err := checkSlot(d, du.mig, *sh.MIG); err != nil {
				return fmt.Errorf("node %s GPU %d: %w", n.Name, sh.Device, err)
			}
			du.mig = append(du.mig, *sh.MIG)
			continue
		}
		if d.MIGEnabled {
			return fmt.Errorf("node %s GPU %d is in MIG mode; only MIG instances are handed out", n.Name, sh.Device)
		}
		if sh.Milli <= 0 || sh.Milli > 1000 {
			return fmt.Errorf("node %s GPU %d: share of %d milli is out of range", n.Name, sh.Device, sh.Milli)
		}
		if du.milli+sh.Milli > 1000 {
			return fmt.Errorf("node %s GPU %d: %d milli asked, %d free", n.Name, sh.Device, sh.Milli, 1000-du.milli)
		}
		if sh.MemoryBytes > 0 && (du.mem > d.MemoryBytes || sh.MemoryBytes > d.MemoryBytes-du.mem) {
			return fmt.Errorf("node %s GPU %d: %d bytes of GPU memory asked, %d free", n.Name, sh.Device, sh.MemoryBytes, d.MemoryBytes-min(du.mem, d.MemoryBytes))
		}
		if sh.Milli == 1000 && (du.milli != 0 || du.mem != 0) {
			return fmt.Errorf("node %s GPU %d is shared; a whole GPU is asked", n.Name, sh.Device)
		}
		du.milli += sh.Milli
		du.mem += sh.MemoryBytes
	}
	return nil
}

// Commit applies a plan: every allocation is checked against the current
// state and either all are applied or none.
func (st *State) Commit(p Plan) error {
	touched := map[int]*nodeUsage{}
	ids := map[string]bool{}
	for k := range p.Allocations {
		a := &p.Allocations[k]
		if a.RequestID == "" {
			return errors.New("sched: commit: an allocation has no request id")
		}
		if _, dup := st.allocs[a.RequestID]; dup || ids[a.RequestID] {
			return fmt.Errorf("sched: commit: request %s is already placed", a.RequestID)
		}
		ids[a.RequestID] = true
		if a.NodeIndex < 0 || a.NodeIndex >= len(st.c.nodes) || st.c.nodes[a.NodeIndex].Name != a.Node {
			return fmt.Errorf("sched: commit: request %s: no node %q at index %d", a.RequestID, a.Node, a.NodeIndex)
		}
		u, ok := touched[a.NodeIndex]
		if !ok {
			u = st.use[a.NodeIndex].clone()
			touched[a.NodeIndex] = u
		}
		if err := apply(st.c.nodes[a.NodeIndex], u, a); err != nil {
			return fmt.Errorf("sched: commit: request %s: %w", a.RequestID, err)
		}
	}
	for i, u := range touched {
		st.use[i] = *u
		st.reindex(i)
	}
	for _, a := range p.Allocations {
		st.allocs[a.RequestID] = a
	}
	return nil
}

// CommitOne commits a single allocation.
func (st *State) CommitOne(a Allocation) error {
	return st.Commit(Plan{Allocations: []Allocation{a}})
}

// Release frees the allocation of a request.
func (st *State) Release(id string) error {
	a, ok := st.allocs[id]
	if !ok {
		return fmt.Errorf("sched: release: request %s holds nothing", id)
	}
	u := &st.use[a.NodeIndex]
	u.cpu -= a.CPUMilli
	u.mem -= a.MemoryBytes
	for _, sh := range a.Devices {
		du := &u.devs[sh.Device]
		if sh.MIG != nil {
			if k := slices.Index(du.mig, *sh.MIG); k >= 0 {
				du.mig = slices.Delete(du.mig, k, k+1)
			}
			continue
		}
		du.milli -= sh.Milli
		du.mem -= sh.MemoryBytes
	}
	delete(st.allocs, id)
	st.reindex(a.NodeIndex)
	return nil
}

// Verify rebuilds the usage from the allocations and checks it against the
// state and against every capacity: no device over 1000 milli or over its
// memory, MIG slots legal and apart, CPU and memory within the node, the
// index in step with the usage. It is meant for tests and audits.
func (st *State) Verify() error {
	fresh := make([]nodeUsage, len(st.c.nodes))
	for i, n := range st.c.nodes {
		fresh[i].devs = make([]devUsage, len(n.Devices))
	}
	var errs []error
	for _, a := range st.Allocations() {
		if a.NodeIndex < 0 || a.NodeIndex >= len(fresh) {
			errs = append(errs, fmt.Errorf("request %s: node index %d", a.RequestID, a.NodeIndex))
			continue
		}
		if err := apply(st.c.nodes[a.NodeIndex], &fresh[a.NodeIndex], &a); err != nil {
			errs = append(errs, fmt.Errorf("request %s: %w", a.RequestID, err))
		}
	}
	for i := range fresh {
		got, want := &st.use[i], &fresh[i]
		if got.cpu != want.cpu || got.mem != want.mem {
			errs = append(errs, fmt.Errorf("node %d: CPU/memory used %d/%d, allocations say %d/%d", i, got.cpu, got.mem, want.cpu, want.mem))
		}
		for k := range want.devs {
			g, w := got.devs[k], want.devs[k]
			if g.milli != w.milli || g.mem != w.mem || len(g.mig) != len(w.mig) {
				errs = append(errs, fmt.Errorf("node %d GPU %d: usage %d milli %d bytes %d MIG, allocations say %d/%d/%d", i, k, g.milli, g.mem, len(g.mig), w.milli, w.mem, len(w.mig)))
			}
		}
		if s := st.summarize(i, &st.use[i]); s != st.sum[i] {
			errs = append(errs, fmt.Errorf("node %d: index says %+v, usage says %+v", i, st.sum[i], s))
		}
		g, p := st.c.nodeGroup[i], st.c.nodePos[i]
		ix := &st.idx[g]
		for k, b := range ix.whole {
			if b.has(p) != (st.sum[i].live && k == st.sum[i].whole) {
				errs = append(errs, fmt.Errorf("node %d: whole-GPU bucket %d out of step", i, k))
			}
		}
	}
	return errors.Join(errs...)
}

// NodeInfo is a read-only view of one node and its usage, given to
// filters, pickers and scores.
type NodeInfo struct {
	Index int
	Node  *Node
	Topo  *Topology
	u     *nodeUsage
}

// UsedCPUMilli and UsedMemoryBytes are the host resources held.
func (ni *NodeInfo) UsedCPUMilli() int64     { return ni.u.cpu }
func (ni *NodeInfo) UsedMemoryBytes() uint64 { return ni.u.mem }

// DeviceUse returns the milli-GPU and memory held on device d and its MIG
// slots held by allocations.
func (ni *NodeInfo) DeviceUse(d int) (milli int, mem uint64, slots []Slot) {
	du := &ni.u.devs[d]
	return du.milli, du.mem, du.mig
}

// FreeWhole is the mask of healthy, non-MIG devices nothing holds.
func (ni *NodeInfo) FreeWhole() uint64 {
	var m uint64
	for k := range ni.Node.Devices {
		d := &ni.Node.Devices[k]
		if d.Healthy() && !d.MIGEnabled && ni.u.devs[k].milli == 0 && ni.u.devs[k].mem == 0 {
			m |= 1 << k
		}
	}
	return m
}

// GPUMilli returns the milli-GPU held and the capacity of the healthy,
// non-MIG devices.
func (ni *NodeInfo) GPUMilli() (used, capacity int) {
	for k := range ni.Node.Devices {
		d := &ni.Node.Devices[k]
		if d.Healthy() && !d.MIGEnabled {
			used += ni.u.devs[k].milli
			capacity += 1000
		}
	}
	return used, capacity
}

// count is the number of devices in a mask.
func count(m uint64) int { return bits.OnesCount64(m) }
