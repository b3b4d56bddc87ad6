//go:build e2e

// The end-to-end acceptance tests: real kiln processes or a real server
// with real agents under load, for seconds. scripts/test.sh runs them
// (go test -tags e2e); a plain go test leaves them out.

package server_test

import (
	"context"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor/process"
	"kiln.dev/kiln/snapshot"
)

// kilnBinary builds kiln once for the tests that run it as a process.
func kilnBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kiln")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/kiln")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building kiln: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startProc(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func kill9(t *testing.T, cmd *exec.Cmd) {
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
}

func adminClient(t *testing.T, data string) *api.Client {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cfg, err := api.LoadClientConfig(filepath.Join(data, "admin-client.json"))
		if err == nil {
			c, err := cfg.Client()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Raw(context.Background(), "GET", "/healthz", nil); err == nil {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKillServerAndAgent: kill -9 the server in the middle of a load of
// lease requests, restart it, and check that every acknowledged lease is
// there and no GPU was granted twice; kill -9 an agent and check that its
// lease is lost after the heartbeat timeout and its GPUs are not granted
// again until it registers again.
func TestKillServerAndAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs kiln processes")
	}
	bin := kilnBinary(t)
	data := t.TempDir()
	addr := freePort(t)
	serverArgs := []string{"server", "--data", data, "--listen", addr, "--url", "https://" + addr, "--heartbeat-timeout", "2s", "--grace", "200ms"}
	srv := startProc(t, bin, serverArgs...)
	admin := adminClient(t, data)
	ctx := context.Background()
	var jt api.JoinToken
	if err := admin.Do(ctx, "POST", "/v1/join-tokens", api.JoinTokenRequest{Uses: 2}, &jt); err != nil {
		t.Fatal(err)
	}
	cfg, _ := api.LoadClientConfig(filepath.Join(data, "admin-client.json"))
	block, _ := pem.Decode([]byte(cfg.CAPEM))
	fp := api.Fingerprint(block.Bytes)

	// An in-process agent replaying the HGX, with the ledger.
	m := machines(t)
	led := newLedger()
	id, err := agent.Join(ctx, "https://"+addr, jt.Secret, fp, "hgx", filepath.Join(t.TempDir(), "hgx"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Identity: id, Executor: &recording{node: "hgx", inner: &process.Executor{}, l: led}, Recorded: true,
		Heartbeat: 300 * time.Millisecond, Logger: quietLogger(),
		Discover: func(context.Context) (*snapshot.Snapshot, error) { return m["hgx"], nil }})
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Run(actx) }()
	defer func() { stopAgent(); wg.Wait() }()

	// A second agent, a kiln process replaying the PCIe box.
	pcieState := filepath.Join(t.TempDir(), "pcie")
	join := exec.Command(bin, "join", "https://"+addr, "--token", jt.Secret, "--ca-sha256", fp, "--node", "pcie", "--state", pcieState, "--join-only")
	if out, err := join.CombinedOutput(); err != nil {
		t.Fatalf("kiln join: %v\n%s", err, out)
	}
	agentArgs := []string{"agent", "--state", pcieState, "--from", pcieFixture, "--heartbeat", "300ms"}
	pcieAgent := startProc(t, bin, agentArgs...)
	waitReadyNodes(t, admin, 2)

	// The load: four clients asking for one or two H100s at a time, one
	// request every 40 ms or so, at most 40 each before the kill and 40
	// after (the queue drains in seconds, not minutes); the kill comes
	// while they still send.
	var mu sync.Mutex
	var acked []string
	stop := make(chan struct{})
	var phase atomic.Int32
	var lw sync.WaitGroup
	for w := 0; w < 4; w++ {
		lw.Add(1)
		go func(w int) {
			defer lw.Done()
			var sent [2]int
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if p := phase.Load(); sent[p] >= 40 {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				var l api.Lease
				req := api.LeaseRequest{Project: "default", GPUs: 1 + (i+w)%2, TimeLimitSeconds: 60, Constraints: api.Constraints{Nodes: []string{"hgx"}},
					Job: &api.JobSpec{Command: []string{"/bin/sh", "-c", "sleep 0.2"}}}
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := admin.Do(rctx, "POST", "/v1/leases", req, &l)
				cancel()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				mu.Lock()
				acked = append(acked, l.ID)
				mu.Unlock()
				sent[phase.Load()]++
				time.Sleep(40 * time.Millisecond)
			}
		}(w)
	}
	time.Sleep(1500 * time.Millisecond)
	kill9(t, srv)
	mu.Lock()
	atKill := len(acked)
	mu.Unlock()
	phase.Store(1)
	time.Sleep(300 * time.Millisecond)
	startProc(t, bin, serverArgs...) // the restarted server; startProc stops it when the test ends
	adminClient(t, data)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	lw.Wait()
	if atKill == 0 || len(acked) == atKill {
		t.Fatalf("load before the kill %d, after %d: want leases on both sides", atKill, len(acked))
	}
	for _, id := range acked {
		l := waitLease(t, admin, id, 60*time.Second, final)
		if l.State != api.LeaseDone {
			t.Errorf("acknowledged lease %s ended %s: %s", id, l.State, l.Reason)
		}
	}
	for _, v := range led.violations {
		t.Error("ledger:", v)
	}
	t.Logf("%d leases acknowledged (%d before kill -9 of the server), all there after restart and done", len(acked), atKill)

	// Kill the PCIe agent while it holds all four GPUs with a long job.
	// The job runs sandboxed (a uid of its own, its own PID namespace and
	// /tmp): the test finds its process by its command line.
	var big api.Lease
	if err := admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 4, Constraints: api.Constraints{Nodes: []string{"pcie"}},
		Job: &api.JobSpec{Command: []string{"sleep", "121.5"}}}, &big); err != nil {
		t.Fatal(err)
	}
	waitLease(t, admin, big.ID, 10*time.Second, func(l *api.Lease) bool { return l.State == api.LeaseGranted })
	var jobPID int
	for deadline := time.Now().Add(10 * time.Second); jobPID == 0; time.Sleep(50 * time.Millisecond) {
		jobPID = findProcess("sleep\x00121.5\x00")
		if jobPID == 0 && time.Now().After(deadline) {
			t.Fatal("the long job did not start")
		}
	}
	kill9(t, pcieAgent)
	// The job outlives its agent, as a job of a crashed agent does.
	time.Sleep(200 * time.Millisecond)
	if !processRuns(jobPID) {
		t.Fatalf("job process %d ended with its agent; the test needs it to outlive it", jobPID)
	}
	lost := waitLease(t, admin, big.ID, 10*time.Second, final)
	if lost.State != api.LeaseLost || !lost.Holding {
		t.Fatalf("lease on the killed agent: %s holding=%v (%s), want lost and holding", lost.State, lost.Holding, lost.Reason)
	}
	var next api.Lease
	if err := admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Constraints: api.Constraints{Nodes: []string{"pcie"}},
		Job: &api.JobSpec{Command: []string{"/bin/true"}}}, &next); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1 * time.Second)
	if err := admin.Do(ctx, "GET", "/v1/leases/"+next.ID, nil, &next); err != nil || next.State != api.LeaseQueued {
		t.Fatalf("a GPU of the lost node was granted again: %s (%v)", next.State, err)
	}
	// The agent comes back: it stops the job its previous run left
	// before it registers, the held GPUs are freed once it shows the old
	// job is not running, and the queued lease runs.
	startProc(t, bin, agentArgs...)
	done := waitLease(t, admin, next.ID, 20*time.Second, final)
	if done.State != api.LeaseDone {
		t.Fatalf("lease after the agent came back: %s (%s)", done.State, done.Reason)
	}
	if processRuns(jobPID) {
		t.Errorf("the job of the killed agent (pid %d) still runs after the agent came back and its GPUs were granted again", jobPID)
	}
	var after api.Lease
	admin.Do(ctx, "GET", "/v1/leases/"+big.ID, nil, &after)
	if after.Holding {
		t.Errorf("lost lease still holds its GPUs after the agent registered again")
	}
}

// findProcess is the pid of a process whose command line is cmdline, 0 if
// none.
func findProcess(cmdline string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == cmdline && processRuns(pid) {
			return pid
		}
	}
	return 0
}

// processRuns reports whether pid is a live process (not a zombie).
func processRuns(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

func waitReadyNodes(t *testing.T, c *api.Client, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var nl api.NodeList
		if err := c.Do(context.Background(), "GET", "/v1/nodes", nil, &nl); err == nil {
			ready := 0
			for _, nd := range nl.Nodes {
				if nd.State == api.NodeReady {
					ready++
				}
			}
			if ready >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d nodes ready", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
