package lease

import (
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/placement"
	"kiln.dev/kiln/snapshot"
)

func one(n int) map[string]*snapshot.Snapshot {
	return map[string]*snapshot.Snapshot{"n1": smallNode("n1", n)}
}

func gpus(n int) api.LeaseRequest { return api.LeaseRequest{GPUs: n} }

// TestPriority: in one project's queue a higher priority goes first, and
// arrival breaks ties.
func TestPriority(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prios      []int
		wantGrants []int // which of the queued leases the freed GPU goes to
	}{
		{"higher first", []int{0, 5, 1}, []int{1}},
		{"arrival breaks ties", []int{3, 3}, []int{0}},
		{"negative last", []int{-5, 0}, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, Config{}, one(1), api.Project{Name: "p"})
			hold := w.submit("p", gpus(1))
			var ids []string
			for _, p := range tc.prios {
				r := gpus(1)
				r.Priority = p
				ids = append(ids, w.submit("p", r))
				w.advance(time.Second)
			}
			w.cancel(hold)
			for i, id := range ids {
				want := api.LeaseQueued
				for _, g := range tc.wantGrants {
					if g == i {
						want = api.LeaseGranted
					}
				}
				if got := w.state(id); got != want {
					t.Errorf("lease %d (priority %d): %s, want %s", i, tc.prios[i], got, want)
				}
			}
		})
	}
}

// TestFairShare: projects take turns by usage per weight, decayed with the
// fair-share window: the project that used less recently goes first, even
// when it asked later; usage long past counts for little.
func TestFairShare(t *testing.T) {
	for _, tc := range []struct {
		name string
		// heavy uses the GPU for used, ago before the contest starts;
		// weights of heavy and light.
		used, ago    time.Duration
		wHeavy, wLit float64
		want         string // the project that gets the freed GPU
	}{
		{"recent use waits", 2 * time.Hour, 0, 1, 1, "light"},
		{"weight buys share", 2 * time.Hour, 0, 8, 1, "heavy"},
		{"old use decays", 10 * time.Minute, 12 * time.Hour, 1, 1, "heavy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, Config{FairShareWindow: time.Hour}, one(1),
				api.Project{Name: "heavy", Weight: tc.wHeavy}, api.Project{Name: "light", Weight: tc.wLit}, api.Project{Name: "other"})
			// heavy uses the GPU, then (ago later) light uses it a
			// little less long ago than heavy's use ended, when ago > 0.
			h := w.submit("heavy", gpus(1))
			w.advance(tc.used)
			w.cancel(h)
			if tc.ago > 0 {
				w.advance(tc.ago)
				l := w.submit("light", gpus(1))
				w.advance(tc.used / 2)
				w.cancel(l)
			}
			// A third project holds the GPU while both queue; heavy asks
			// first.
			o := w.submit("other", gpus(1))
			hq := w.submit("heavy", gpus(1))
			w.advance(time.Second)
			lq := w.submit("light", gpus(1))
			w.advance(time.Second)
			w.cancel(o)
			got := ""
			if w.state(hq) == api.LeaseGranted {
				got += "heavy"
			}
			if w.state(lq) == api.LeaseGranted {
				got += "light"
			}
			if got != tc.want {
				t.Errorf("granted to %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBackfill: a lease that cannot be placed reserves the devices it
// waits for; a later lease may use them only if it ends before the
// reservation starts.
func TestBackfill(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit time.Duration
		want  string
	}{
		{"ends before the reservation", 30 * time.Minute, api.LeaseGranted},
		{"would delay the head", 3 * time.Hour, api.LeaseQueued},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, Config{}, one(2), api.Project{Name: "a"}, api.Project{Name: "b"})
			r := gpus(1)
			r.TimeLimitSeconds = 3600
			w.submit("a", r) // one GPU busy for an hour
			w.advance(time.Second)
			head := w.submit("a", gpus(2)) // waits for both
			w.advance(time.Second)
			r = gpus(1)
			r.TimeLimitSeconds = int(tc.limit / time.Second)
			late := w.submit("b", r)
			w.advance(time.Second)
			if got := w.state(head); got != api.LeaseQueued {
				t.Fatalf("head %s, want queued", got)
			}
			if got := w.state(late); got != tc.want {
				t.Errorf("the later lease of %s: %s (%s), want %s", tc.limit, got, w.lease(late).Reason, tc.want)
			}
		})
	}
}

