// Package lease is the lease service's core: the state of projects,
// nodes, devices, leases and jobs, and the policy that moves it (a queue
// with priorities, weighted fair share by decayed usage, backfill beside
// a reservation, preemption with notice and grace, expiry, quotas, gangs,
// refusal of what could never fit). It does no I/O, starts no goroutine
// and reads no clock: every method that can change something takes the
// time and returns the Changes to persist; the caller (kiln's server)
// decodes requests, holds the lock, calls the core, writes the changes
// and answers. Where devices are chosen is behind placement.Placer; where
// jobs run is the nodes' agents, told through each node's orders.
package lease

import (
	"cmp"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/placement"
	"kiln.dev/kiln/snapshot"
)

// NodeJoining is the state of a node that joined but sent no snapshot yet.
const NodeJoining = "joining"

// Config sets up the core; zero values take the defaults.
type Config struct {
	// HeartbeatTimeout marks a silent node lost (default 30s).
	HeartbeatTimeout time.Duration
	// DefaultTimeLimit applies to leases that ask for none (default 24h);
	// MaxTimeLimit caps what a lease may ask (default 7 days).
	DefaultTimeLimit time.Duration
	MaxTimeLimit     time.Duration
	// PreemptGrace is the time a preempted or expired job has between the
	// notice (SIGTERM) and the kill (default 30s).
	PreemptGrace time.Duration
	// FairShareWindow is the half-life of past usage in the fair-share
	// order (default 1h).
	FairShareWindow time.Duration
	// Limits are the defaults of the per-project limits (api.Limits) for
	// the projects that set none.
	Limits api.Limits
	// Placer picks devices; a placement.SchedPlacer when nil.
	Placer placement.Placer
	KB     *kb.KB
	Logger *slog.Logger
	// NewID names new leases and jobs ("l-", "j-" prefixes).
	NewID func(prefix string) string
	// Runner is where leases run; nil: nobody is told (the nodes ask).
	Runner Runner
}

// Runner is where leases run. The core decides what each node is to do
// (Orders: tasks to start, stop orders) and tells the runner which node
// has something new; the runner carries it there. kiln's agents pull
// their orders with their heartbeats (the server's runner wakes a
// heartbeat that waits); a Kubernetes runner would make and delete pods.
// Wake is called with the caller's lock held and must not block.
type Runner interface {
	Wake(node string)
}

type noRunner struct{}

func (noRunner) Wake(string) {}

// Defaults fills the zero values of c.
func (c *Config) Defaults() {
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 30 * time.Second
	}
	if c.DefaultTimeLimit <= 0 {
		c.DefaultTimeLimit = 24 * time.Hour
	}
	if c.MaxTimeLimit <= 0 {
		c.MaxTimeLimit = 7 * 24 * time.Hour
	}
	if c.PreemptGrace <= 0 {
		c.PreemptGrace = 30 * time.Second
	}
	if c.FairShareWindow <= 0 {
		c.FairShareWindow = time.Hour
	}
	l := &c.Limits
	l.MaxQueued = cmp.Or(l.MaxQueued, 1000)
	l.MaxQueuedPerUser = cmp.Or(l.MaxQueuedPerUser, 100)
	l.MaxJobsPerLease = cmp.Or(l.MaxJobsPerLease, 1000)
	l.MaxEnvBytes = cmp.Or(l.MaxEnvBytes, 256<<10)
	l.MaxLogBytesPerJob = cmp.Or(l.MaxLogBytesPerJob, 1<<30)
	l.MaxLogBytes = cmp.Or(l.MaxLogBytes, 50<<30)
	if c.KB == nil {
		c.KB = kb.Default()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Placer == nil {
		c.Placer = &placement.SchedPlacer{KB: c.KB, Logger: c.Logger}
	}
	if c.Runner == nil {
		c.Runner = noRunner{}
	}
	if c.NewID == nil {
		n := 0
		c.NewID = func(prefix string) string {
			n++
			return fmt.Sprintf("%s%d", prefix, n)
		}
	}
}

