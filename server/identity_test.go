package server_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/snapshot"
)

// fakeAgent speaks the agent protocol by hand, so a test decides when a
// node goes silent and what it reports.
type fakeAgent struct {
	t    *testing.T
	node string
	cl   *api.Client
}

func (c *cluster) joinWith(token, node string) (*fakeAgent, error) {
	id, err := agent.Join(context.Background(), c.url, token, c.srv.CAFingerprint(), node, filepath.Join(c.t.TempDir(), node))
	if err != nil {
		return nil, err
	}
	cl, err := id.Client()
	if err != nil {
		return nil, err
	}
	return &fakeAgent{t: c.t.(*testing.T), node: node, cl: c.track(cl)}, nil
}

// fake joins a node with a fresh single-use token and registers a
// snapshot with gpus H100s.
func (c *cluster) fake(node string, gpus int) *fakeAgent {
	c.t.Helper()
	jt, err := c.srv.CreateJoinToken(context.Background(), 0, 1, "a test")
	if err != nil {
		c.t.Fatal(err)
	}
	a, err := c.joinWith(jt.Secret, node)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := a.register(h100s(node, gpus), nil); err != nil {
		c.t.Fatal(err)
	}
	return a
}

func h100s(node string, n int) *snapshot.Snapshot {
	s := &snapshot.Snapshot{SchemaVersion: snapshot.SchemaVersion, Host: snapshot.Host{Hostname: node}}
	for g := 0; g < n; g++ {
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: g, Vendor: "nvidia", Model: "H100-SXM5-80GB", ComputeCapability: "9.0",
			MemoryTotalBytes: 80 << 30, PCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x10+g), UUID: fmt.Sprintf("GPU-%s-%d", node, g)})
	}
	return s
}

func (a *fakeAgent) register(s *snapshot.Snapshot, running []string) error {
	return a.cl.Do(context.Background(), "PUT", "/v1/agent/nodes/"+a.node, api.RegisterRequest{Snapshot: s, Recorded: true, Running: running}, nil)
}

func (a *fakeAgent) beat(running ...string) api.HeartbeatReply {
	a.t.Helper()
	var r api.HeartbeatReply
	if err := a.cl.Do(context.Background(), "POST", "/v1/agent/nodes/"+a.node+"/heartbeat", api.Heartbeat{Running: running}, &r); err != nil {
		a.t.Fatal(err)
	}
	return r
}

// TestJoinTokens: a join token joins one node unless made for more, until
// it expires or is revoked; the list shows each token's uses, never its
// secret.
func TestJoinTokens(t *testing.T) {
	t.Parallel() // a cluster of its own; it mostly waits
	c := newCluster(t, server.Config{})
	ctx := context.Background()
	mint := func(req api.JoinTokenRequest) api.JoinToken {
		t.Helper()
		var jt api.JoinToken
		if err := c.admin.Do(ctx, "POST", "/v1/join-tokens", req, &jt); err != nil {
			t.Fatal(err)
		}
		return jt
	}
	refused := func(what string, err error, want string) {
		t.Helper()
		if api.StatusOf(err) != http.StatusUnauthorized || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want 401 saying %q", what, err, want)
		}
	}
	one := mint(api.JoinTokenRequest{})
	if d := time.Until(one.Expires); d > time.Hour || d < 59*time.Minute {
		t.Errorf("a join token by default expires in %s, want an hour", d)
	}
	if _, err := c.joinWith(one.Secret, "n1"); err != nil {
		t.Fatal(err)
	}
	_, err := c.joinWith(one.Secret, "n2")
	refused("a second node with a single-use token", err, "used up")
	_, err = c.joinWith(c.srv.Bootstrap.JoinToken, "n3")
	if err != nil {
		t.Fatalf("the first start's join token: %v", err)
	}
	_, err = c.joinWith(c.srv.Bootstrap.JoinToken, "n4")
	refused("the first start's join token again", err, "used up")

	two := mint(api.JoinTokenRequest{Uses: 2})
	for _, n := range []string{"m1", "m2"} {
		if _, err := c.joinWith(two.Secret, n); err != nil {
			t.Fatalf("%s with a two-use token: %v", n, err)
		}
	}
	_, err = c.joinWith(two.Secret, "m3")
	refused("a third node with a two-use token", err, "used up")

	rev := mint(api.JoinTokenRequest{Uses: 5})
	if err := c.admin.Do(ctx, "DELETE", "/v1/join-tokens/"+rev.ID, nil, nil); err != nil {
		t.Fatal(err)
	}
	_, err = c.joinWith(rev.Secret, "r1")
	refused("a revoked token", err, "revoked")

	short := mint(api.JoinTokenRequest{TTLSeconds: 1})
	time.Sleep(time.Until(short.Expires) + 10*time.Millisecond) // until it has expired
	_, err = c.joinWith(short.Secret, "e1")
	refused("an expired token", err, "expired")

	var list struct {
		JoinTokens []api.JoinToken `json:"join_tokens"`
	}
	if err := c.admin.Do(ctx, "GET", "/v1/join-tokens", nil, &list); err != nil {
		t.Fatal(err)
	}
	byID := map[string]api.JoinToken{}
	for _, jt := range list.JoinTokens {
		byID[jt.ID] = jt
		if jt.Secret != "" || jt.Command != "" {
			t.Errorf("the list shows join token %s's secret", jt.ID)
		}
	}
	if jt := byID[two.ID]; jt.Uses != 2 || jt.Used != 2 {
		t.Errorf("two-use token listed %+v", jt)
	}
	if jt := byID[rev.ID]; jt.Revoked == nil || jt.Used != 0 {
		t.Errorf("revoked token listed %+v", jt)
	}
	member := c.user("ana")
	if err := member.Do(ctx, "GET", "/v1/join-tokens", nil, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("a member listing join tokens: %v, want 403", err)
	}
}

