package lease

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"kiln.dev/kiln/placement"

	"kiln.dev/kiln/api"
)

// Changes are what one call of the core changed, to be persisted together
// before the caller answers: leases, jobs and nodes as they are now, drain
// states, usage and events to add; Ended lists the jobs that ended (their
// logs are complete).
type Changes struct {
	At     time.Time
	Leases map[string]*api.Lease
	Jobs   map[string]*api.Job
	Nodes  map[string]*Node
	Drains []Drain
	Usage  []Usage
	Events []api.Event
	Ended  []string
	// Refusals are the leases refused, each with the kind of its reason
	// (for counting; the reason's text is on the lease).
	Refusals []Refusal
}

// Refusal is a lease refused and why, as a kind.
type Refusal struct {
	Lease, Project string
	Kind           RefusalKind
}

// RefusalKind names why a lease was refused, for metrics and tools that
// count refusals: the lease's Reason says it in words.
type RefusalKind string

// The kinds of refusal.
const (
	// RefusedSandbox: no node it may use gives its jobs what it requires.
	RefusedSandbox RefusalKind = "sandbox"
	// RefusedNoPods: it asks the cluster's scheduler to place it and no
	// node runs jobs as Pods.
	RefusedNoPods RefusalKind = "no-pod-nodes"
	// RefusedMaxGPUs: it asks for more GPUs than its project may hold.
	RefusedMaxGPUs RefusalKind = "project-max-gpus"
	// RefusedGPUHours: its project used its GPU-hours for the period.
	RefusedGPUHours RefusalKind = "project-gpu-hours"
	// RefusedImage: no node it may use runs its image.
	RefusedImage RefusalKind = "image"
	// RefusedNeverFits: no node could hold it even with every GPU free.
	RefusedNeverFits RefusalKind = "never-fits"
)

// refuse ends a lease as refused, with the reason and its kind.
func (s *Core) refuse(ls *leaseState, kind RefusalKind, reason string, now time.Time, b *Changes) {
	s.finishLease(ls, api.LeaseRefused, reason, now, b)
	b.Refusals = append(b.Refusals, Refusal{Lease: ls.l.ID, Project: ls.l.Project, Kind: kind})
}

// Drain is a device's new drain state.
type Drain struct {
	Node, Device string
	State        DeviceState
}

// Usage is GPU-seconds a project used in the quota period that started at
// Period.
type Usage struct {
	Project string
	Period  time.Time
	Seconds float64
}

// newChanges returns empty changes made at now; the maps are made on first
// use (most heartbeats change nothing).
func newChanges(now time.Time) *Changes { return &Changes{At: now} }

func (b *Changes) lease(l *api.Lease) {
	if b.Leases == nil {
		b.Leases = map[string]*api.Lease{}
	}
	b.Leases[l.ID] = l
}

func (b *Changes) job(j *api.Job) {
	if b.Jobs == nil {
		b.Jobs = map[string]*api.Job{}
	}
	b.Jobs[j.ID] = j
}

func (b *Changes) node(n *Node) {
	if b.Nodes == nil {
		b.Nodes = map[string]*Node{}
	}
	b.Nodes[n.rec.Node.ID] = n
}

// Event adds an event.
func (b *Changes) Event(kind, subject, project, format string, args ...any) {
	b.Events = append(b.Events, api.Event{At: b.At, Kind: kind, Subject: subject, Project: project, Message: fmt.Sprintf(format, args...)})
}

// Empty reports whether nothing changed.
func (b *Changes) Empty() bool {
	return len(b.Leases) == 0 && len(b.Jobs) == 0 && len(b.Nodes) == 0 && len(b.Drains) == 0 && len(b.Usage) == 0 && len(b.Events) == 0 && len(b.Ended) == 0 && len(b.Refusals) == 0
}

