package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/capture"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/executor"
	"kiln.dev/kiln/executor/process"
	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/snapshot"
)

const (
	hgxFixture  = "../testdata/fixtures/h100-hgx8-sysfs"
	pcieFixture = "../testdata/fixtures/pcie4-downtrained-acs"
	mi300x      = "../testdata/captures/kfd-topology/mi300x-x8-cpx.tar.gz"
)

var (
	snapOnce sync.Once
	snaps    map[string]*snapshot.Snapshot
	snapErr  error
)

// machines are the recorded machines the agents replay.
func machines(t testing.TB) map[string]*snapshot.Snapshot {
	snapOnce.Do(func() {
		ctx := context.Background()
		snaps = map[string]*snapshot.Snapshot{}
		for name, p := range map[string]string{"hgx": hgxFixture, "pcie": pcieFixture} {
			s, err := discover.Replay(ctx, p)
			if err != nil {
				snapErr = err
				return
			}
			kb.Default().Annotate(s)
			snaps[name] = s
		}
		s, err := capture.Load(ctx, mi300x)
		if err != nil {
			snapErr = err
			return
		}
		kb.Default().Annotate(s)
		s.Host.Hostname = "mi300x-recorded"
		snaps["mi300x"] = s
	})
	if snapErr != nil {
		t.Fatal(snapErr)
	}
	return snaps
}

type cluster struct {
	t      testing.TB
	srv    *server.Server
	url    string
	admin  *api.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
	awg    sync.WaitGroup // the agents
	agents map[string]context.CancelFunc
	// clients are the API clients the test made: their connections are
	// closed before the server shuts down, which otherwise waits a second
	// for each HTTP/2 client to go after its GOAWAY.
	mu      sync.Mutex
	clients []*api.Client
}

// track keeps a client to close its connections at the end.
func (c *cluster) track(cl *api.Client) *api.Client {
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newCluster(t testing.TB, cfg server.Config) *cluster {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.URL = "https://" + ln.Addr().String()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	srv, err := server.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &cluster{t: t, srv: srv, url: cfg.URL, cancel: cancel, agents: map[string]context.CancelFunc{}}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); srv.Serve(ctx, ln) }()
	c.admin, err = api.NewClient(cfg.URL, srv.Bootstrap.AdminToken, srv.CAPEM(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.track(c.admin)
	t.Cleanup(c.close)
	return c
}

func (c *cluster) close() {
	for _, stop := range c.agents {
		stop()
	}
	c.awg.Wait()
	c.mu.Lock()
	for _, cl := range c.clients {
		cl.HTTP.CloseIdleConnections()
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.srv.Close()
}

// addAgent joins a node replaying snapshot s and runs its agent with exe
// (the process executor when nil).
func (c *cluster) addAgent(node string, s *snapshot.Snapshot, exe executor.Executor, heartbeat time.Duration) {
	c.t.Helper()
	c.addAgentWith(node, s, exe, heartbeat, nil)
}

// addAgentWith is addAgent with the agent's configuration changed by mod.
func (c *cluster) addAgentWith(node string, s *snapshot.Snapshot, exe executor.Executor, heartbeat time.Duration, mod func(*agent.Config)) {
	c.t.Helper()
	jt, err := c.srv.CreateJoinToken(context.Background(), 0, 1, "a test") // one node
	if err != nil {
		c.t.Fatal(err)
	}
	id, err := agent.Join(context.Background(), c.url, jt.Secret, c.srv.CAFingerprint(), node, filepath.Join(c.t.TempDir(), node))
	if err != nil {
		c.t.Fatal(err)
	}
	if exe == nil {
		exe = &process.Executor{}
	}
	cfg := agent.Config{Identity: id, Executor: exe, Recorded: true, Heartbeat: heartbeat, Logger: quietLogger(),
		Discover: func(context.Context) (*snapshot.Snapshot, error) { return s, nil }}
	if mod != nil {
		mod(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.agents[node] = cancel
	c.awg.Add(1)
	go func() { defer c.awg.Done(); a.Run(ctx) }()
}

// user makes a member token in the given projects.
func (c *cluster) user(name string, projects ...string) *api.Client {
	c.t.Helper()
	var tok api.Token
	if err := c.admin.Do(context.Background(), "POST", "/v1/tokens", api.TokenRequest{User: name, Projects: projects}, &tok); err != nil {
		c.t.Fatal(err)
	}
	cl, err := api.NewClient(c.url, tok.Secret, c.srv.CAPEM(), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.track(cl)
}

func (c *cluster) project(name string, weight float64) {
	c.t.Helper()
	if err := c.admin.Do(context.Background(), "PUT", "/v1/projects/"+name, api.Project{Name: name, Weight: weight}, nil); err != nil {
		c.t.Fatal(err)
	}
}

// waitNodes waits until n nodes are ready.
func (c *cluster) waitNodes(n int) []api.Node {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var nl api.NodeList
		if err := c.admin.Do(context.Background(), "GET", "/v1/nodes", nil, &nl); err != nil {
			c.t.Fatal(err)
		}
		ready := 0
		for _, nd := range nl.Nodes {
			if nd.State == api.NodeReady {
				ready++
			}
		}
		if ready >= n {
			return nl.Nodes
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%d of %d nodes ready after 20s: %+v", ready, n, nl.Nodes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLease polls a lease until cond holds.
func waitLease(t testing.TB, cl *api.Client, id string, within time.Duration, cond func(*api.Lease) bool) *api.Lease {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var l api.Lease
		if err := cl.Do(context.Background(), "GET", "/v1/leases/"+id, nil, &l); err != nil {
			t.Fatal(err)
		}
		if cond(&l) {
			return &l
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s: condition not met within %s; last %+v", id, within, l)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func final(l *api.Lease) bool { return api.LeaseFinal(l.State) }

var _ = fmt.Sprint