// NodeRecord is what is kept of a node: its API view, last snapshot and
// the keys its agent proved.
type NodeRecord struct {
	Node       api.Node
	Snapshot   *snapshot.Snapshot
	CertSHA256 string
	KeySHA256  string
	// Replacing is set by an admin: the next join with a valid token may
	// bind the name to a new key.
	Replacing bool
}

// DeviceState is a device's drain state as kept.
type DeviceState struct {
	Drained bool
	Reason  string
}

// Source is what the core starts from: the kept state, read by the caller
// (kiln's server reads its store).
type Source interface {
	Projects() ([]api.Project, error)
	// Usage is a project's GPU-seconds of ended leases since a time.
	Usage(project string, since time.Time) (float64, error)
	Nodes() ([]NodeRecord, error)
	Devices(node string) (map[string]DeviceState, error)
	// Leases are the leases in the states given, jobs likewise.
	Leases(states ...string) ([]*api.Lease, error)
	Jobs(states ...string) ([]*api.Job, error)
}

// Core is the lease service's state. Its methods are not safe for
// concurrent use: the caller holds one lock around each call and the
// writing of the changes it returns; only a Node's Touch, LastSeen, Idle
// and Wake may be called without it.
type Core struct {
	cfg       Config
	projects  map[string]*projState
	nodes     map[string]*Node
	nodeCache []*Node
	// viewList is the views of the ready nodes, by node id (viewPos: a
	// node's place in it); redrawn are the nodes whose view is out of date.
	// Callers must not change the list.
	viewList []*placement.NodeView
	viewPos  map[*Node]int
	redrawn  []*Node
	leases   map[string]*leaseState // live leases and lost ones still holding devices
	queued   map[string]*leaseState // the queued ones among them
	holding  map[string]*leaseState // lost leases still holding devices
	empty    []*placement.NodeView  // every node as if idle, for refusals
	refusals map[string]string      // the refusal of each request shape while empty stays
	jobs     map[string]*jobState   // live jobs
	seq      int64
	// started anchors the fair-share sums; length is the typical lease
	// length in seconds, learnt from lengthN ended leases (fairshare.go).
	started  time.Time
	length   float64
	lengthN  int
	heads    []string               // leases holding backfill reservations, one per project at most
	reserved []unitRef              // devices reserved for heads
	claiming map[string]*leaseState // leases that claimed devices of preempted ones
	order    []string               // queued leases in grant order, from the last pass
	est      map[string]time.Time
	estAt    time.Time
}

// New returns an empty core that starts at the time given.
func New(cfg Config, now time.Time) *Core {
	cfg.Defaults()
	return &Core{cfg: cfg, started: now,
		projects: map[string]*projState{}, nodes: map[string]*Node{},
		leases: map[string]*leaseState{}, queued: map[string]*leaseState{}, holding: map[string]*leaseState{}, jobs: map[string]*jobState{},
		claiming: map[string]*leaseState{}}
}

type projState struct {
	p        api.Project
	held     float64 // GPU equivalents held now
	startSum float64 // sum of need x grant time (Server.rel) of the leases held
	recent   float64 // decayed GPU-seconds of ended leases
	recentAt time.Time
	period   time.Time // start of the quota period
	used     float64   // GPU-seconds of leases ended in the period
}

// holding is what one lease holds of a device.
type holding struct {
	milli int
	mem   uint64
}

type unitState struct {
	dev         api.Device
	holders     map[string]holding // lease id -> what it holds; nil while none
	usedMilli   int
	usedMem     uint64
	reservedFor string
	reservedTil time.Time
	claimedBy   string
}

// Node is a node of the lease service: its record, its devices and what
// leases hold of them, the jobs it runs and the stop orders it has.
type Node struct {
	rec   NodeRecord
	units []*unitState
	byID  map[string]*unitState
	// seen is when the agent last called (unix nanoseconds); idle is true
	// while the server has nothing for the node (no task, no stop order, no
	// lost lease holding its devices), so a heartbeat that runs nothing
	// needs no lock. poke clears it.
	seen  atomic.Int64
	idle  atomic.Bool
	stops map[string]api.StopOrder // job id -> order, resent until the task ends
	tasks map[string]*jobState     // live jobs with a task here
	view  *placement.NodeView
	dirty bool
}