// views returns the placement view of every ready node. The list is kept:
// a node that changed gets a new view in its place; the list is made again
// only when a node joins, becomes ready or is lost.
func (s *Core) views() []*placement.NodeView {
	if s.viewList != nil && len(s.nodeCache) == len(s.nodes) && s.viewPos != nil {
		whole := false
		for _, n := range s.redrawn {
			pos, listed := s.viewPos[n]
			if listed != (n.rec.Node.State == api.NodeReady) {
				whole = true
				break
			}
			if listed && n.dirty {
				n.view = s.buildView(n, nil)
				n.dirty = false
				s.viewList[pos] = n.view
			}
		}
		if !whole {
			s.redrawn = s.redrawn[:0]
			return s.viewList
		}
	}
	out := make([]*placement.NodeView, 0, len(s.nodes))
	s.viewPos = make(map[*Node]int, len(s.nodes))
	for _, n := range s.nodeList() {
		if n.rec.Node.State != api.NodeReady {
			continue
		}
		if n.dirty || n.view == nil {
			n.view = s.buildView(n, nil)
			n.dirty = false
		}
		s.viewPos[n] = len(out)
		out = append(out, n.view)
	}
	s.viewList, s.redrawn = out, s.redrawn[:0]
	return out
}

// redraw marks a node's view out of date.
func (s *Core) redraw(n *Node) {
	n.dirty = true
	if len(s.redrawn) > 4*len(s.nodes)+64 {
		s.viewPos, s.redrawn = nil, s.redrawn[:0] // make the list again
		return
	}
	s.redrawn = append(s.redrawn, n)
}

// nodeList is every node sorted by id; kept until a node joins.
func (s *Core) nodeList() []*Node {
	if len(s.nodeCache) == len(s.nodes) {
		return s.nodeCache
	}
	ns := make([]*Node, 0, len(s.nodes))
	for _, n := range s.nodes {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i].rec.Node.ID < ns[j].rec.Node.ID })
	s.nodeCache = ns
	return ns
}

// readyViews are the views of the ready nodes made with adjust (see
// buildView), as a hypothetical for one lease.
func (s *Core) readyViews(adjust func(u *unitState, d *placement.DeviceView)) []*placement.NodeView {
	var views []*placement.NodeView
	for _, n := range s.nodeList() {
		if n.rec.Node.State == api.NodeReady {
			views = append(views, s.buildView(n, adjust))
		}
	}
	return views
}

// buildView makes a node's view; adjust, when set, may change each device.
func (s *Core) buildView(n *Node, adjust func(u *unitState, d *placement.DeviceView)) *placement.NodeView {
	v := placement.NewNodeView(n.rec.Node.ID, n.rec.Snapshot, len(n.units))
	v.Devices = v.Devices[:len(n.units)]
	for i, u := range n.units {
		d := placement.DeviceView{Device: &u.dev}
		d.Usable = !u.dev.Drained && !u.dev.MIGMode && !s.heldByLost(u)
		d.Whole = len(u.holders) == 0
		d.FreeMilli = max(1000-u.usedMilli, 0)
		if u.dev.MemoryBytes > u.usedMem {
			d.FreeMemory = u.dev.MemoryBytes - u.usedMem
		}
		if adjust != nil {
			adjust(u, &d)
		}
		if d.Usable && d.Whole && !d.MIGMode && d.Parent == "" {
			v.FreeWhole++
		}
		v.Devices[i] = d
	}
	return v
}

func (s *Core) heldByLost(u *unitState) bool {
	for id := range u.holders {
		if ls := s.leases[id]; ls != nil && ls.l.State == api.LeaseLost {
			return true
		}
	}
	return false
}

// viewsFor is views as lease ls may use them: devices reserved for another
// lease are usable only by a lease that ends before the reservation
// starts; devices claimed by a preempting lease only by that lease.
func (s *Core) viewsFor(ls *leaseState, now time.Time) []*placement.NodeView {
	base := s.views()
	special := s.specialNodes()
	if len(special) == 0 {
		return base
	}
	ends := now.Add(s.timeLimit(ls.l.Request))
	var out []*placement.NodeView
	for i, v := range base {
		n := s.nodes[v.ID]
		if !special[v.ID] {
			if out != nil {
				out = append(out, v)
			}
			continue
		}
		if out == nil {
			out = append(make([]*placement.NodeView, 0, len(base)), base[:i]...)
		}
		out = append(out, s.buildView(n, func(u *unitState, d *placement.DeviceView) {
			if u.claimedBy != "" && u.claimedBy != ls.l.ID {
				d.Usable = false
			}
			if u.reservedFor != "" && u.reservedFor != ls.l.ID && ends.After(u.reservedTil) {
				d.Usable = false
			}
		}))
	}
	if out == nil {
		return base
	}
	return out
}