// TestLostNodeStaysFenced: a node that went silent keeps its name and its
// GPUs: another agent with a valid join token cannot take the name while
// the old job may still run there. An admin replaces the node (the new
// agent takes the name; the GPUs come back once it registers) or forgets
// it.
func TestLostNodeStaysFenced(t *testing.T) {
	c := newCluster(t, server.Config{HeartbeatTimeout: time.Second})
	ctx := context.Background()
	old := c.fake("hgx", 8)
	var l api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 8, Job: &api.JobSpec{Command: []string{"sleep", "1000"}}}, &l); err != nil {
		t.Fatal(err)
	}
	if r := old.beat(); len(r.Start) != 1 {
		t.Fatalf("the node was given %d tasks, want 1", len(r.Start))
	}
	old.beat(l.Jobs[0])
	// The node goes silent with its job running.
	waitLease(t, c.admin, l.ID, 20*time.Second, func(l *api.Lease) bool { return l.State == api.LeaseLost })

	jt, _ := c.srv.CreateJoinToken(ctx, 0, 1, "a test")
	if _, err := c.joinWith(jt.Secret, "hgx"); api.StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "kiln node replace hgx") {
		t.Fatalf("taking the lost node's name: %v, want 409 naming the way out", err)
	}
	var again api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1}, &again); err != nil {
		t.Fatal(err)
	}
	var n api.Node
	c.admin.Do(ctx, "GET", "/v1/nodes/hgx", nil, &n)
	for _, d := range n.Devices {
		if !d.Held {
			t.Errorf("device %s of the lost node is not held", d.ID)
		}
	}
	// The join was refused before the token was used: it still joins
	// another node.
	if _, err := c.joinWith(jt.Secret, "other"); err != nil {
		t.Errorf("the token of the refused join: %v", err)
	}

	// A member may not replace or forget nodes.
	member := c.user("bo", "default")
	for _, p := range []string{"POST /v1/nodes/hgx/replace", "DELETE /v1/nodes/hgx"} {
		m, path, _ := strings.Cut(p, " ")
		if err := member.Do(ctx, m, path, nil, nil); api.StatusOf(err) != http.StatusForbidden {
			t.Errorf("a member: %s: %v, want 403", p, err)
		}
	}

	// Replace: the old agent's certificate is refused from now on, the new
	// agent takes the name, and once it registers (running nothing) the
	// GPUs are free and the queued lease is granted.
	if err := c.admin.Do(ctx, "POST", "/v1/nodes/hgx/replace", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := old.cl.Do(ctx, "POST", "/v1/agent/nodes/hgx/heartbeat", api.Heartbeat{}, nil); api.StatusOf(err) != http.StatusUnauthorized {
		t.Errorf("the replaced agent's heartbeat: %v, want 401", err)
	}
	jt, _ = c.srv.CreateJoinToken(ctx, 0, 1, "a test")
	nw, err := c.joinWith(jt.Secret, "hgx")
	if err != nil {
		t.Fatalf("joining in place of the replaced node: %v", err)
	}
	if err := nw.register(h100s("hgx", 8), nil); err != nil {
		t.Fatal(err)
	}
	waitLease(t, c.admin, again.ID, 20*time.Second, func(l *api.Lease) bool { return l.State == api.LeaseGranted })

	// Forget: a lost node's holds are freed and the name is free.
	lost := c.fake("pcie", 4)
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 4, Constraints: api.Constraints{Nodes: []string{"pcie"}},
		Job: &api.JobSpec{Command: []string{"sleep", "1000"}}}, &l); err != nil {
		t.Fatal(err)
	}
	lost.beat()
	for {
		// hgx keeps beating meanwhile; pcie does not.
		nw.beat()
		var cur api.Lease
		c.admin.Do(ctx, "GET", "/v1/leases/"+l.ID, nil, &cur)
		if cur.State == api.LeaseLost {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A beat just before, so that a slow loop above (a loaded machine) has
	// not let hgx's own heartbeat timeout lapse too.
	nw.beat()
	if err := c.admin.Do(ctx, "DELETE", "/v1/nodes/hgx", nil, nil); api.StatusOf(err) != http.StatusConflict {
		t.Errorf("forgetting a ready node: %v, want 409", err)
	}
	if err := c.admin.Do(ctx, "DELETE", "/v1/nodes/pcie", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.admin.Do(ctx, "GET", "/v1/nodes/pcie", nil, nil); api.StatusOf(err) != http.StatusNotFound {
		t.Errorf("the forgotten node: %v, want 404", err)
	}
	waitLease(t, c.admin, l.ID, 5*time.Second, func(l *api.Lease) bool { return !l.Holding })
	jt, _ = c.srv.CreateJoinToken(ctx, 0, 1, "a test")
	if _, err := c.joinWith(jt.Secret, "pcie"); err != nil {
		t.Errorf("joining as the forgotten node: %v", err)
	}
}

// TestForgedReports: an agent (or a job that stole its key) reports only
// for its own node and for jobs placed there: another node's job cannot be
// ended or written to.
func TestForgedReports(t *testing.T) {
	c := newCluster(t, server.Config{HeartbeatTimeout: 30 * time.Second})
	ctx := context.Background()
	a, b := c.fake("a", 8), c.fake("b", 8)
	c.project("vision", 1)
	ana := c.user("ana", "vision")
	var l api.Lease
	if err := ana.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "vision", GPUs: 8, Constraints: api.Constraints{Nodes: []string{"b"}},
		Job: &api.JobSpec{Command: []string{"sleep", "1000"}}}, &l); err != nil {
		t.Fatal(err)
	}
	job := l.Jobs[0]
	b.beat()
	b.beat(job)
	if err := a.cl.Do(ctx, "POST", "/v1/agent/nodes/b/jobs/"+job+"/exit", api.ExitReport{Code: 0, Reason: "exited"}, nil); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("a reporting b's job as exited: %v, want 403", err)
	}
	var status map[string]string
	if err := a.cl.Do(ctx, "POST", "/v1/agent/nodes/a/jobs/"+job+"/exit", api.ExitReport{Code: 0, Reason: "exited"}, &status); err != nil || status["status"] != "ignored" {
		t.Errorf("a reporting b's job under its own name: %v %v, want ignored", status, err)
	}
	if _, err := a.cl.Raw(ctx, "POST", "/v1/agent/nodes/a/jobs/"+job+"/logs", strings.NewReader("forged output\n")); api.StatusOf(err) != http.StatusNotFound {
		t.Errorf("a writing to b's job's log: %v, want 404", err)
	}
	if _, err := a.cl.Raw(ctx, "POST", "/v1/agent/nodes/b/jobs/"+job+"/logs", strings.NewReader("forged output\n")); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("a writing to b's job's log under b's name: %v, want 403", err)
	}
	var cur api.Lease
	if err := ana.Do(ctx, "GET", "/v1/leases/"+l.ID, nil, &cur); err != nil || cur.State != api.LeaseGranted {
		t.Errorf("ana's lease after the forged reports: %s %v, want granted", cur.State, err)
	}
	var j api.Job
	if err := ana.Do(ctx, "GET", "/v1/jobs/"+job, nil, &j); err != nil || j.State != api.JobRunning {
		t.Errorf("ana's job after the forged reports: %s %v, want running", j.State, err)
	}
}