type leaseState struct {
	l      *api.Lease
	seq    int64
	need   float64
	req    placement.Request
	jobs   []*jobState
	claims []unitRef
	// final is the state the lease takes when its jobs have stopped.
	final string
	// heldNodes are the nodes where a lost lease still holds devices.
	heldNodes map[string]bool
	// checkFit is set on a new lease until it is known whether it could
	// ever fit (asked the first time it cannot be placed at once).
	checkFit bool
	// badPick: a node reported a pick of devices the lease was not
	// offered (said once in its events).
	badPick bool
	// serve is a serving lease's engine restarts.
	serve serveState
}

type unitRef struct{ node, unit string }

type jobState struct {
	j     *api.Job
	lease *leaseState
}

// Load fills an empty core from the kept state, at now.
func (s *Core) Load(now time.Time, src Source) error {
	projs, err := src.Projects()
	if err != nil {
		return err
	}
	for _, p := range projs {
		ps := &projState{p: p, recentAt: now}
		ps.period = periodStart(now, p.PeriodSeconds)
		if ps.used, err = src.Usage(p.Name, ps.period); err != nil {
			return err
		}
		s.projects[p.Name] = ps
	}
	recs, err := src.Nodes()
	if err != nil {
		return err
	}
	for _, r := range recs {
		drains, err := src.Devices(r.Node.ID)
		if err != nil {
			return err
		}
		n := s.newNode(r, drains)
		// A restarted server gives every node a full timeout to come back
		// before calling it lost.
		n.Touch(now)
		s.nodes[r.Node.ID] = n
	}
	live, err := src.Leases(api.LeaseQueued, api.LeaseGranted, api.LeaseStopping, api.LeaseLost)
	if err != nil {
		return err
	}
	sort.Slice(live, func(i, j int) bool {
		if !live[i].CreatedAt.Equal(live[j].CreatedAt) {
			return live[i].CreatedAt.Before(live[j].CreatedAt)
		}
		return live[i].ID < live[j].ID
	})
	for _, l := range live {
		if l.State == api.LeaseLost && !l.Holding {
			continue
		}
		ls := s.newLeaseState(l)
		s.leases[l.ID] = ls
		if l.State == api.LeaseQueued {
			s.queued[l.ID] = ls
		}
		for _, a := range l.Allocations {
			if l.State == api.LeaseQueued {
				break
			}
			n := s.nodes[a.Node]
			if n == nil {
				continue
			}
			for _, g := range a.Devices {
				if u := n.byID[g.ID]; u != nil {
					u.hold(l.ID, g.MilliGPU, g.MemoryBytes)
				}
			}
			s.redraw(n)
		}
		if l.State == api.LeaseGranted || l.State == api.LeaseStopping {
			if ps := s.projects[l.Project]; ps != nil && l.GrantedAt != nil {
				s.heldSince(ps, ls, *l.GrantedAt)
			}
		}
		if l.State == api.LeaseStopping {
			ls.final = finalFromReason(l)
		}
		if l.State == api.LeaseLost {
			ls.heldNodes = map[string]bool{}
			for _, a := range l.Allocations {
				ls.heldNodes[a.Node] = true
			}
			s.holding[l.ID] = ls
		}
	}
	jobs, err := src.Jobs(api.JobPending, api.JobAssigned, api.JobRunning)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		ls := s.leases[j.LeaseID]
		if ls == nil {
			continue
		}
		js := &jobState{j: j, lease: ls}
		ls.jobs = append(ls.jobs, js)
		s.jobs[j.ID] = js
		for _, t := range j.Tasks {
			if n := s.nodes[t.Node]; n != nil && !api.JobFinal(t.State) {
				n.addTask(j.ID, js)
			}
		}
		if ls.l.State == api.LeaseStopping {
			s.orderStop(js, ls.l.StopDeadline.Sub(now), ls.l.Reason)
		}
	}
	return nil
}

// finalFromReason recovers what a stopping lease will become.
func finalFromReason(l *api.Lease) string {
	switch {
	case len(l.Reason) >= 9 && l.Reason[:9] == "preempted":
		return api.LeasePreempted
	case len(l.Reason) >= 7 && l.Reason[:7] == "expired":
		return api.LeaseExpired
	}
	return api.LeaseDone
}

