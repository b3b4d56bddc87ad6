package sched

import (
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
)

// Plugin is anything the scheduler runs; its name appears in reasons.
type Plugin interface{ Name() string }

// DeviceFilter decides whether a device may serve a request. It must look
// only at the static inventory (node and device fields, never usage): it
// runs once per group of identical nodes. It returns "" to accept, or the
// reason for refusing.
type DeviceFilter interface {
	Plugin
	FilterDevice(r *Request, n *Node, d *Device) string
}

// NodeFilter decides on a node with its current usage; "" accepts.
type NodeFilter interface {
	Plugin
	FilterNode(r *Request, ni *NodeInfo) string
}

// ScorePlugin rates a feasible candidate in [0, 1], higher is better.
type ScorePlugin interface {
	Plugin
	Score(r *Request, c *Candidate) float64
}

// Weighted is a score plugin with its weight.
type Weighted struct {
	Plugin ScorePlugin
	Weight float64
}

// Candidate is one feasible placement: the node and what it would hold.
type Candidate struct {
	*NodeInfo
	Alloc *Allocation
	// Set is the mask of devices the allocation touches.
	Set uint64
	// WorstRank is the rank of the slowest pair of Set (0 below two devices).
	WorstRank int
}

// Scheduler is a placement policy: its filters, picker and scores. A
// Scheduler holds no state of its own and may serve several goroutines.
type Scheduler struct {
	Name          string
	DeviceFilters []DeviceFilter
	NodeFilters   []NodeFilter
	Picker        Picker
	Scores        []Weighted
	// MaxScored bounds how many feasible nodes are scored per decision,
	// visited tightest first; 0 scores every feasible node.
	MaxScored int
	// Seed breaks ties between equal scores.
	Seed uint64
}

// DefaultMaxScored is kiln's bound on scored nodes per decision.
const DefaultMaxScored = 32

// Default returns kiln's policy: constraint and resource filters, the
// topology picker, and scores for link quality (weight 4), packing (2),
// keeping well-connected free sets whole (1) and, for fractional requests,
// fragmentation (FragScore, FragScoreWeight) against DefaultFragTarget.
func Default(seed uint64) *Scheduler {
	return &Scheduler{
		Name:          "kiln",
		DeviceFilters: []DeviceFilter{ConstraintFilter{}},
		NodeFilters:   []NodeFilter{ResourceFilter{}},
		Picker:        TopologyPicker{},
		Scores: []Weighted{
			{TopologyScore{}, 4},
			{PackScore{}, 2},
			{KeepSetsScore{}, 1},
			{FragScore{}, FragScoreWeight},
		},
		MaxScored: DefaultMaxScored,
		Seed:      seed,
	}
}

// UnschedulableError says why a request fits no node, with node counts
// per reason, in the manner of "0/1213 nodes are available".
type UnschedulableError struct {
	Request string
	Nodes   int
	Reasons map[string]int
}

func (e *UnschedulableError) Error() string {
	return fmt.Sprintf("request %s fits no node: %s", e.Request, e.Summary())
}

