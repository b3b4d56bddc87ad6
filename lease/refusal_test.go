package lease

import (
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// TestRefusalKinds: every way a lease is refused says its kind, once, with
// the lease and its project; a lease that is granted or waits says none.
func TestRefusalKinds(t *testing.T) {
	w := newWorld(t, Config{}, map[string]*snapshot.Snapshot{"a": smallNode("a", 4)},
		api.Project{Name: "open"}, api.Project{Name: "small", MaxGPUs: 2})
	cases := []struct {
		project string
		req     api.LeaseRequest
		want    RefusalKind
	}{
		{"open", api.LeaseRequest{GPUs: 16}, RefusedNeverFits},
		{"small", api.LeaseRequest{GPUs: 4}, RefusedMaxGPUs},
		{"open", api.LeaseRequest{GPUs: 1, Require: []string{"own-user"}}, RefusedSandbox},
		{"open", api.LeaseRequest{GPUs: 1, Placement: api.PlacementScheduler}, RefusedNoPods},
		{"open", api.LeaseRequest{GPUs: 1}, ""}, // granted
		{"open", api.LeaseRequest{GPUs: 4}, ""}, // waits behind it
	}
	for _, tc := range cases {
		before := len(w.refused)
		id := w.submit(tc.project, tc.req)
		got := w.refused[before:]
		if tc.want == "" {
			if len(got) != 0 || w.state(id) == api.LeaseRefused {
				t.Errorf("%s %+v: refused %+v (%s)", tc.project, tc.req, got, w.lease(id).Reason)
			}
			continue
		}
		if len(got) != 1 || got[0].Kind != tc.want || got[0].Lease != id || got[0].Project != tc.project || w.state(id) != api.LeaseRefused {
			t.Errorf("%s %+v: refusals %+v, state %s (%s); want one of kind %s", tc.project, tc.req, got, w.state(id), w.lease(id).Reason, tc.want)
		}
	}

	// A project past its GPU-hours is refused as such.
	h := newWorld(t, Config{}, map[string]*snapshot.Snapshot{"a": smallNode("a", 4)}, api.Project{Name: "hours", GPUHours: 0.01})
	first := h.submit("hours", api.LeaseRequest{GPUs: 1})
	h.advance(time.Minute)
	h.cancel(first)
	before := len(h.refused)
	next := h.submit("hours", api.LeaseRequest{GPUs: 1})
	if got := h.refused[before:]; len(got) != 1 || got[0].Kind != RefusedGPUHours {
		t.Errorf("after its GPU-hours: refusals %+v, state %s (%s); want project-gpu-hours", got, h.state(next), h.lease(next).Reason)
	}
}