// TestPreemption: a lease of higher priority stops preemptible leases of
// lower priority with a notice and a grace period; it gets their devices
// once their jobs stopped. Leases that are not preemptible, or of equal
// priority, are left alone.
func TestPreemption(t *testing.T) {
	for _, tc := range []struct {
		name        string
		preemptible bool
		victimPrio  int
		want        string // the victim's final state
	}{
		{"preemptible and lower", true, 0, api.LeasePreempted},
		{"not preemptible", false, 0, api.LeaseGranted},
		{"same priority", true, 10, api.LeaseGranted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grace := 30 * time.Second
			w := newWorld(t, Config{PreemptGrace: grace}, one(1), api.Project{Name: "p"})
			r := gpus(1)
			r.Preemptible, r.Priority = tc.preemptible, tc.victimPrio
			r.Job = &api.JobSpec{Command: []string{"train"}}
			v := w.submit("p", r)
			w.advance(10 * time.Second) // its job runs
			hi := gpus(1)
			hi.Priority = 10
			// The agents are slow to stop: the first beat after the
			// notice only takes the order.
			id, b, err := w.c.Submit(w.now, Submit{Request: withProject(hi, "p"), User: "u", Projects: []string{"p"}, Member: func(string) bool { return true }})
			if err != nil {
				t.Fatal(err)
			}
			w.keep(b)
			if tc.want == api.LeasePreempted {
				l := w.lease(v)
				if l.State != api.LeaseStopping || l.StopDeadline == nil || !l.StopDeadline.Equal(w.now.Add(grace)) {
					t.Fatalf("victim %s, deadline %v: want stopping with %s of grace", l.State, l.StopDeadline, grace)
				}
				if !strings.HasPrefix(l.Reason, "preempted by lease "+id.ID) {
					t.Errorf("reason %q", l.Reason)
				}
				if o := w.c.Orders("n1", keys(w.running["n1"])); len(o.Stop) != 1 {
					t.Errorf("the victim's node has %d stop orders, want 1", len(o.Stop))
				}
			}
			w.advance(10 * time.Second)
			if got := w.state(v); got != tc.want {
				t.Errorf("victim %s, want %s", got, tc.want)
			}
			wantHi := api.LeaseGranted
			if tc.want != api.LeasePreempted {
				wantHi = api.LeaseQueued
			}
			if got := w.state(id.ID); got != wantHi {
				t.Errorf("high-priority lease %s, want %s", got, wantHi)
			}
		})
	}
}

func withProject(r api.LeaseRequest, p string) api.LeaseRequest { r.Project = p; return r }

// TestExpiry: a lease ends at its time limit; its jobs get the grace first.
func TestExpiry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		job      bool
		at       time.Duration
		want     string
		wantNote string
	}{
		{"before the limit", false, 50 * time.Second, api.LeaseGranted, ""},
		{"at the limit", false, 65 * time.Second, api.LeaseExpired, "expired: its time limit of 1m0s was reached"},
		{"with a job", true, 65 * time.Second, api.LeaseExpired, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, Config{}, one(1), api.Project{Name: "p"})
			r := gpus(1)
			r.TimeLimitSeconds = 60
			if tc.job {
				r.Job = &api.JobSpec{Command: []string{"sleep"}}
			}
			id := w.submit("p", r)
			w.advance(tc.at)
			l := w.lease(id)
			if l.State != tc.want || !strings.HasPrefix(l.Reason, tc.wantNote) {
				t.Errorf("%s (%q), want %s (%q)", l.State, l.Reason, tc.want, tc.wantNote)
			}
		})
	}
}

