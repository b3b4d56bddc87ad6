package api_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// realServer starts a kiln server on loopback and returns a client of its
// admin.
func realServer(t *testing.T) *api.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{DataDir: t.TempDir(), URL: "https://" + ln.Addr().String(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	srv, err := server.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	c, err := api.NewClient(cfg.URL, srv.Bootstrap.AdminToken, srv.CAPEM(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.HTTP.CloseIdleConnections()
		cancel()
		<-done
		srv.Close()
	})
	return c
}

// TestHostileIDsAtTheServer: the server reads a hostile id back as the id
// it is, and answers that it has no such thing, in its own words.
func TestHostileIDsAtTheServer(t *testing.T) {
	c := realServer(t)
	ctx := context.Background()
	for _, id := range []string{"../admin", "x?y=1", "..", ".", "%2e%2e", "a/b#c"} {
		for _, q := range []struct {
			what, want string
			call       func() error
		}{
			{"GetLease", "lease " + id + " not found", func() error { _, err := c.GetLease(ctx, id, api.LeaseWait{}); return err }},
			{"CancelLease", "lease " + id + " not found", func() error { _, err := c.CancelLease(ctx, id); return err }},
			{"GetJob", "job " + id + " not found", func() error { _, err := c.GetJob(ctx, id); return err }},
			{"JobLogs", "job " + id + " not found", func() error { _, err := c.JobLogs(ctx, id, false); return err }},
			{"Node", "node " + id + " not found", func() error { _, err := c.Node(ctx, id); return err }},
			{"DeleteToken", "token " + id + " not found", func() error { return c.DeleteToken(ctx, id) }},
			{"DeleteUser", "user " + id + " not found", func() error { return c.DeleteUser(ctx, id) }},
			{"RevokeJoinToken", "join token " + id + " not found (or revoked already)", func() error { return c.RevokeJoinToken(ctx, id) }},
		} {
			err := q.call()
			var e *api.Error
			if !errors.As(err, &e) || e.Status != 404 || e.Message != q.want {
				t.Errorf("%s(%q): %v, want 404 %q", q.what, id, err, q.want)
			}
		}
	}
}

// TestTypedClientAtTheServer: a few of the methods against the real
// server, answers decoded.
func TestTypedClientAtTheServer(t *testing.T) {
	c := realServer(t)
	ctx := context.Background()
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	who, err := c.WhoAmI(ctx)
	if err != nil || who.Role != api.RoleAdmin {
		t.Fatalf("WhoAmI: %+v, %v", who, err)
	}
	p, err := c.PutProject(ctx, api.Project{Name: "vision", Weight: 2})
	if err != nil || p.Name != "vision" || p.Weight != 2 {
		t.Fatalf("PutProject: %+v, %v", p, err)
	}
	tok, err := c.CreateToken(ctx, api.TokenRequest{User: "ana", Projects: []string{"vision"}})
	if err != nil || tok.User != "ana" || tok.Secret == "" {
		t.Fatalf("CreateToken: %+v, %v", tok, err)
	}
	toks, err := c.Tokens(ctx)
	if err != nil || len(toks) != 2 {
		t.Fatalf("Tokens: %+v, %v", toks, err)
	}
	if err := c.DeleteToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	users, err := c.Users(ctx)
	if err != nil || len(users) != 2 {
		t.Fatalf("Users: %+v, %v", users, err)
	}
	jt, err := c.CreateJoinToken(ctx, api.JoinTokenRequest{Uses: 2})
	if err != nil || jt.Uses != 2 || jt.Command == "" {
		t.Fatalf("CreateJoinToken: %+v, %v", jt, err)
	}
	if err := c.RevokeJoinToken(ctx, jt.ID); err != nil {
		t.Fatal(err)
	}
	jts, err := c.JoinTokens(ctx)
	if err != nil || len(jts) == 0 {
		t.Fatalf("JoinTokens: %+v, %v", jts, err)
	}
	// No node has joined: the lease can never be granted.
	l, err := c.CreateLease(ctx, api.LeaseRequest{Project: "vision", GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.GetLease(ctx, l.ID, api.LeaseWait{Since: api.LeaseVersion(l), For: 100 * time.Millisecond})
	if err != nil || got.ID != l.ID {
		t.Fatalf("GetLease: %+v, %v", got, err)
	}
	leases, err := c.ListLeases(ctx, api.LeaseFilter{All: true, Project: "vision"})
	if err != nil || len(leases) != 1 || leases[0].ID != l.ID {
		t.Fatalf("ListLeases: %+v, %v", leases, err)
	}
	if _, err := c.CancelLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 0 {
		t.Fatalf("Nodes: %+v, %v", nodes, err)
	}
	evs, err := c.Events(ctx, api.EventFilter{Limit: 1000})
	if err != nil || len(evs) == 0 {
		t.Fatalf("Events: %d, %v", len(evs), err)
	}
	if _, err := c.DrainNode(ctx, "nowhere", api.DrainRequest{}); api.StatusOf(err) != 404 {
		t.Errorf("DrainNode of no node: %v", err)
	}
}