// specialNodes are the nodes with a device reserved for a waiting lease or
// claimed by a preempting one; their views differ from lease to lease.
func (s *Core) specialNodes() map[string]bool {
	if len(s.reserved) == 0 && len(s.claiming) == 0 {
		return nil
	}
	out := map[string]bool{}
	for _, r := range s.reserved {
		out[r.node] = true
	}
	for _, ls := range s.claiming {
		for _, r := range ls.claims {
			out[r.node] = true
		}
	}
	return out
}

func (s *Core) timeLimit(r api.LeaseRequest) time.Duration {
	if r.TimeLimitSeconds > 0 {
		return min(time.Duration(r.TimeLimitSeconds)*time.Second, s.cfg.MaxTimeLimit)
	}
	return s.cfg.DefaultTimeLimit
}

// schedule grants what can be granted: projects take turns by fair share,
// each project's queue in priority order then arrival; the first lease
// that cannot be placed holds a reservation that later leases may use only
// if they end before it starts (backfill); a lease that outranks
// preemptible ones may have them stopped.
func (s *Core) schedule(now time.Time, b *Changes) {
	queues := map[string][]*leaseState{}
	for _, ls := range s.queued {
		queues[ls.l.Project] = append(queues[ls.l.Project], ls)
	}
	if len(queues) == 0 {
		s.order = nil
		return
	}
	for _, q := range queues {
		sort.Slice(q, func(i, j int) bool {
			if q[i].l.Request.Priority != q[j].l.Request.Priority {
				return q[i].l.Request.Priority > q[j].l.Request.Priority
			}
			return q[i].seq < q[j].seq
		})
	}
	s.reserveHeads(now)
	next := map[string]int{}
	var order []string
	// guard is the fair-share key that the most deprived blocked project
	// would reach with its blocked lease; others may take GPUs beside it
	// (backfill) only while they stay below that.
	guard, guardProject := math.Inf(1), ""
	for {
		var pick string
		best := math.Inf(1)
		for p, q := range queues {
			if next[p] >= len(q) {
				continue
			}
			// The project whose usage per weight would be least halfway
			// through its next lease goes first: a large lease of a small
			// share waits until that share fell somewhat behind, so no
			// project runs ahead or falls behind by more than half a lease.
			ps := s.project(p, now)
			k := s.keyWith(ps, q[next[p]].need/2, now)
			if k < best || (k == best && p < pick) {
				best, pick = k, p
			}
		}
		if pick == "" {
			break
		}
		ls := queues[pick][next[pick]]
		next[pick]++
		ps := s.project(pick, now)
		if ps.p.GPUHours > 0 {
			if used := s.usedHours(ps, now); used >= ps.p.GPUHours {
				s.refuse(ls, RefusedGPUHours, fmt.Sprintf("project %s used %.1f of its %g GPU-hours in the period that started %s", pick, used, ps.p.GPUHours, ps.period.Format(time.RFC3339)), now, b)
				continue
			}
		}
		if ps.p.MaxGPUs > 0 && ps.held+ls.need > ps.p.MaxGPUs+1e-9 {
			ls.l.Reason = fmt.Sprintf("waiting: project %s holds %g of its %g GPUs at once", pick, ps.held, ps.p.MaxGPUs)
			order = append(order, ls.l.ID)
			continue
		}
		if after := s.keyWith(ps, ls.need, now); after > guard+1e-9 {
			ls.l.Reason = "waiting: its project is above its fair share while a project below it waits"
			if pick == guardProject {
				ls.l.Reason = "waiting: behind a lease of its own project that cannot be placed yet"
			}
			order = append(order, ls.l.ID)
			continue
		}
		pl, err := s.cfg.Placer.Place(ls.req, s.viewsFor(ls, now))
		if err == nil {
			s.grant(ls, pl, now, b)
			continue
		}
		if s.refuseIfNeverFits(ls, now, b) {
			continue
		}
		if g := s.fairKey(ps, now); g < guard {
			guard, guardProject = g, pick
		}
		ls.l.Reason = "waiting: " + err.Error()
		order = append(order, ls.l.ID)
		if len(s.heads) == 0 {
			s.heads = append(s.heads, ls.l.ID)
			s.reserveHeads(now)
		}
		s.tryPreempt(ls, now, b)
	}
	s.order = order
}