// Summary counts the nodes per reason: "0/3 nodes are available: 2 have
// no A100 GPU, 1 is drained".
func (e *UnschedulableError) Summary() string {
	keys := make([]string, 0, len(e.Reasons))
	for k := range e.Reasons {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if e.Reasons[keys[i]] != e.Reasons[keys[j]] {
			return e.Reasons[keys[i]] > e.Reasons[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", e.Reasons[k], k)
	}
	return fmt.Sprintf("0/%d nodes are available: %s", e.Nodes, strings.Join(parts, ", "))
}

var (
	errNoMIG   = errors.New("GPU is not in MIG mode")
	errMIGFull = errors.New("no free MIG slot for the profile")
)

// Reasons used when no plugin gives one.
const (
	reasonCapacity = "have too little free GPU capacity"
	reasonUnhealth = "are unhealthy"
	reasonLocality = "have no free GPU set that meets the locality"
	reasonMIG      = "have no free MIG slot for the profile"
	reasonMemory   = "have no GPU with enough free memory"
)

// Place finds where a request goes. It does not change the state.
func (s *Scheduler) Place(st *State, r Request) (Allocation, error) {
	return s.place(st, &r, nil)
}

// PlaceGang places every member of a gang, each seeing the ones placed
// before it, or none. Members go largest first (then by priority). It does
// not change the state; Commit the plan.
func (s *Scheduler) PlaceGang(st *State, g Gang) (Plan, error) {
	if len(g.Members) == 0 {
		return Plan{}, fmt.Errorf("sched: gang %s has no members", g.ID)
	}
	order := make([]int, len(g.Members))
	ids := map[string]bool{}
	for i := range order {
		order[i] = i
		id := g.Members[i].ID
		if ids[id] {
			return Plan{}, fmt.Errorf("sched: gang %s: request id %s is used twice", g.ID, id)
		}
		ids[id] = true
	}
	size := func(r *Request) int {
		switch r.Kind() {
		case KindWhole:
			return r.GPUs * 1000
		case KindFraction:
			return r.GPUMilli
		case KindMIG:
			return 1
		}
		return 0
	}
	sort.SliceStable(order, func(a, b int) bool {
		ra, rb := &g.Members[order[a]], &g.Members[order[b]]
		if sa, sb := size(ra), size(rb); sa != sb {
			return sa > sb
		}
		return ra.Priority > rb.Priority
	})
	over := map[int]*nodeUsage{}
	out := make([]Allocation, len(g.Members))
	for _, i := range order {
		m := g.Members[i]
		a, err := s.place(st, &m, over)
		if err != nil {
			return Plan{}, fmt.Errorf("sched: gang %s: member %s: %w", g.ID, m.ID, err)
		}
		a.Gang = g.ID
		u, ok := over[a.NodeIndex]
		if !ok {
			u = st.use[a.NodeIndex].clone()
			over[a.NodeIndex] = u
		}
		if err := apply(st.c.nodes[a.NodeIndex], u, &a); err != nil {
			return Plan{}, fmt.Errorf("sched: gang %s: member %s: %w", g.ID, m.ID, err)
		}
		out[i] = a
	}
	return Plan{Gang: g.ID, Allocations: out}, nil
}

// eligible is the device mask of a group for a request, or the reason the
// whole group is refused.
type eligible struct {
	mask   uint64
	reason string
}

func (s *Scheduler) eligibility(r *Request, g *group) eligible {
	kind := r.Kind()
	var mask uint64
	reason := ""
	for k := range g.rep.Devices {
		d := &g.rep.Devices[k]
		switch kind {
		case KindMIG:
			if !d.MIGEnabled || d.MIG == nil {
				reason = firstReason(reason, "have no GPU in MIG mode")
				continue
			}
			if _, ok := d.MIG.Profile(r.MIGProfile); !ok {
				reason = firstReason(reason, "have no GPU that offers MIG profile "+r.MIGProfile)
				continue
			}
		case KindWhole, KindFraction:
			if d.MIGEnabled {
				reason = firstReason(reason, "have only GPUs in MIG mode")
				continue
			}
		}
		if kind == KindFraction && r.GPUMemoryBytes > 0 && d.MemoryBytes < r.GPUMemoryBytes {
			reason = firstReason(reason, reasonMemory)
			continue
		}
		ok := true
		for _, f := range s.DeviceFilters {
			if why := f.FilterDevice(r, g.rep, d); why != "" {
				reason = firstReason(reason, why)
				ok = false
				break
			}
		}
		if ok {
			mask |= 1 << k
		}
	}
	switch {
	case kind == KindCPU:
		return eligible{mask: 0}
	case kind == KindWhole && count(mask) < r.GPUs:
		if reason == "" {
			reason = reasonCapacity
		}
		return eligible{reason: reason}
	case mask == 0:
		return eligible{reason: reason}
	}
	return eligible{mask: mask}
}

func firstReason(have, next string) string {
	if have != "" {
		return have
	}
	return next
}

// scan is the index buckets to visit, in order.
type scan struct {
	groups []int
	sets   []bitset
}

// order lists the index buckets to visit for a request, tightest first.
func (s *Scheduler) order(st *State, r *Request, ok []eligible) scan {
	var sc scan
	add := func(g int, b bitset) {
		sc.groups = append(sc.groups, g)
		sc.sets = append(sc.sets, b)
	}
	kind := r.Kind()
	switch kind {
	case KindWhole:
		for c := r.GPUs; c <= st.c.maxDev; c++ {
			for g, grp := range st.c.groups {
				if ok[g].reason == "" && c <= grp.ndev {
					add(g, st.idx[g].whole[c])
				}
			}
		}
	case KindFraction:
		for b := min(r.GPUMilli*partialBuckets/1000, partialBuckets-1); b < partialBuckets; b++ {
			for g := range st.c.groups {
				if ok[g].reason == "" {
					add(g, st.idx[g].partial[b])
				}
			}
		}
		for c := 1; c <= st.c.maxDev; c++ {
			for g, grp := range st.c.groups {
				if ok[g].reason == "" && c <= grp.ndev {
					add(g, st.idx[g].whole[c])
				}
			}
		}
	case KindMIG:
		for g, grp := range st.c.groups {
			if ok[g].reason == "" {
				b := grp.mig.clone()
				for w := range b {
					b[w] &= st.idx[g].live[w]
				}
				add(g, b)
			}
		}
	default:
		for g := range st.c.groups {
			add(g, st.idx[g].live)
		}
	}
	return sc
}

func (s *Scheduler) place(st *State, r *Request, over map[int]*nodeUsage) (Allocation, error) {
	if err := r.Validate(); err != nil {
		return Allocation{}, fmt.Errorf("sched: %w", err)
	}
	if _, dup := st.allocs[r.ID]; dup {
		return Allocation{}, fmt.Errorf("sched: request %s is already placed", r.ID)
	}
	if s.Picker == nil {
		return Allocation{}, errors.New("sched: scheduler has no picker")
	}
	ok := make([]eligible, len(st.c.groups))
	reasons := map[string]int{}
	for g, grp := range st.c.groups {
		ok[g] = s.eligibility(r, grp)
		if ok[g].reason != "" {
			reasons[ok[g].reason] += len(grp.nodes)
		}
	}
	rh := hashString(r.ID) ^ s.Seed*0x9e3779b97f4a7c15
	// spare is a candidate that lost: the next node's fit reuses its
	// memory, so a placement allocates two candidates, not one per node.
	var best, spare *Candidate
	var bestScore float64
	var bestTie uint64
	scored := 0
	sc := s.order(st, r, ok)
	done := false
	for k := 0; k < len(sc.sets) && !done; k++ {
		g := sc.groups[k]
		grp := st.c.groups[g]
		sc.sets[k].each(func(p int) bool {
			i := grp.nodes[p]
			u := &st.use[i]
			if o, has := over[i]; has {
				u = o
			}
			ni := &NodeInfo{Index: i, Node: st.c.nodes[i], Topo: st.c.topos[i], u: u}
			for _, f := range s.NodeFilters {
				if why := f.FilterNode(r, ni); why != "" {
					reasons[why]++
					return true
				}
			}
			c, why := s.fit(r, ni, ok[g].mask, spare)
			if c == nil {
				reasons[why]++
				return true
			}
			spare = nil
			total := 0.0
			for _, w := range s.Scores {
				total += w.Weight * clamp01(w.Plugin.Score(r, c))
			}
			tie := mix(rh ^ uint64(i))
			if best == nil || total > bestScore+1e-12 || total > bestScore-1e-12 && tie < bestTie {
				best, spare = c, best
				bestScore, bestTie = total, tie
			} else {
				spare = c
			}
			scored++
			if s.MaxScored > 0 && scored >= s.MaxScored {
				done = true
				return false
			}
			return true
		})
	}
	if best == nil {
		counted := 0
		for _, n := range reasons {
			counted += n
		}
		if rest := len(st.c.nodes) - counted; rest > 0 {
			reasons[reasonCapacity] += rest
		}
		return Allocation{}, &UnschedulableError{Request: r.ID, Nodes: len(st.c.nodes), Reasons: reasons}
	}
	a := *best.Alloc
	a.Score = bestScore
	return a, nil
}

// fit works out what node ni would hold for r, or why it cannot. It fills
// reuse (a candidate nobody holds any more) when given one.
func (s *Scheduler) fit(r *Request, ni *NodeInfo, elig uint64, reuse *Candidate) (*Candidate, string) {
	n := ni.Node
	if len(n.Unhealthy) > 0 {
		return nil, reasonUnhealth
	}
	var a *Allocation
	var devs []Share
	if reuse != nil && reuse.Alloc != nil {
		a, devs = reuse.Alloc, reuse.Alloc.Devices[:0]
	} else {
		a, reuse = &Allocation{}, &Candidate{}
	}
	*a = Allocation{RequestID: r.ID, Node: n.Name, NodeIndex: ni.Index, CPUMilli: r.CPUMilli, MemoryBytes: r.MemoryBytes,
		Priority: r.Priority, Project: r.Project, Devices: devs}
	c := reuse
	*c = Candidate{NodeInfo: ni, Alloc: a}
	share := func(k, milli int, mem uint64, slot *Slot) Share {
		d := &n.Devices[k]
		return Share{Device: k, PCI: d.PCI, UUID: d.UUID, Milli: milli, MemoryBytes: mem, MIG: slot}
	}
	switch r.Kind() {
	case KindWhole:
		free := ni.FreeWhole() & elig
		if count(free) < r.GPUs {
			return nil, reasonCapacity
		}
		set, ok := s.Picker.Pick(ni.Topo, free, r.GPUs, r.Locality)
		if !ok || count(set) != r.GPUs || set&^free != 0 {
			return nil, reasonLocality
		}
		c.Set = set
		for k := range n.Devices {
			if set&(1<<k) != 0 {
				a.Devices = append(a.Devices, share(k, 1000, n.Devices[k].MemoryBytes, nil))
			}
		}
		if r.GPUs > 1 {
			rank, _, i, j := ni.Topo.Worst(set)
			c.WorstRank = rank
			a.WorstLink = ni.Topo.Class(i, j)
		}
	case KindFraction:
		bestK, bestLeft, bestMem := -1, 0, uint64(0)
		var free uint64
		for k := range n.Devices {
			if elig&(1<<k) == 0 || !n.Devices[k].Healthy() {
				continue
			}
			du := &ni.u.devs[k]
			d := &n.Devices[k]
			if r.GPUMemoryBytes > 0 && (du.mem > d.MemoryBytes || r.GPUMemoryBytes > d.MemoryBytes-du.mem) {
				continue
			}
			if du.milli == 0 && du.mem == 0 {
				free |= 1 << k
				continue
			}
			left := 1000 - du.milli - r.GPUMilli
			if left < 0 {
				continue
			}
			memLeft := d.MemoryBytes - du.mem - r.GPUMemoryBytes
			if bestK < 0 || left < bestLeft || left == bestLeft && memLeft < bestMem {
				bestK, bestLeft, bestMem = k, left, memLeft
			}
		}
		if bestK < 0 {
			set, ok := s.Picker.Pick(ni.Topo, free, 1, Locality{})
			if !ok || count(set) != 1 || set&^free != 0 {
				return nil, reasonCapacity
			}
			for k := range n.Devices {
				if set&(1<<k) != 0 {
					bestK = k
				}
			}
		}
		c.Set = 1 << bestK
		a.Devices = append(a.Devices, share(bestK, r.GPUMilli, r.GPUMemoryBytes, nil))
	case KindMIG:
		bestK := -1
		var best migOption
		for k := range n.Devices {
			if elig&(1<<k) == 0 || !n.Devices[k].Healthy() {
				continue
			}
			o, err := bestMIG(&n.Devices[k], ni.u.devs[k].mig, r.MIGProfile)
			if err != nil {
				continue
			}
			if bestK < 0 || o.better(best) {
				bestK, best = k, o
			}
		}
		if bestK < 0 {
			return nil, reasonMIG
		}
		slot := best.slot
		c.Set = 1 << bestK
		a.Devices = append(a.Devices, share(bestK, 0, 0, &slot))
	}
	return c, ""
}

func clamp01(f float64) float64 {
	switch {
	case f > 1:
		return 1
	case f >= 0:
		return f
	}
	return 0 // negative and NaN
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// mix is splitmix64's finaliser.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