func periodStart(now time.Time, seconds int) time.Time {
	if seconds <= 0 {
		seconds = 30 * 24 * 3600
	}
	p := int64(seconds)
	return time.Unix(now.Unix()/p*p, 0).UTC()
}

func (s *Core) newNode(r NodeRecord, drains map[string]DeviceState) *Node {
	devs := placement.Devices(r.Snapshot, s.cfg.KB)
	n := &Node{rec: r, byID: make(map[string]*unitState, len(devs)), dirty: true}
	for _, d := range devs {
		if st, ok := drains[d.ID]; ok && st.Drained {
			d.Drained, d.DrainReason = true, st.Reason
		}
		u := &unitState{dev: d}
		n.units = append(n.units, u)
		n.byID[d.ID] = u
	}
	return n
}

func (s *Core) newLeaseState(l *api.Lease) *leaseState {
	s.seq++
	ls := &leaseState{l: l, seq: s.seq, req: RequestOf(l.Request)}
	ls.need = NeedOf(l.Request)
	return ls
}

// RequestOf turns a lease request into what placement needs.
func RequestOf(r api.LeaseRequest) placement.Request {
	req := placement.Request{GPUs: r.GPUs, MIG: r.MIG, MemoryBytes: r.MemoryBytes, Constraints: r.Constraints}
	if r.Fraction > 0 {
		m := int(r.Fraction*1000 + 0.5)
		req.MilliGPU = min(max(m, 1), 999)
	}
	return req
}

// NeedOf is a request's size in GPU equivalents.
func NeedOf(r api.LeaseRequest) float64 {
	switch {
	case r.GPUs > 0:
		return float64(r.GPUs)
	case r.Fraction > 0:
		return float64(RequestOf(r).MilliGPU) / 1000
	case r.MIG != "":
		return float64(placement.MIGMilli(r.MIG)) / 1000
	}
	return 0
}

func (u *unitState) hold(lease string, milli int, mem uint64) {
	if _, ok := u.holders[lease]; ok {
		return
	}
	if u.holders == nil {
		// Most devices of a large fleet are free: their map is made when
		// first held, which keeps the collector's work per node small.
		u.holders = map[string]holding{}
	}
	u.holders[lease] = holding{milli, mem}
	u.usedMilli += milli
	u.usedMem += mem
}

func (u *unitState) free(lease string) bool {
	h, ok := u.holders[lease]
	if !ok {
		return false
	}
	u.usedMilli -= h.milli
	u.usedMem -= h.mem
	delete(u.holders, lease)
	return true
}

// addTask records a live job with a task on the node; the map is made when
// first needed (most nodes of a large fleet run nothing).
func (n *Node) addTask(id string, js *jobState) {
	if n.tasks == nil {
		n.tasks = map[string]*jobState{}
	}
	n.tasks[id] = js
}

// addStop records a stop order the node's agent is sent until the task ends.
func (n *Node) addStop(id string, o api.StopOrder) {
	if n.stops == nil {
		n.stops = map[string]api.StopOrder{}
	}
	n.stops[id] = o
}

// touch records a call of the node's agent.
func (n *Node) Touch(t time.Time) { n.seen.Store(t.UnixNano()) }

// lastSeen is when the node's agent last called.
func (n *Node) LastSeen() time.Time { return time.Unix(0, n.seen.Load()) }

// poke tells the runner the node has something new to do.
func (s *Core) poke(n *Node) {
	n.idle.Store(false)
	s.cfg.Runner.Wake(n.rec.Node.ID)
}

// Record is what is kept of the node.
func (n *Node) Record() NodeRecord { return n.rec }

// ID is the node's name.
func (n *Node) ID() string { return n.rec.Node.ID }

// Idle reports whether the core has nothing for the node: no task, no
// stop order, no lost lease holding its devices. Safe without the lock.
func (n *Node) Idle() bool { return n.idle.Load() }

// NodeList is every node, in id order; callers must not change it.
func (s *Core) NodeList() []*Node { return s.nodeList() }

// Node is the node of that id, or nil.
func (s *Core) Node(id string) *Node { return s.nodes[id] }