// TestSnapshotPlausible: a snapshot claiming GPUs no node has is refused.
func TestSnapshotPlausible(t *testing.T) {
	c := newCluster(t, server.Config{})
	a := c.fake("n1", 8)
	for name, mutate := range map[string]func(*snapshot.Snapshot){
		"1000 GPUs":           func(s *snapshot.Snapshot) { *s = *h100s("n1", 1000) },
		"16 TiB on a GPU":     func(s *snapshot.Snapshot) { s.GPUs[0].MemoryTotalBytes = 16 << 40 },
		"a PCI address twice": func(s *snapshot.Snapshot) { s.GPUs[1].PCIAddress = s.GPUs[0].PCIAddress },
		"a UUID twice":        func(s *snapshot.Snapshot) { s.GPUs[1].UUID = s.GPUs[0].UUID },
		"a model of 10 kB":    func(s *snapshot.Snapshot) { s.GPUs[0].Model = strings.Repeat("H100 ", 2000) },
		"an escape in a name": func(s *snapshot.Snapshot) { s.Host.Hostname = "n1\x1b]0;owned\x07" },
	} {
		s := h100s("n1", 8)
		mutate(s)
		if err := a.register(s, nil); api.StatusOf(err) != http.StatusBadRequest {
			t.Errorf("%s: %v, want 400", name, err)
		}
	}
	var n api.Node
	c.admin.Do(context.Background(), "GET", "/v1/nodes/n1", nil, &n)
	if n.Total != 8 {
		t.Errorf("after the refused snapshots the node has %d GPUs, want its 8", n.Total)
	}
}

