package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/demo"
	"kiln.dev/kiln/discover"
	"kiln.dev/kiln/source"
)

// upRun is a kiln up process started by a test.
type upRun struct {
	cmd    *exec.Cmd
	config string
	mu     sync.Mutex
	out    bytes.Buffer // standard output so far
	errb   bytes.Buffer
	ready  chan struct{} // closed when kiln up has printed what to try
}

// startUp copies kiln into a directory of its own outside the repository,
// as a user who installed it elsewhere has it, and runs kiln up there with
// its data and client configuration in that directory.
func startUp(t *testing.T, args ...string) *upRun {
	t.Helper()
	if testing.Short() {
		t.Skip("builds kiln and runs kiln up")
	}
	built := buildKiln(t)
	dir := t.TempDir()
	b, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kiln"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &upRun{config: filepath.Join(dir, "client.json"), ready: make(chan struct{})}
	args = append([]string{"up", "--data", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--config", r.config,
		"--heartbeat", "300ms", "--no-containers", "--job-dir", filepath.Join(dir, "jobs")}, args...)
	if os.Geteuid() != 0 {
		// Without root, kiln up runs jobs only as a user named for them.
		me, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--job-user", me.Username)
	}
	r.cmd = exec.Command("./kiln", args...)
	r.cmd.Dir = dir
	r.cmd.Env = append(os.Environ(), "HOME="+dir, "KILN_CONFIG="+r.config)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.cmd.Stderr = &lockedWriter{mu: &r.mu, w: &r.errb}
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		closed := false
		for sc.Scan() {
			r.mu.Lock()
			r.out.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
			if !closed && strings.HasPrefix(sc.Text(), "Ctrl-C stops") {
				close(r.ready)
				closed = true
			}
		}
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-done
		_ = r.cmd.Wait()
	})
	select {
	case <-r.ready:
	case <-done:
		t.Fatalf("kiln up ended before it was up:\n%s\n%s", r.output(), r.stderr())
	case <-time.After(90 * time.Second):
		t.Fatalf("kiln up did not come up within 90s:\n%s\n%s", r.output(), r.stderr())
	}
	return r
}

func (r *upRun) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

func (r *upRun) stderr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errb.String()
}

// stop interrupts kiln up as Ctrl-C does and wants it to end cleanly.
func (r *upRun) stop(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(os.Interrupt)
	exited := make(chan error, 1)
	go func() { exited <- r.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("kiln up did not stop cleanly on Ctrl-C: %v\n%s", err, r.stderr())
		}
	case <-time.After(20 * time.Second):
		t.Errorf("kiln up did not stop within 20s of Ctrl-C")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// kiln up --demo runs from any directory: the recorded machines are in the
// binary, not in the source tree.
func TestUpDemoFromAnotherDirectory(t *testing.T) {
	r := startUp(t, "--demo", "--no-local-agent")
	out := r.output()
	cfg, err := api.LoadClientConfig(r.config)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cfg.Client()
	if err != nil {
		t.Fatal(err)
	}
	var nl api.NodeList
	if err := c.Do(context.Background(), "GET", "/v1/nodes", nil, &nl); err != nil {
		t.Fatalf("GET /v1/nodes: %v", err)
	}
	for _, m := range demo.Machines() {
		n, ok := findNode(nl.Nodes, m.Node)
		if !ok || n.State != api.NodeReady || !n.Recorded || n.Total == 0 {
			t.Errorf("demo node %s: %+v (found %v), want a ready recorded node with GPUs", m.Node, n, ok)
		}
		if !strings.Contains(out, m.Node) {
			t.Errorf("kiln up's table does not list %s:\n%s", m.Node, out)
		}
	}
	if !strings.Contains(out, "RECORDED") || !strings.Contains(out, "./kiln run") {
		t.Errorf("kiln up --demo says neither that the machines are recorded nor what to try:\n%s", out)
	}
	r.stop(t)
}

// On a machine without GPUs, kiln up says so and points to --demo, not to
// jobs the server would refuse.
func TestUpWithoutGPUsPointsToDemo(t *testing.T) {
	s, err := source.Load(context.Background(), nil, discover.Options{SkipNVML: true})
	if err != nil {
		t.Fatalf("discovering this machine: %v", err)
	}
	if len(s.GPUs) > 0 {
		t.Skipf("this machine has %d GPUs", len(s.GPUs))
	}
	r := startUp(t)
	out := r.output()
	if !strings.Contains(out, "No GPU found on this machine") || !strings.Contains(out, "./kiln up --demo") {
		t.Errorf("kiln up on a machine without GPUs does not point to --demo:\n%s", out)
	}
	if strings.Contains(out, "kiln run") {
		t.Errorf("kiln up on a machine without GPUs suggests jobs it would refuse:\n%s", out)
	}
	r.stop(t)
}

// What kiln up suggests follows the GPUs of the ready nodes.
func TestPrintUp(t *testing.T) {
	gpu := []api.Device{{ID: "0000:19:00.0", Model: "H100"}}
	cases := []struct {
		name    string
		nodes   []api.Node
		demo    bool
		local   string
		want    []string
		notWant []string
	}{
		{"this machine has no GPU", []api.Node{{ID: "box", State: api.NodeReady}}, false, "box",
			[]string{"No GPU found on this machine", "./kiln up --demo"}, []string{"kiln run"}},
		{"no node at all", nil, false, "",
			[]string{"No node with a GPU is ready", "./kiln up --demo"}, []string{"kiln run", "this machine"}},
		{"the only GPUs are on a node that is down", []api.Node{{ID: "box", State: api.NodeReady}, {ID: "gpu1", State: api.NodeLost, Devices: gpu, Total: 1}}, false, "box",
			[]string{"No GPU found on this machine", "./kiln up --demo"}, []string{"kiln run"}},
		{"this machine has GPUs", []api.Node{{ID: "box", State: api.NodeReady, Devices: gpu, Total: 1}}, false, "box",
			[]string{"./kiln run"}, []string{"--demo", "No GPU"}},
		{"another node has GPUs", []api.Node{{ID: "box", State: api.NodeReady}, {ID: "gpu1", State: api.NodeReady, Devices: gpu, Total: 1}}, false, "box",
			[]string{"./kiln run"}, []string{"--demo", "No GPU"}},
		{"the demo", []api.Node{{ID: "box", State: api.NodeReady}, {ID: "demo-hgx-h100", State: api.NodeReady, Recorded: true, Devices: gpu, Total: 1}}, true, "box",
			[]string{"RECORDED", "./kiln run"}, []string{"No GPU"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			printUp(&b, "https://127.0.0.1:7443", "/data", "client configuration (admin): /cfg", c.nodes, c.demo, c.local)
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("does not say %q:\n%s", w, b.String())
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(b.String(), w) {
					t.Errorf("says %q:\n%s", w, b.String())
				}
			}
		})
	}
}
