package lease

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/sched/shapes"
	"kiln.dev/kiln/snapshot"
)

// world is a lease core with a fake clock, fake agents that run whatever
// they are told to start, and a fake store that keeps every change.
type world struct {
	t       *testing.T
	c       *Core
	now     time.Time
	kept    map[string]*api.Lease // every lease as last persisted
	events  []api.Event
	running map[string]map[string]bool // node -> jobs its agent runs
	refused []Refusal
}

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// smallNode is a node of n H100 GPUs without links.
func smallNode(host string, n int) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Host: snapshot.Host{Hostname: host}, Drivers: snapshot.Drivers{NVIDIAUser: "570.86.15", CUDADriver: "12.8"}}
	for i := 0; i < n; i++ {
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: i, Vendor: snapshot.VendorNVIDIA, Model: "NVIDIA H100 80GB HBM3", Architecture: "Hopper",
			ComputeCapability: "9.0", PCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x10+i), MemoryTotalBytes: 80 << 30})
	}
	return s
}

// newWorld starts a core with the nodes given and projects of weight 1.
func newWorld(t *testing.T, cfg Config, nodes map[string]*snapshot.Snapshot, projects ...api.Project) *world {
	t.Helper()
	w := &world{t: t, c: New(cfg, t0), now: t0, kept: map[string]*api.Lease{}, running: map[string]map[string]bool{}}
	for _, p := range projects {
		if p.Weight == 0 {
			p.Weight = 1
		}
		w.c.AddProject(t0, p)
	}
	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		_, b := w.c.Join(w.now, id, "cert-"+id, "key-"+id)
		w.keep(b)
		_, b, err := w.c.Register(w.now, id, api.RegisterRequest{Snapshot: nodes[id]}, "")
		if err != nil {
			t.Fatal(err)
		}
		w.keep(b)
		w.running[id] = map[string]bool{}
	}
	return w
}

func (w *world) keep(b *Changes) {
	if b == nil {
		return
	}
	for id, l := range b.Leases {
		c := *l
		w.kept[id] = &c
	}
	w.events = append(w.events, b.Events...)
	w.refused = append(w.refused, b.Refusals...)
	w.check()
}

// check holds the core's invariants after every call: the queued set is
// exactly the live leases in state queued, and no device holds more than
// all of itself.
func (w *world) check() {
	w.t.Helper()
	for id, ls := range w.c.leases {
		if (ls.l.State == api.LeaseQueued) != (w.c.queued[id] != nil) {
			w.t.Fatalf("lease %s is %s but queued set says %v", id, ls.l.State, w.c.queued[id] != nil)
		}
	}
	for id := range w.c.queued {
		if w.c.leases[id] == nil {
			w.t.Fatalf("lease %s is queued but not live", id)
		}
	}
	for _, n := range w.c.nodes {
		for _, u := range n.units {
			if u.usedMilli > 1000 || u.usedMilli < 0 {
				w.t.Fatalf("%s/%s holds %d‰", n.ID(), u.dev.ID, u.usedMilli)
			}
		}
	}
}

// submit asks for a lease as user u of project p.
func (w *world) submit(p string, r api.LeaseRequest) string {
	w.t.Helper()
	r.Project = p
	l, b, err := w.c.Submit(w.now, Submit{Request: r, User: "u-" + p, Projects: []string{p}, Member: func(string) bool { return true }})
	if err != nil {
		w.t.Fatalf("submit %+v: %v", r, err)
	}
	w.keep(b)
	return l.ID
}

// beat runs one heartbeat of every node: the agents start what they are
// told to and stop what they are told to, reporting each stop's exit.
func (w *world) beat() {
	ids := make([]string, 0, len(w.running))
	for id := range w.running {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		run := w.running[id]
		reply, _, b := w.c.Heartbeat(w.now, id, api.Heartbeat{Running: keys(run)})
		w.keep(b)
		for _, a := range reply.Start {
			run[a.JobID] = true
		}
		for _, o := range reply.Stop {
			if run[o.JobID] {
				delete(run, o.JobID)
				_, b := w.c.JobExit(w.now, id, o.JobID, api.ExitReport{Code: 143, Reason: o.Reason})
				w.keep(b)
			}
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// advance moves the clock, the agents beating every few seconds.
func (w *world) advance(d time.Duration) {
	end := w.now.Add(d)
	for w.now.Before(end) {
		w.now = minTime(w.now.Add(5*time.Second), end)
		w.beat()
		w.keep(w.c.Tick(w.now))
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// lease is a lease as last persisted.
func (w *world) lease(id string) *api.Lease {
	w.t.Helper()
	l := w.kept[id]
	if l == nil {
		w.t.Fatalf("lease %s was never persisted", id)
	}
	return l
}

func (w *world) state(id string) string { return w.lease(id).State }

func (w *world) cancel(id string) {
	w.t.Helper()
	_, b, err := w.c.Cancel(w.now, id, "u", false)
	if err != nil {
		w.t.Fatalf("cancel %s: %v", id, err)
	}
	w.keep(b)
}

// hgx is an 8-GPU NVSwitch node.
func hgx(host string) *snapshot.Snapshot { return shapes.NVSwitch8(host) }
