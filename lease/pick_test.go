package lease

import (
	"slices"
	"strings"
	"testing"

	"kiln.dev/kiln/api"
)

// kubeWorld has nodes of 4 GPUs whose jobs run as Pods (executor
// KubernetesExecutor) or in containerd, by name (default: k1 Pods, p1
// containerd).
func kubeWorld(t *testing.T, nodes ...string) *world {
	t.Helper()
	if nodes == nil {
		nodes = []string{"k1", KubernetesExecutor, "p1", "containerd"}
	}
	w := &world{t: t, c: New(Config{}, t0), now: t0, kept: map[string]*api.Lease{}, running: map[string]map[string]bool{}}
	w.c.AddProject(t0, api.Project{Name: "a", Weight: 1})
	for i := 0; i+1 < len(nodes); i += 2 {
		id, containers := nodes[i], nodes[i+1]
		_, b := w.c.Join(w.now, id, "cert-"+id, "key-"+id)
		w.keep(b)
		_, b, err := w.c.Register(w.now, id, api.RegisterRequest{Snapshot: smallNode(id, 4), Executor: containers, Containers: containers}, "")
		if err != nil {
			t.Fatal(err)
		}
		w.keep(b)
		w.running[id] = map[string]bool{}
	}
	return w
}

func imageJob() *api.JobSpec { return &api.JobSpec{Image: "registry.lab/train:1"} }

func deviceIDs(l *api.Lease) []string {
	var out []string
	for _, a := range l.Allocations {
		for _, d := range a.Devices {
			out = append(out, a.Node+":"+d.ID)
		}
	}
	return out
}

// TestSchedulerPicks: a lease with placement scheduler goes to a node of
// the Kubernetes backend, is offered every free device there that meets
// its constraints, and keeps only those the node reports picked; the
// others go back to the queue at once.
func TestSchedulerPicks(t *testing.T) {
	w := kubeWorld(t)
	first := w.submit("a", api.LeaseRequest{GPUs: 1, Job: imageJob(), Constraints: api.Constraints{Nodes: []string{"k1"}}})
	if got := deviceIDs(w.lease(first)); !slices.Equal(got, []string{"k1:gpu0"}) {
		t.Fatalf("kiln placed the first lease on %v, want k1:gpu0", got)
	}
	picked := w.submit("a", api.LeaseRequest{GPUs: 2, Job: imageJob(), Placement: api.PlacementScheduler})
	l := w.lease(picked)
	if l.State != api.LeaseGranted {
		t.Fatalf("lease %s: %s (%s), want granted", picked, l.State, l.Reason)
	}
	if got := deviceIDs(l); !slices.Equal(got, []string{"k1:gpu1", "k1:gpu2", "k1:gpu3"}) || l.Allocations[0].Choose != 2 {
		t.Fatalf("offered %v to pick %d, want k1's three free GPUs to pick 2", got, l.Allocations[0].Choose)
	}
	if l.GPUs != 2 {
		t.Errorf("the lease counts %g GPUs, want 2 (what it asked for)", l.GPUs)
	}
	// While the scheduler picks, the offered devices are held.
	waiting := w.submit("a", api.LeaseRequest{GPUs: 1, Job: imageJob(), Constraints: api.Constraints{Nodes: []string{"k1"}}})
	if w.state(waiting) != api.LeaseQueued {
		t.Fatalf("a lease for k1 is %s while k1's free GPUs are offered, want queued", w.state(waiting))
	}
	job := l.Jobs[0]
	reply, _, b := w.c.Heartbeat(w.now, "k1", api.Heartbeat{Running: []string{first}})
	w.keep(b)
	var as *api.Assignment
	for i := range reply.Start {
		if reply.Start[i].JobID == job {
			as = &reply.Start[i]
		}
	}
	if as == nil || as.Choose != 2 || len(as.Devices) != 3 {
		t.Fatalf("the agent is told %+v, want the job with 3 devices to pick 2 of", as)
	}
	running := []string{w.lease(first).Jobs[0], job}
	// A pick of a device not offered, or of the wrong number, changes
	// nothing (and is said once).
	for _, bad := range [][]string{{"gpu0", "gpu1"}, {"gpu1"}, {"gpu1", "gpu1"}} {
		_, _, b := w.c.Heartbeat(w.now, "k1", api.Heartbeat{Running: running, Chosen: map[string][]string{job: bad}})
		w.keep(b)
		if got := deviceIDs(w.c.Lease(picked)); len(got) != 3 {
			t.Fatalf("after a bad pick %v the lease holds %v, want all 3 offered", bad, got)
		}
	}
	said := 0
	for _, e := range w.events {
		if e.Kind == "lease.placement" && e.Subject == picked {
			said++
		}
	}
	if said != 1 {
		t.Errorf("bad picks said %d times in the events, want once", said)
	}
	_, _, b = w.c.Heartbeat(w.now, "k1", api.Heartbeat{Running: running, Chosen: map[string][]string{job: {"gpu3", "gpu1"}}})
	w.keep(b)
	l = w.lease(picked)
	if got := deviceIDs(l); !slices.Equal(got, []string{"k1:gpu1", "k1:gpu3"}) || l.Allocations[0].Choose != 0 {
		t.Fatalf("after the pick the lease holds %v (choose %d), want k1:gpu1, k1:gpu3", got, l.Allocations[0].Choose)
	}
	if got := deviceIDs(w.lease(waiting)); w.state(waiting) != api.LeaseGranted || !slices.Equal(got, []string{"k1:gpu2"}) {
		t.Fatalf("the waiting lease is %s on %v, want granted the GPU given back (k1:gpu2)", w.state(waiting), got)
	}
	// Reported again (agents send it while the job runs): nothing more.
	_, _, b = w.c.Heartbeat(w.now, "k1", api.Heartbeat{Running: running, Chosen: map[string][]string{job: {"gpu3", "gpu1"}}})
	if len(b.Leases) != 0 {
		t.Errorf("a second report changed %d leases", len(b.Leases))
	}
}