// TestQuotas: a project's cap on GPUs held at once makes its leases wait;
// its GPU-hours per period refuse them once used.
func TestQuotas(t *testing.T) {
	t.Run("max GPUs", func(t *testing.T) {
		w := newWorld(t, Config{}, one(4), api.Project{Name: "p", MaxGPUs: 2})
		a := w.submit("p", gpus(2))
		b := w.submit("p", gpus(1))
		if w.state(a) != api.LeaseGranted || w.state(b) != api.LeaseQueued {
			t.Fatalf("%s, %s: want granted, queued", w.state(a), w.state(b))
		}
		if r := w.lease(b).Reason; r != "waiting: project p holds 2 of its 2 GPUs at once" {
			t.Errorf("reason %q", r)
		}
		big := w.submit("p", gpus(3))
		if w.state(big) != api.LeaseRefused {
			t.Errorf("3 GPUs in a project of 2: %s, want refused", w.state(big))
		}
		w.cancel(a)
		if w.state(b) != api.LeaseGranted {
			t.Errorf("after the first ended: %s, want granted", w.state(b))
		}
	})
	t.Run("GPU-hours", func(t *testing.T) {
		w := newWorld(t, Config{}, one(2), api.Project{Name: "p", GPUHours: 1, PeriodSeconds: 30 * 24 * 3600})
		a := w.submit("p", gpus(2))
		w.advance(31 * time.Minute) // 1.03 GPU-hours
		w.cancel(a)
		b := w.submit("p", gpus(1))
		if l := w.lease(b); l.State != api.LeaseRefused || !strings.Contains(l.Reason, "GPU-hours in this period") {
			t.Errorf("%s (%q), want refused for its GPU-hours", l.State, l.Reason)
		}
	})
}

// TestGangsAndNeverFits: whole GPUs beyond one node go as a gang over
// several, all at once; a lease that no node could ever hold is refused at
// once with why, not queued forever.
func TestGangsAndNeverFits(t *testing.T) {
	nodes := map[string]*snapshot.Snapshot{"h1": hgx("h1"), "h2": hgx("h2")}
	for _, tc := range []struct {
		name     string
		req      api.LeaseRequest
		want     string
		wantText string
		nodes    int
	}{
		{"gang over two nodes", api.LeaseRequest{GPUs: 12, Constraints: api.Constraints{Gang: true}}, api.LeaseGranted, "", 2},
		{"too large for one node", api.LeaseRequest{GPUs: 12}, api.LeaseRefused, "no node could ever hold it", 0},
		{"too large for the cluster", api.LeaseRequest{GPUs: 17, Constraints: api.Constraints{Gang: true}}, api.LeaseRefused, "no node could ever hold it", 0},
		{"a model no node has", api.LeaseRequest{GPUs: 1, Constraints: api.Constraints{Model: "MI300X"}}, api.LeaseRefused, "no node could ever hold it: 1 free GPUs (model MI300X)", 0},
		{"fits one node", api.LeaseRequest{GPUs: 8}, api.LeaseGranted, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, Config{}, nodes, api.Project{Name: "p"})
			id := w.submit("p", tc.req)
			l := w.lease(id)
			if l.State != tc.want || !strings.Contains(l.Reason, tc.wantText) || len(l.Allocations) != tc.nodes {
				t.Errorf("%s on %d nodes (%q), want %s on %d (%q)", l.State, len(l.Allocations), l.Reason, tc.want, tc.nodes, tc.wantText)
			}
		})
	}
}

// TestLostNode: a node silent past the heartbeat timeout is lost; its
// leases are lost and keep its devices fenced until it registers again.
func TestLostNode(t *testing.T) {
	w := newWorld(t, Config{HeartbeatTimeout: 30 * time.Second, Placer: placement.FirstFit{}}, one(1), api.Project{Name: "p"})
	r := gpus(1)
	r.Job = &api.JobSpec{Command: []string{"train"}}
	id := w.submit("p", r)
	w.advance(10 * time.Second)
	delete(w.running, "n1") // the agent falls silent
	w.now = w.now.Add(31 * time.Second)
	w.keep(w.c.Tick(w.now))
	l := w.lease(id)
	if l.State != api.LeaseLost || !l.Holding {
		t.Fatalf("%s holding %v, want lost and holding", l.State, l.Holding)
	}
	if nd, _ := w.c.NodeInfo("n1"); nd.State != api.NodeLost || nd.Free != 0 {
		t.Errorf("node %s with %g free, want lost with none", nd.State, nd.Free)
	}
	next := w.submit("p", gpus(1))
	if w.state(next) != api.LeaseQueued {
		t.Errorf("a lease while the GPU is fenced: %s, want queued", w.state(next))
	}
	if _, _, err := w.c.Cancel(w.now, id, "member", false); KindOf(err) != Conflict || !strings.Contains(err.Error(), "kiln drain --clear-lost n1") {
		t.Errorf("a member cancelling the lost lease: %v, want a conflict naming the way out", err)
	}
	if l, _, err := w.c.Cancel(w.now, id, "admin", true); err != nil || l.State != api.LeaseLost || !l.Holding {
		t.Errorf("an admin cancelling the lost lease: %v, %+v; want it left lost and holding (drain --clear-lost frees it)", err, l)
	}
}

