package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln.dev/kiln/agent"
	"kiln.dev/kiln/api"
	"kiln.dev/kiln/snapshot"
)

// benchAgentsEnv names the variable that turns this test binary into the
// lease benchmark's fleet of simulated agents (see startAgents).
const benchAgentsEnv = "KILN_BENCH_AGENTS"

// TestMain runs the tests, or the benchmark's agent process when the
// benchmark started this binary as one.
func TestMain(m *testing.M) {
	if dir := os.Getenv(heldServerEnv); dir != "" {
		if err := runHeldServer(dir); err != nil {
			fmt.Fprintln(os.Stderr, "server process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if cfg := os.Getenv(benchAgentsEnv); cfg != "" {
		if err := runAgents(cfg, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "benchmark agents:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// benchAgents is what the agent process needs to know.
type benchAgents struct {
	URL           string
	CAPEM         string
	JoinToken     string
	CAFingerprint string // pinned by the agents, as kiln join does
	AdminToken    string // the users'
	Count         int
	// Plain agents send a heartbeat every Interval and the server answers
	// at once; otherwise each heartbeat is held by the server up to
	// Interval, as kiln agent's are, and sent again when answered.
	Plain    bool
	Interval time.Duration
}

// agentFleet is the running agent process.
type agentFleet struct {
	t     testing.TB
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	mu    sync.Mutex
	ended bool
}

// startAgents starts this test binary as a process that joins cfg.Count
// agents (8 H100s each) to the server, registers them and keeps them
// heartbeating; it returns once all are registered. With no agents
// (Count 0) the process holds users alone.
func startAgents(t testing.TB, cfg benchAgents) *agentFleet {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GODEBUG=") { // the server's trace alone
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, benchAgentsEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the agent process: %v", err)
	}
	f := &agentFleet{t: t, cmd: cmd, in: in, out: bufio.NewReader(outPipe)}
	line, err := f.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		f.stop()
		t.Fatalf("agent process did not get ready: %q %v", line, err)
	}
	return f
}

// ask sends a command line to the agent process and reads its answer.
func (f *agentFleet) ask(cmd string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := io.WriteString(f.in, cmd+"\n"); err != nil {
		return "", fmt.Errorf("agent process: %w", err)
	}
	line, err := f.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("agent process: %w", err)
	}
	return strings.TrimSpace(line), nil
}

// beats asks the agent process how many heartbeats were answered so far.
func (f *agentFleet) beats() int64 {
	line, err := f.ask("count")
	if err != nil {
		f.t.Error(err)
		return 0
	}
	n, err := strconv.ParseInt(line, 10, 64)
	if err != nil {
		f.t.Errorf("agent process answered %q to count", line)
	}
	return n
}

// do sends a command to the agent process and waits for its "ok".
func (f *agentFleet) do(cmd string) error {
	line, err := f.ask(cmd)
	if err != nil {
		return err
	}
	if line != "ok" {
		return fmt.Errorf("agent process, %s: %s", cmd, line)
	}
	return nil
}

// runResult is what a run of the users measured.
type runResult struct {
	lat   []time.Duration // every request's latency (open runs: pair by pair)
	start time.Time       // when an open run started
}

// run has the users run "closed N" or "open N RATE" and reads back the
// latencies, which the agent process writes to a file.
func (f *agentFleet) run(cmd string) (runResult, error) {
	file := filepath.Join(f.t.TempDir(), "latencies")
	if err := f.do(cmd + " " + file); err != nil {
		return runResult{}, err
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return runResult{}, err
	}
	var r runResult
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		v, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			return runResult{}, fmt.Errorf("latency file line %d: %w", i+1, err)
		}
		if i == 0 {
			r.start = time.UnixMicro(v)
			continue
		}
		r.lat = append(r.lat, time.Duration(v)*time.Microsecond)
	}
	return r, nil
}

// stop ends the agent process (its standard input closes) and waits.
func (f *agentFleet) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return
	}
	f.ended = true
	f.in.Close()
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = f.cmd.Process.Kill()
		<-done
	}
}

