package lease

import (
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
)

// A deployment's name routes the project's requests: another member of
// the project cannot take a name one serves (they would get its users'
// prompts); the same user's deployments of one name are replicas, another
// project may use the name, and a name is free again once its lease ends.
func TestServeNames(t *testing.T) {
	w := newWorld(t, Config{}, one(4), api.Project{Name: "p"}, api.Project{Name: "q"})
	serve := func(project, user string) (*api.Lease, error) {
		r := gpus(1)
		r.Project = project
		r.Job = &api.JobSpec{Command: []string{"engine"}, Ports: []int{8000}}
		r.Serve = &api.ServeSpec{Model: "llama-3", Port: 8000, Ready: "/health"}
		l, b, err := w.c.Submit(w.now, Submit{Request: r, User: user, Projects: []string{project}, Member: func(string) bool { return true }})
		if err == nil {
			w.keep(b)
		}
		return l, err
	}
	first, err := serve("p", "ann")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serve("p", "ann"); err != nil {
		t.Errorf("a replica of ann's own deployment: %v", err)
	}
	_, err = serve("p", "bob")
	if KindOf(err) != Conflict || !strings.Contains(err.Error(), "already serves llama-3") || !strings.Contains(err.Error(), "--name") {
		t.Errorf("bob taking ann's name in p: %v", err)
	}
	if _, err := serve("q", "bob"); err != nil {
		t.Errorf("the name in another project: %v", err)
	}
	for _, l := range w.c.Leases(w.now, func(l *api.Lease) bool { return l.Project == "p" }) {
		w.cancel(l.ID)
	}
	w.advance(w.c.cfg.PreemptGrace * 2)
	if w.c.Lease(first.ID) != nil {
		t.Logf("lease %s still live: %s", first.ID, w.c.Lease(first.ID).State)
	}
	if _, err := serve("p", "bob"); err != nil {
		t.Errorf("the name once ann's leases ended: %v", err)
	}
}

// serveLease submits a deployment of one GPU whose engine is "engine".
func (w *world) serveLease(p string) string {
	w.t.Helper()
	r := gpus(1)
	r.Job = &api.JobSpec{Command: []string{"engine", "--port", "8000"}, Ports: []int{8000}}
	r.Serve = &api.ServeSpec{Model: "m", Port: 8000, Ready: "/health"}
	return w.submit(p, r)
}

// crash makes the agent report the lease's running engine ended with code.
func (w *world) crash(id string, code int) string {
	w.t.Helper()
	l := w.c.Lease(id)
	for node, run := range w.running {
		for _, job := range l.Jobs {
			if run[job] {
				delete(run, job)
				_, b := w.c.JobExit(w.now, node, job, api.ExitReport{Code: code, Reason: "exited"})
				w.keep(b)
				return job
			}
		}
	}
	w.t.Fatalf("lease %s runs no job", id)
	return ""
}

// runningJob is the job of the lease the agent runs now ("" when none).
func (w *world) runningJob(id string) string {
	for _, run := range w.running {
		for _, job := range w.lease(id).Jobs {
			if run[job] {
				return job
			}
		}
	}
	return ""
}

// A deployment's engine that ends while its lease is granted is started
// again after a backoff that doubles with each quick failure in a row
// (1 s, 2 s, 4 s, ...); one that ran long enough counts from one again; ten
// quick failures in a row end the lease with the reason; a lease being
// stopped is not restarted; an ordinary lease still ends with its job.
func TestEngineRestarts(t *testing.T) {
	w := newWorld(t, Config{}, one(2), api.Project{Name: "p"})
	id := w.serveLease("p")
	w.beat()
	first := w.runningJob(id)
	if first == "" || w.state(id) != api.LeaseGranted {
		t.Fatalf("the engine does not run: %s", w.state(id))
	}
	// It runs for an hour, then crashes: started again after 1 s.
	w.advance(time.Hour)
	w.crash(id, 1)
	if w.state(id) != api.LeaseGranted {
		t.Fatalf("the lease ended with its engine: %s (%s)", w.state(id), w.lease(id).Reason)
	}
	w.now = w.now.Add(500 * time.Millisecond)
	w.keep(w.c.Tick(w.now))
	w.beat()
	if j := w.runningJob(id); j != "" {
		t.Fatalf("started again before its backoff: %s", j)
	}
	w.now = w.now.Add(600 * time.Millisecond)
	w.keep(w.c.Tick(w.now))
	w.beat()
	second := w.runningJob(id)
	if second == "" || second == first {
		t.Fatalf("not started again after 1 s: %q", second)
	}
	if spec := w.c.Job(second).Spec; spec.Command[0] != "engine" || spec.Ports[0] != 8000 {
		t.Errorf("the new job's spec: %+v", spec)
	}
	restart := func() time.Duration {
		w.crash(id, 1)
		start := w.now
		for w.runningJob(id) == "" {
			w.now = w.now.Add(250 * time.Millisecond)
			w.keep(w.c.Tick(w.now))
			w.beat()
			if w.now.Sub(start) > time.Hour {
				t.Fatal("never started again")
			}
		}
		return w.now.Sub(start)
	}
	// A quick failure waits 2 s; after a run longer than engineSettled the
	// next failure counts as the first again.
	if d := restart(); d < 2*time.Second || d > 3*time.Second {
		t.Errorf("the second failure in a row waited %s, want 2 s", d)
	}
	w.advance(engineSettled + time.Minute)
	if d := restart(); d < time.Second || d > 2*time.Second {
		t.Errorf("a failure after a settled run waited %s, want 1 s", d)
	}
	// Quick failures: the waits double.
	var waits []time.Duration
	for range engineMaxFailures - 2 {
		waits = append(waits, restart())
	}
	for i := 1; i < len(waits); i++ {
		want := min(engineBackoff<<(i+1), engineBackoffMax)
		if waits[i] < want || waits[i] > want+time.Second {
			t.Errorf("wait %d: %s, want %s", i, waits[i], want)
		}
	}
	t.Logf("waits: %v", waits)
	// The tenth quick failure in a row ends the lease, with why.
	w.crash(id, 3)
	w.advance(time.Minute)
	if l := w.lease(id); api.LeaseFinal(l.State) == false || !strings.Contains(l.Reason, "10 times in a row") || !strings.Contains(l.Reason, "code 3") {
		t.Errorf("after ten quick failures: %s %q", l.State, l.Reason)
	}
	restarts := 0
	for _, ev := range w.events {
		if ev.Kind == "deployment.restarted" && ev.Subject == id {
			restarts++
		}
	}
	if restarts != engineMaxFailures+1 {
		t.Errorf("%d restart events, want %d", restarts, engineMaxFailures+1)
	}

	// Stopped by its user: not started again.
	id2 := w.serveLease("p")
	w.beat()
	w.cancel(id2)
	w.advance(time.Minute)
	if st := w.state(id2); st != api.LeaseDone || w.runningJob(id2) != "" {
		t.Errorf("a deployment its user stopped: %s, running %q", st, w.runningJob(id2))
	}

	// An ordinary lease with a job still ends with it.
	r := gpus(1)
	r.Job = &api.JobSpec{Command: []string{"train"}}
	id3 := w.submit("p", r)
	w.beat()
	w.crash(id3, 1)
	if st := w.state(id3); st != api.LeaseDone {
		t.Errorf("an ordinary lease whose job ended: %s", st)
	}
}