func (s *Core) project(name string, now time.Time) *projState {
	ps := s.projects[name]
	if ps == nil {
		ps = &projState{p: api.Project{Name: name, Weight: 1, PeriodSeconds: 30 * 24 * 3600}, recentAt: now, period: periodStart(now, 0)}
		s.projects[name] = ps
	}
	return ps
}

// usedHours is the project's GPU-hours in the current period, the running
// leases included.
func (s *Core) usedHours(ps *projState, now time.Time) float64 {
	if p := periodStart(now, ps.p.PeriodSeconds); !p.Equal(ps.period) {
		ps.period, ps.used = p, 0
	}
	sec := ps.used
	for _, ls := range s.leases {
		if ls.l.Project == ps.p.Name && ls.l.GrantedAt != nil && (ls.l.State == api.LeaseGranted || ls.l.State == api.LeaseStopping) {
			sec += ls.need * now.Sub(maxTime(*ls.l.GrantedAt, ps.period)).Seconds()
		}
	}
	return sec / 3600
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *Core) dropHead(id string) {
	for i, h := range s.heads {
		if h == id {
			s.heads = append(s.heads[:i:i], s.heads[i+1:]...)
			return
		}
	}
}

// farFuture is when a unit held by a lost lease will be free: not in any
// plan.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// freeAt is when a unit will be free if every lease on it runs to its
// limit; the zero time when free now, and far in the future while a lost
// lease holds it.
func (s *Core) freeAt(u *unitState) time.Time {
	var t time.Time
	for id := range u.holders {
		ls := s.leases[id]
		if ls == nil {
			continue
		}
		var end time.Time
		switch {
		case ls.l.State == api.LeaseStopping && ls.l.StopDeadline != nil:
			end = *ls.l.StopDeadline
		case ls.l.EndsAt != nil && ls.l.State == api.LeaseGranted:
			end = *ls.l.EndsAt
		default:
			end = farFuture
		}
		if end.After(t) {
			t = end
		}
	}
	return t
}