// runAgents is the agent process: it joins and registers the agents, says
// "ready", then heartbeats; each "count" line read from in is answered
// with the heartbeats answered so far; it returns when in closes.
func runAgents(rawCfg string, in io.Reader, out io.Writer) error {
	var cfg benchAgents
	if err := json.Unmarshal([]byte(rawCfg), &cfg); err != nil {
		return fmt.Errorf("%s: %w", benchAgentsEnv, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var beats atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Agents join and register eight at a time, then each heartbeats on
	// its own connection, spread over the interval.
	errs := make(chan error, cfg.Count)
	var jw sync.WaitGroup
	for k := 0; k < 8; k++ {
		jw.Add(1)
		go func(k int) {
			defer jw.Done()
			for i := k; i < cfg.Count; i += 8 {
				cl, err := joinAgent(ctx, cfg, i)
				if err != nil {
					errs <- err
					return
				}
				node := fmt.Sprintf("sim-%04d", i)
				wg.Add(1)
				go func() {
					defer wg.Done()
					heartbeat(ctx, cl, node, cfg, time.Duration(i)*cfg.Interval/time.Duration(cfg.Count), &beats)
				}()
			}
		}(k)
	}
	jw.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Fprintln(out, "ready")
	var users []*api.Client
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var err error
		switch f[0] {
		case "count":
			fmt.Fprintln(out, beats.Load())
			continue
		case "users":
			users, err = startUsers(ctx, cfg, f[1:])
		case "closed", "open":
			err = runUsers(ctx, users, f)
		default:
			err = fmt.Errorf("unknown command %q", f[0])
		}
		if err != nil {
			fmt.Fprintln(out, "error:", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Fprintln(out, "ok")
	}
	return nil
}

// startUsers makes n user clients ("users N"), each on a connection of
// its own, and has each take and release one GPU before any is measured
// (the server's placer builds its state on the first placement).
func startUsers(ctx context.Context, cfg benchAgents, args []string) ([]*api.Client, error) {
	if len(args) != 1 {
		return nil, errors.New("users N")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		return nil, fmt.Errorf("users %q: want a positive count", args[0])
	}
	users := make([]*api.Client, n)
	for i := range users {
		u, err := api.NewClient(cfg.URL, cfg.AdminToken, []byte(cfg.CAPEM), nil)
		if err != nil {
			return nil, err
		}
		if _, _, err := grantRelease(ctx, u); err != nil {
			return nil, err
		}
		users[i] = u
	}
	return users, nil
}

// runUsers runs "closed N FILE" or "open N RATE FILE" and writes the
// start (Unix microseconds) and then every latency (microseconds) to FILE.
func runUsers(ctx context.Context, users []*api.Client, f []string) error {
	if len(users) == 0 {
		return errors.New("no users: send users N first")
	}
	if (f[0] == "closed" && len(f) != 3) || (f[0] == "open" && len(f) != 4) {
		return errors.New("closed N FILE | open N RATE FILE")
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 1 {
		return fmt.Errorf("%s %q: want a positive count", f[0], f[1])
	}
	var lat []time.Duration
	start := time.Now()
	if f[0] == "closed" {
		lat, err = grantReleaseClosed(ctx, users, n)
	} else {
		rate, perr := strconv.ParseFloat(f[2], 64)
		if perr != nil || rate <= 0 {
			return fmt.Errorf("open rate %q: want a positive number", f[2])
		}
		lat, start, err = grantReleaseOpen(ctx, users, n, rate)
	}
	if err != nil {
		return err
	}
	var sb strings.Builder
	fmt.Fprintln(&sb, start.UnixMicro())
	for _, d := range lat {
		fmt.Fprintln(&sb, d.Microseconds())
	}
	return os.WriteFile(f[len(f)-1], []byte(sb.String()), 0o600)
}

// joinAgent joins agent i as kiln join does and registers its Snapshot;
// it returns the agent's client.
func joinAgent(ctx context.Context, cfg benchAgents, i int) (*api.Client, error) {
	node := fmt.Sprintf("sim-%04d", i)
	id, err := agent.Join(ctx, cfg.URL, cfg.JoinToken, cfg.CAFingerprint, node, "")
	if err != nil {
		return nil, err
	}
	cl, err := id.Client()
	if err != nil {
		return nil, err
	}
	s := &snapshot.Snapshot{SchemaVersion: snapshot.SchemaVersion, Host: snapshot.Host{Hostname: node}}
	for g := 0; g < 8; g++ {
		s.GPUs = append(s.GPUs, snapshot.GPU{Index: g, Vendor: "nvidia", Model: "H100-SXM5-80GB", ComputeCapability: "9.0",
			MemoryTotalBytes: 80 << 30, PCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x10+g), UUID: fmt.Sprintf("GPU-%04d-%d", i, g)})
	}
	if err := cl.Do(ctx, "PUT", "/v1/agent/nodes/"+node, api.RegisterRequest{Snapshot: s, Recorded: true}, nil); err != nil {
		return nil, fmt.Errorf("registering %s: %w", node, err)
	}
	return cl, nil
}

// heartbeat keeps one agent heartbeating until ctx ends.
func heartbeat(ctx context.Context, cl *api.Client, node string, cfg benchAgents, phase time.Duration, beats *atomic.Int64) {
	time.Sleep(phase)
	path := "/v1/agent/nodes/" + node + "/heartbeat"
	if !cfg.Plain {
		for ctx.Err() == nil {
			if err := cl.Do(ctx, "POST", path, api.Heartbeat{Running: []string{}, WaitMS: int(cfg.Interval / time.Millisecond)}, nil); err == nil {
				beats.Add(1)
			} else if ctx.Err() == nil {
				time.Sleep(time.Second)
			}
		}
		return
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := cl.Do(ctx, "POST", path, api.Heartbeat{Running: []string{}}, nil); err == nil {
			beats.Add(1)
		}
	}
}