// TestFairShareGuard: while a project below its share waits for devices,
// a project above its share may not take the ones that free up beside it.
func TestFairShareGuard(t *testing.T) {
	w := newWorld(t, Config{}, one(2), api.Project{Name: "hog"}, api.Project{Name: "poor"})
	w.submit("hog", gpus(1))
	w.advance(time.Hour)
	poor := w.submit("poor", gpus(2))
	more := w.submit("hog", gpus(1))
	if w.state(poor) != api.LeaseQueued {
		t.Fatalf("poor: %s, want queued", w.state(poor))
	}
	l := w.lease(more)
	if l.State != api.LeaseQueued || l.Reason != "waiting: its project is above its fair share while a project below it waits" {
		t.Errorf("the hog's second lease: %s (%q), want queued behind the poorer project", l.State, l.Reason)
	}
}

// TestQuotaEndsQueued: a queued lease whose project runs out of GPU-hours
// while it waits is refused, not granted.
func TestQuotaEndsQueued(t *testing.T) {
	w := newWorld(t, Config{}, one(1), api.Project{Name: "p", GPUHours: 1, PeriodSeconds: 30 * 24 * 3600})
	a := w.submit("p", gpus(1))
	b := w.submit("p", gpus(1))
	w.advance(61 * time.Minute)
	w.cancel(a)
	if l := w.lease(b); l.State != api.LeaseRefused || !strings.Contains(l.Reason, "GPU-hours in the period") {
		t.Errorf("%s (%q), want refused for its GPU-hours", l.State, l.Reason)
	}
}

// TestRefusalSaysEachReasonOnce: a reason every node shares is said once,
// without a list of nodes; different reasons name their nodes.
func TestRefusalSaysEachReasonOnce(t *testing.T) {
	nodes := map[string]*snapshot.Snapshot{}
	for _, id := range []string{"a1", "a2", "a3", "b1"} {
		nodes[id] = smallNode(id, 1)
	}
	image := func(w *world) *api.Lease {
		r := gpus(1)
		r.Job = &api.JobSpec{Image: "registry.lab/train:1"}
		return w.lease(w.submit("p", r))
	}
	w := newWorld(t, Config{}, nodes, api.Project{Name: "p"})
	for _, id := range []string{"a1", "a2", "a3", "b1"} {
		_, b, _ := w.c.Register(w.now, id, api.RegisterRequest{Snapshot: nodes[id], NoContainers: "no containerd socket at /run/containerd/containerd.sock"}, "")
		w.keep(b)
	}
	if l := image(w); l.Reason != "image registry.lab/train:1: no node runs containers: no containerd socket at /run/containerd/containerd.sock" {
		t.Errorf("one reason: %q", l.Reason)
	}
	_, b, _ := w.c.Register(w.now, "b1", api.RegisterRequest{Snapshot: nodes["b1"], NoContainers: "runc is missing"}, "")
	w.keep(b)
	if l := image(w); l.Reason != "image registry.lab/train:1: no node runs containers: a1, a2, a3: no containerd socket at /run/containerd/containerd.sock; b1: runc is missing" {
		t.Errorf("two reasons: %q", l.Reason)
	}
}

type wakes map[string]int

func (w wakes) Wake(node string) { w[node]++ }

// TestRunnerWoken: the runner is told when a node has something new to do
// (a task to start, a stop order), and only then.
func TestRunnerWoken(t *testing.T) {
	got := wakes{}
	w := newWorld(t, Config{Runner: got}, map[string]*snapshot.Snapshot{"n1": smallNode("n1", 1), "n2": smallNode("n2", 1)}, api.Project{Name: "p"})
	w.submit("p", gpus(1)) // no job: nothing to run
	if len(got) != 0 {
		t.Fatalf("woken for a lease without a job: %v", got)
	}
	r := gpus(1)
	r.Job = &api.JobSpec{Command: []string{"train"}}
	id := w.submit("p", r)
	node := w.lease(id).Allocations[0].Node
	if got[node] != 1 || len(got) != 1 {
		t.Fatalf("after a job was assigned to %s: %v", node, got)
	}
	w.advance(10 * time.Second)
	w.cancel(id)
	if got[node] != 2 {
		t.Errorf("after the lease was released: %v, want a second wake of %s for the stop order", got, node)
	}
}