// earliest finds the first time at which ls could be placed if leases end
// at their limits, and the placement then. The views at time t free every
// device whose leases end by t.
func (s *Core) earliest(ls *leaseState, now time.Time, busy map[*unitState]time.Time) (time.Time, placement.Placement, bool) {
	var times []time.Time
	seen := map[time.Time]bool{}
	for _, n := range s.nodes {
		if n.rec.Node.State != api.NodeReady {
			continue
		}
		for _, u := range n.units {
			t := s.freeAt(u)
			if b, ok := busy[u]; ok && b.After(t) {
				t = b
			}
			if t.After(now) && !seen[t] {
				seen[t] = true
				times = append(times, t)
			}
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	if len(times) > 48 {
		step := float64(len(times)) / 48
		var sampled []time.Time
		for i := 0.0; int(i) < len(times); i += step {
			sampled = append(sampled, times[int(i)])
		}
		times = append(sampled, times[len(times)-1])
	}
	for _, t := range times {
		views := s.readyViews(func(u *unitState, d *placement.DeviceView) {
			if u.claimedBy != "" && u.claimedBy != ls.l.ID {
				d.Usable = false
			}
			f := s.freeAt(u)
			if b, ok := busy[u]; ok && b.After(f) {
				f = b
			}
			if !f.After(t) {
				d.Whole, d.FreeMilli, d.FreeMemory = true, 1000, u.dev.MemoryBytes
			} else if _, ok := busy[u]; ok {
				d.Usable = false
			}
		})
		if pl, err := s.cfg.Placer.Place(ls.req, views); err == nil {
			return t, pl, true
		}
	}
	return time.Time{}, placement.Placement{}, false
}

// reserveHeads gives the head -- the first lease in grant order that did
// not fit, kept until it is granted -- the devices it will get at its
// estimated start. Other leases may use reserved devices only when they
// end before the reservation starts (backfill), so a large lease is never
// starved by a stream of small ones. (Several heads would plan around one
// another; one keeps the GPUs busy when leases end long before their
// limits, as they usually do.)
func (s *Core) reserveHeads(now time.Time) {
	for _, r := range s.reserved {
		if n := s.nodes[r.node]; n != nil {
			if u := n.byID[r.unit]; u != nil && u.reservedFor != "" {
				u.reservedFor, u.reservedTil = "", time.Time{}
				s.redraw(n)
			}
		}
	}
	s.reserved = s.reserved[:0]
	if len(s.heads) == 0 {
		return
	}
	busy := map[*unitState]time.Time{}
	var keep []string
	for _, id := range s.heads {
		ls := s.leases[id]
		if ls == nil || ls.l.State != api.LeaseQueued {
			continue
		}
		keep = append(keep, id)
		t, pl, ok := s.earliest(ls, now, busy)
		if !ok {
			continue
		}
		end := t.Add(s.timeLimit(ls.l.Request))
		for _, a := range pl.Allocations {
			n := s.nodes[a.Node]
			for _, g := range a.Devices {
				if u := n.byID[g.ID]; u != nil {
					if u.reservedFor == "" {
						u.reservedFor, u.reservedTil = id, t
						s.redraw(n)
						s.reserved = append(s.reserved, unitRef{a.Node, g.ID})
					}
					busy[u] = end
				}
			}
		}
		tt := t
		ls.l.EstimatedStart = &tt
	}
	s.heads = keep
}

// tryPreempt stops preemptible leases of lower priority when that lets ls
// be placed, and claims their devices for it.
func (s *Core) tryPreempt(ls *leaseState, now time.Time, b *Changes) {
	if len(ls.claims) > 0 {
		return
	}
	prio := ls.l.Request.Priority
	victims := map[string]bool{}
	for id, v := range s.leases {
		if v.l.State == api.LeaseGranted && v.l.Request.Preemptible && v.l.Request.Priority < prio {
			victims[id] = true
		}
	}
	if len(victims) == 0 {
		return
	}
	ends := now.Add(s.timeLimit(ls.l.Request))
	views := s.readyViews(func(u *unitState, d *placement.DeviceView) {
		if u.claimedBy != "" && u.claimedBy != ls.l.ID {
			d.Usable = false
			return
		}
		if u.reservedFor != "" && u.reservedFor != ls.l.ID && ends.After(u.reservedTil) {
			d.Usable = false
			return
		}
		milli, mem, others := 0, uint64(0), 0
		for id, h := range u.holders {
			if victims[id] {
				milli += h.milli
				mem += h.mem
			} else {
				others++
			}
		}
		if milli > 0 {
			d.FreeMilli = min(d.FreeMilli+milli, 1000)
			d.FreeMemory += mem
			d.Whole = others == 0
		}
	})
	pl, err := s.cfg.Placer.Place(ls.req, views)
	if err != nil {
		return
	}
	stopped := map[string]bool{}
	for _, a := range pl.Allocations {
		n := s.nodes[a.Node]
		for _, g := range a.Devices {
			if u := n.byID[g.ID]; u != nil {
				for id := range u.holders {
					if victims[id] {
						stopped[id] = true
					}
				}
			}
		}
	}
	if len(stopped) == 0 {
		return // it fits without stopping anyone once the queue ahead moves
	}
	for _, a := range pl.Allocations {
		n := s.nodes[a.Node]
		for _, g := range a.Devices {
			if u := n.byID[g.ID]; u != nil {
				u.claimedBy = ls.l.ID
				s.redraw(n)
				ls.claims = append(ls.claims, unitRef{a.Node, g.ID})
				s.claiming[ls.l.ID] = ls
			}
		}
	}
	ids := make([]string, 0, len(stopped))
	for id := range stopped {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		v := s.leases[id]
		reason := fmt.Sprintf("preempted by lease %s (priority %d over %d)", ls.l.ID, prio, v.l.Request.Priority)
		s.stopLease(v, api.LeasePreempted, reason, s.cfg.PreemptGrace, now, b)
	}
	b.Event("lease.preempting", ls.l.ID, ls.l.Project, "preempting %s", strings.Join(ids, ", "))
}

func (s *Core) releaseClaims(ls *leaseState) {
	for _, c := range ls.claims {
		if n := s.nodes[c.node]; n != nil {
			if u := n.byID[c.unit]; u != nil && u.claimedBy == ls.l.ID {
				u.claimedBy = ""
				s.redraw(n)
			}
		}
	}
	ls.claims = nil
	delete(s.claiming, ls.l.ID)
	s.dropHead(ls.l.ID)
}

// grant gives ls its placement and hands its jobs to the agents.
func (s *Core) grant(ls *leaseState, pl placement.Placement, now time.Time, b *Changes) {
	l := ls.l
	offered := s.offer(ls, pl, now)
	s.releaseClaims(ls)
	for i, a := range pl.Allocations {
		n := s.nodes[a.Node]
		pl.Allocations[i].Sandbox = n.rec.Node.Sandbox
		for _, g := range a.Devices {
			n.byID[g.ID].hold(l.ID, g.MilliGPU, g.MemoryBytes)
		}
		s.redraw(n)
	}
	ends := now.Add(s.timeLimit(l.Request))
	t := now
	l.State, l.GrantedAt, l.EndsAt, l.Allocations = api.LeaseGranted, &t, &ends, pl.Allocations
	delete(s.queued, l.ID)
	l.Reason, l.QueuePosition, l.EstimatedStart = "", 0, nil
	l.Isolation = api.IsolationExclusive
	rank := map[string]int{api.IsolationExclusive: 0, api.IsolationMIG: 1, api.IsolationMPS: 2, api.IsolationTimeSlicing: 3}
	var where []string
	for _, a := range pl.Allocations {
		ids := make([]string, 0, len(a.Devices))
		for _, g := range a.Devices {
			if rank[g.Isolation] > rank[l.Isolation] {
				l.Isolation = g.Isolation
			}
			ids = append(ids, g.ID)
		}
		where = append(where, a.Node+":"+strings.Join(ids, ","))
	}
	s.heldSince(s.project(l.Project, now), ls, t)
	b.lease(l)
	if offered > 0 {
		b.Event("lease.granted", l.ID, l.Project, "granted %s (isolation %s): the kube-scheduler picks %d of these %d GPUs, kiln gives back the others once it has",
			strings.Join(where, " "), l.Isolation, pl.Allocations[0].Choose, offered)
	} else {
		b.Event("lease.granted", l.ID, l.Project, "granted %s (isolation %s)", strings.Join(where, " "), l.Isolation)
	}
	for _, js := range ls.jobs {
		if js.j.State == api.JobPending {
			s.assign(js, b)
		}
	}
}

// offer adds to a lease whose devices the cluster's scheduler picks
// (api.PlacementScheduler) every other free device of its node that meets
// its constraints, and sets how many it is to pick; it returns how many
// devices are offered in all, 0 for a lease placed by kiln. Only a node
// of the Kubernetes backend can let its scheduler pick: elsewhere the
// lease keeps kiln's choice.
func (s *Core) offer(ls *leaseState, pl placement.Placement, now time.Time) int {
	if ls.l.Request.Placement != api.PlacementScheduler || len(pl.Allocations) != 1 {
		return 0
	}
	a := &pl.Allocations[0]
	n := s.nodes[a.Node]
	if n == nil || !n.letsSchedulerPick() {
		return 0
	}
	for _, v := range s.viewsFor(ls, now) {
		if v.ID != a.Node {
			continue
		}
		extra := placement.Offer(ls.req, v, a.Devices)
		if len(extra) == 0 {
			return 0 // no choice to leave
		}
		a.Choose = len(a.Devices)
		a.Devices = append(a.Devices, extra...)
		sort.Slice(a.Devices, func(i, j int) bool { return a.Devices[i].Index < a.Devices[j].Index })
		return len(a.Devices)
	}
	return 0
}

// letsSchedulerPick says whether the node's jobs run as Pods, whose
// devices the kube-scheduler can pick.
func (n *Node) letsSchedulerPick() bool { return n.rec.Node.Containers == KubernetesExecutor }

// KubernetesExecutor is the name the agents of the Kubernetes backend give
// their executor.
const KubernetesExecutor = "kubernetes"

// noteChosen records the devices the cluster's scheduler picked for the
// node's jobs (api.PlacementScheduler): the lease keeps those and gives
// back the others it was offered. A report that names a device the lease
// was not offered, or the wrong number of them, is ignored (and said in
// the lease's events once).
func (s *Core) noteChosen(n *Node, chosen map[string][]string, b *Changes) {
	node := n.rec.Node.ID
	for job, ids := range chosen {
		js := n.tasks[job]
		if js == nil {
			continue
		}
		l := js.lease.l
		if l.State != api.LeaseGranted {
			continue
		}
		for i := range l.Allocations {
			a := &l.Allocations[i]
			if a.Node != node || a.Choose == 0 {
				continue
			}
			keep, ok := pick(a.Devices, ids, a.Choose)
			if !ok {
				if !js.lease.badPick {
					js.lease.badPick = true
					b.Event("lease.placement", l.ID, l.Project, "node %s reported a pick of %d devices (%s) that is not %d of those offered; kiln keeps holding all %d",
						node, len(ids), strings.Join(ids[:min(len(ids), 8)], ","), a.Choose, len(a.Devices))
				}
				continue
			}
			var back []string
			for _, g := range a.Devices {
				if !slices.ContainsFunc(keep, func(k api.DeviceGrant) bool { return k.ID == g.ID }) {
					if u := n.byID[g.ID]; u != nil {
						u.free(l.ID)
					}
					back = append(back, g.ID)
				}
			}
			a.Devices, a.Choose = keep, 0
			s.redraw(n)
			b.lease(l)
			b.Event("lease.placed", l.ID, l.Project, "the kube-scheduler picked %s:%s; kiln gave back %s", node, strings.Join(ids, ","), strings.Join(back, ","))
		}
	}
}

// pick is the devices of offered that ids name, when they are n distinct
// ones.
func pick(offered []api.DeviceGrant, ids []string, n int) ([]api.DeviceGrant, bool) {
	if len(ids) != n {
		return nil, false
	}
	var keep []api.DeviceGrant
	for _, g := range offered {
		if slices.Contains(ids, g.ID) {
			keep = append(keep, g)
		}
	}
	return keep, len(keep) == n
}

// assign turns a pending job into one task per allocation.
func (s *Core) assign(js *jobState, b *Changes) {
	l := js.lease.l
	js.j.State = api.JobAssigned
	js.j.Tasks = nil
	for i, a := range l.Allocations {
		js.j.Tasks = append(js.j.Tasks, api.Task{Node: a.Node, Rank: i, State: api.JobAssigned})
		if n := s.nodes[a.Node]; n != nil {
			n.addTask(js.j.ID, js)
			s.poke(n)
		}
	}
	b.job(js.j)
}

// stopLease ends a granted lease: at once when no job runs in it, else by
// asking the agents to stop its jobs (SIGTERM, then SIGKILL after grace).
func (s *Core) stopLease(ls *leaseState, final, reason string, grace time.Duration, now time.Time, b *Changes) {
	l := ls.l
	if l.State == api.LeaseQueued {
		s.finishLease(ls, final, reason, now, b)
		return
	}
	active := false
	for _, js := range ls.jobs {
		for _, t := range js.j.Tasks {
			if !api.JobFinal(t.State) {
				active = true
			}
		}
	}
	if !active {
		s.finishLease(ls, final, reason, now, b)
		return
	}
	if l.State == api.LeaseStopping {
		return
	}
	deadline := now.Add(grace)
	l.State, l.Reason, l.StopDeadline = api.LeaseStopping, reason, &deadline
	ls.final = final
	b.lease(l)
	b.Event("lease.stopping", l.ID, l.Project, "%s; jobs get %s to finish", reason, grace)
	for _, js := range ls.jobs {
		s.orderStop(js, grace, reason)
	}
}

func (s *Core) orderStop(js *jobState, grace time.Duration, reason string) {
	grace = max(grace, 0)
	for _, t := range js.j.Tasks {
		if api.JobFinal(t.State) {
			continue
		}
		if n := s.nodes[t.Node]; n != nil {
			n.addStop(js.j.ID, api.StopOrder{JobID: js.j.ID, GraceMS: int(grace / time.Millisecond), Reason: reason,
				Notice: fmt.Sprintf("kiln: %s; this job is stopped in %s (SIGTERM now, SIGKILL then)", reason, grace)})
			s.poke(n)
		}
	}
}

// finishLease frees a lease's devices and gives it a final state.
func (s *Core) finishLease(ls *leaseState, state, reason string, now time.Time, b *Changes) {
	l := ls.l
	s.releaseClaims(ls)
	if l.State == api.LeaseGranted || l.State == api.LeaseStopping {
		s.freeDevices(ls, "")
		s.account(ls, now, b)
	}
	t := now
	l.State, l.EndedAt = state, &t
	delete(s.queued, l.ID)
	if reason != "" {
		l.Reason = reason
	}
	l.QueuePosition, l.EstimatedStart = 0, nil
	for _, js := range ls.jobs {
		if !api.JobFinal(js.j.State) {
			for i := range js.j.Tasks {
				if !api.JobFinal(js.j.Tasks[i].State) {
					js.j.Tasks[i].State = api.JobStopped
				}
			}
			js.j.State, js.j.Reason = api.JobStopped, "its lease ended ("+state+") before it ran"
			f := now
			js.j.Finished = &f
			b.job(js.j)
		}
		delete(s.jobs, js.j.ID)
		for _, t := range js.j.Tasks {
			if n := s.nodes[t.Node]; n != nil {
				delete(n.tasks, js.j.ID)
			}
		}
		b.Ended = append(b.Ended, js.j.ID)
	}
	delete(s.leases, l.ID)
	b.lease(l)
	msg := state
	if l.Reason != "" {
		msg += ": " + l.Reason
	}
	b.Event("lease."+state, l.ID, l.Project, "%s", msg)
}

// freeDevices frees the lease's devices on one node ("" for all).
func (s *Core) freeDevices(ls *leaseState, node string) {
	for _, a := range ls.l.Allocations {
		if node != "" && a.Node != node {
			continue
		}
		n := s.nodes[a.Node]
		if n == nil {
			continue
		}
		for _, g := range a.Devices {
			if u := n.byID[g.ID]; u != nil {
				u.free(ls.l.ID)
			}
		}
		s.redraw(n)
	}
}

// account adds a lease's GPU time to its project's usage.
func (s *Core) account(ls *leaseState, now time.Time, b *Changes) {
	ps := s.project(ls.l.Project, now)
	if ls.l.GrantedAt == nil {
		ps.held = max(ps.held-ls.need, 0)
		return
	}
	sec := s.released(ps, ls, *ls.l.GrantedAt, now)
	s.decay(ps, now)
	ps.recent += sec
	period := periodStart(now, ps.p.PeriodSeconds)
	if !period.Equal(ps.period) {
		ps.period, ps.used = period, 0
	}
	ps.used += sec
	b.Usage = append(b.Usage, Usage{Project: ps.p.Name, Period: period, Seconds: sec})
}

// estimates walks the queue in grant order and gives each lease the first
// time it fits, the leases ahead of it included; computed at most once a
// second.
func (s *Core) estimates(now time.Time) map[string]time.Time {
	if s.est != nil && now.Sub(s.estAt) < time.Second {
		return s.est
	}
	est := map[string]time.Time{}
	busy := map[*unitState]time.Time{}
	for i, id := range s.order {
		if i >= 200 {
			break
		}
		ls := s.leases[id]
		if ls == nil || ls.l.State != api.LeaseQueued {
			continue
		}
		t, pl, ok := s.earliest(ls, now, busy)
		if !ok {
			continue
		}
		est[id] = t
		end := t.Add(s.timeLimit(ls.l.Request))
		for _, a := range pl.Allocations {
			for _, g := range a.Devices {
				if u := s.nodes[a.Node].byID[g.ID]; u != nil {
					busy[u] = end
				}
			}
		}
	}
	s.est, s.estAt = est, now
	return est
}

// decorate fills a queued lease's position and estimated start.
func (s *Core) decorate(l *api.Lease, now time.Time) {
	l.Ports = nil
	if l.State == api.LeaseGranted {
		l.Ports = s.portStates(l)
	}
	if l.State != api.LeaseQueued {
		l.QueuePosition, l.EstimatedStart = 0, nil
		return
	}
	for i, id := range s.order {
		if id == l.ID {
			l.QueuePosition = i + 1
			break
		}
	}
	if t, ok := s.estimates(now)[l.ID]; ok {
		tt := t
		l.EstimatedStart = &tt
	}
}
