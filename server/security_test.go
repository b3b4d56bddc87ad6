package server_test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

func TestSecurity(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	m := machines(t)
	c.addAgent("hgx", m["hgx"], nil, 300*time.Millisecond)
	c.waitNodes(1)
	c.project("vision", 1)
	c.project("speech", 1)
	ana := c.user("ana", "vision")
	bo := c.user("bo", "speech")
	ctx := context.Background()

	// Every endpoint but /healthz needs credentials.
	anon, _ := api.NewClient(c.url, "", c.srv.CAPEM(), nil)
	bad, _ := api.NewClient(c.url, "kiln_0000_nottherightsecret", c.srv.CAPEM(), nil)
	if _, err := anon.Raw(ctx, "GET", "/healthz", nil); err != nil {
		t.Errorf("/healthz without a token: %v", err)
	}
	for _, p := range []string{"GET /v1/leases", "POST /v1/leases", "GET /v1/nodes", "GET /v1/leases/l-x", "DELETE /v1/leases/l-x",
		"GET /v1/jobs/j-x/logs", "POST /v1/tokens", "GET /v1/events", "PUT /v1/agent/nodes/hgx", "POST /v1/agent/nodes/hgx/heartbeat",
		"POST /v1/nodes/hgx/drain", "GET /v1/nothing-here", "GET /v1/whoami"} {
		method, path, _ := strings.Cut(p, " ")
		for name, cl := range map[string]*api.Client{"no token": anon, "wrong token": bad} {
			_, err := cl.Raw(ctx, method, path, strings.NewReader(`{}`))
			if api.StatusOf(err) != http.StatusUnauthorized {
				t.Errorf("%s %s with %s: %v, want 401", method, path, name, err)
			}
		}
	}

	// Members see and cancel only their projects' leases.
	var l api.Lease
	if err := ana.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "vision", GPUs: 1}, &l); err != nil {
		t.Fatal(err)
	}
	if err := bo.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "vision", GPUs: 1}, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("bo leasing for vision: %v, want 403", err)
	}
	if err := bo.Do(ctx, "GET", "/v1/leases/"+l.ID, nil, nil); api.StatusOf(err) != http.StatusNotFound {
		t.Errorf("bo reading ana's lease: %v, want 404", err)
	}
	if err := bo.Do(ctx, "DELETE", "/v1/leases/"+l.ID, nil, nil); api.StatusOf(err) != http.StatusNotFound {
		t.Errorf("bo cancelling ana's lease: %v, want 404", err)
	}
	var list api.LeaseList
	if err := bo.Do(ctx, "GET", "/v1/leases?all=1", nil, &list); err != nil || len(list.Leases) != 0 {
		t.Errorf("bo sees %d leases (%v), want none", len(list.Leases), err)
	}
	if err := ana.Do(ctx, "GET", "/v1/leases/"+l.ID, nil, &l); err != nil || l.State != api.LeaseGranted {
		t.Errorf("ana's lease after bo's tries: %s %v", l.State, err)
	}
	if err := bo.Do(ctx, "POST", "/v1/nodes/hgx/drain", api.DrainRequest{}, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("member draining: %v, want 403", err)
	}
	if err := bo.Do(ctx, "POST", "/v1/tokens", api.TokenRequest{User: "ana"}, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("bo making a token for ana: %v, want 403", err)
	}

	// An agent cannot act for another node, nor as a user.
	id, err := agent.Join(ctx, c.url, c.srv.Bootstrap.JoinToken, c.srv.CAFingerprint(), "rogue", filepath.Join(t.TempDir(), "rogue"))
	if err != nil {
		t.Fatal(err)
	}
	rogue, _ := id.Client()
	if err := rogue.Do(ctx, "POST", "/v1/agent/nodes/hgx/heartbeat", api.Heartbeat{}, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("agent rogue heartbeating for hgx: %v, want 403", err)
	}
	if err := rogue.Do(ctx, "POST", "/v1/agent/nodes/hgx/jobs/"+l.ID+"/exit", api.ExitReport{}, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("agent rogue reporting for hgx: %v, want 403", err)
	}
	if err := rogue.Do(ctx, "GET", "/v1/leases", nil, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("agent listing leases: %v, want 403", err)
	}
	// Nor take a live node's name by joining again.
	if _, err := agent.Join(ctx, c.url, c.srv.Bootstrap.JoinToken, c.srv.CAFingerprint(), "hgx", filepath.Join(t.TempDir(), "x")); api.StatusOf(err) != http.StatusConflict {
		t.Errorf("joining as live node hgx: %v, want 409", err)
	}
	// A wrong CA pin is refused before anything is sent.
	if _, err := agent.Join(ctx, c.url, c.srv.Bootstrap.JoinToken, strings.Repeat("ab", 32), "pinned", t.TempDir()); err == nil || !strings.Contains(err.Error(), "pinned") {
		t.Errorf("join with a wrong CA fingerprint: %v", err)
	}

	// Malformed and oversized requests: 4xx with a message, nothing changes.
	before := countLeases(t, c.admin)
	for _, body := range []string{`{`, `[]`, `{"gpus":1,"nope":1}`, `{"gpus":0}`, `{"gpus":1,"fraction":0.5}`, `{"fraction":2}`,
		`{"gpus":1}{"gpus":1}`, `{"gpus":1,"priority":99999}`, `{"gpus":1,"job":{"env":{"A B":"x"},"command":["x"]}}`,
		`{"project":"../etc","gpus":1}`, `{"gpus":1,"constraints":{"min_cuda":"twelve"}}`} {
		resp, err := c.admin.Raw(ctx, "POST", "/v1/leases", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
		if s := api.StatusOf(err); s != http.StatusBadRequest || err.Error() == "" {
			t.Errorf("POST /v1/leases %s: %v (status %d), want 400 with a message", body, err, s)
		}
	}
	huge := bytes.Repeat([]byte("a"), 2<<20)
	big := append(append([]byte(`{"gpus":1,"name":"`), huge...), '"', '}')
	if _, err := c.admin.Raw(ctx, "POST", "/v1/leases", bytes.NewReader(big)); api.StatusOf(err) != http.StatusRequestEntityTooLarge {
		t.Errorf("2 MiB lease request: %v, want 413", err)
	}
	if after := countLeases(t, c.admin); after != before {
		t.Errorf("bad requests changed the leases: %d before, %d after", before, after)
	}
}

func countLeases(t *testing.T, c *api.Client) int {
	var list api.LeaseList
	if err := c.Do(context.Background(), "GET", "/v1/leases?all=1", nil, &list); err != nil {
		t.Fatal(err)
	}
	return len(list.Leases)
}