// TestSchedulerPlacementNeedsPods: without a node whose jobs run as Pods,
// a lease with placement scheduler is refused with that reason, and one
// kiln places is granted.
func TestSchedulerPlacementNeedsPods(t *testing.T) {
	w := kubeWorld(t, "p1", "containerd")
	id := w.submit("a", api.LeaseRequest{GPUs: 1, Job: imageJob(), Placement: api.PlacementScheduler})
	if l := w.lease(id); l.State != api.LeaseRefused || !strings.Contains(l.Reason, "no node runs its jobs as Pods") {
		t.Fatalf("lease %s (%s), want refused: no node runs its jobs as Pods", l.State, l.Reason)
	}
	if id := w.submit("a", api.LeaseRequest{GPUs: 1, Job: imageJob(), Placement: api.PlacementKiln}); w.state(id) != api.LeaseGranted {
		t.Fatalf("a lease kiln places is %s, want granted", w.state(id))
	}
	// Asked for nodes that are not of the Kubernetes backend: refused too.
	w = kubeWorld(t)
	id = w.submit("a", api.LeaseRequest{GPUs: 1, Job: imageJob(), Placement: api.PlacementScheduler, Constraints: api.Constraints{Nodes: []string{"p1"}}})
	if l := w.lease(id); l.State != api.LeaseRefused || !strings.Contains(l.Reason, "runs its jobs as Pods") {
		t.Fatalf("lease for p1 %s (%s), want refused", l.State, l.Reason)
	}
}

// TestSchedulerNoChoiceLeft: when the node has no other free device that
// meets the constraints, the lease is pinned as kiln placed it (Choose 0).
func TestSchedulerNoChoiceLeft(t *testing.T) {
	w := kubeWorld(t, "k1", KubernetesExecutor)
	id := w.submit("a", api.LeaseRequest{GPUs: 4, Job: imageJob(), Placement: api.PlacementScheduler})
	l := w.lease(id)
	if l.State != api.LeaseGranted || len(deviceIDs(l)) != 4 || l.Allocations[0].Choose != 0 {
		t.Fatalf("lease %s on %v choose %d, want all 4 GPUs pinned", l.State, deviceIDs(l), l.Allocations[0].Choose)
	}
}
