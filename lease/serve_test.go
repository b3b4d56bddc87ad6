package lease

import (
	"strings"
	"testing"

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