// TestLeaseSandbox: a lease states what its node's sandbox gives its jobs;
// a lease requiring what no node gives is refused with each node's reason,
// one that some node gives goes only there, and the agent is told what the
// lease requires.
func TestLeaseSandbox(t *testing.T) {
	c := newCluster(t, server.Config{})
	ctx := context.Background()
	strong := &api.Sandbox{User: "per-lease uid from 700000-799999", OwnUser: true, PIDNamespace: true, MountNamespace: true, CleanEnv: true,
		Missing: []string{"cgroup: no cgroup v2 hierarchy at /sys/fs/cgroup"}}
	weak := &api.Sandbox{User: "the agent's own user", Missing: []string{"own-user: jobs run as the agent's user"}}
	for node, sb := range map[string]*api.Sandbox{"strong": strong, "weak": weak} {
		jt, _ := c.srv.CreateJoinToken(ctx, 0, 1, "a test")
		a, err := c.joinWith(jt.Secret, node)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.cl.Do(ctx, "PUT", "/v1/agent/nodes/"+node, api.RegisterRequest{Snapshot: h100s(node, 8), Recorded: true, Sandbox: sb}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var l api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Require: []string{api.SandboxCgroup}}, &l); err != nil {
		t.Fatal(err)
	}
	if l.State != api.LeaseRefused || !strings.Contains(l.Reason, "cgroup") || !strings.Contains(l.Reason, "no cgroup v2 hierarchy") || !strings.Contains(l.Reason, "never runs them with less") {
		t.Errorf("a lease requiring cgroup limits no node gives: %s %q, want refused with the nodes' reasons", l.State, l.Reason)
	}
	for i := 0; i < 3; i++ {
		if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Require: []string{api.SandboxOwnUser, api.SandboxPIDNamespace},
			Job: &api.JobSpec{Command: []string{"true"}}}, &l); err != nil {
			t.Fatal(err)
		}
		if l.State != api.LeaseGranted || len(l.Allocations) != 1 || l.Allocations[0].Node != "strong" {
			t.Fatalf("a lease requiring its own user and PID namespace: %s on %+v", l.State, l.Allocations)
		}
		if got := l.Allocations[0].Sandbox; got == nil || got.User != strong.User || !got.PIDNamespace || got.Cgroup {
			t.Errorf("the lease's statement of its sandbox: %+v", got)
		}
	}
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Require: []string{"root"}}, nil); api.StatusOf(err) != http.StatusBadRequest {
		t.Errorf("requiring something unknown: %v, want 400", err)
	}
}
