package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor/containerd/containerdtest"
)

// TestImageJobThroughServer is the container acceptance run: Debian's
// containerd and runc, started by the test; a small image pushed to a
// local docker-registry; a kiln server and a kiln agent (processes, as an
// admin runs them) whose agent replays the recorded L40S box and runs
// image jobs through containerd. A job submitted with 'kiln run --image'
// runs in a container and its output comes back through 'kiln logs'.
// Where the kernel forbids containers the test skips and says why.
func TestImageJobThroughServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd, a registry, a server and an agent")
	}
	d := containerdtest.Start(t)
	reg := containerdtest.StartRegistry(t)
	ref := reg.Push(t, containerdtest.Image(t, containerdtest.BuildStatic(t, "../executor/containerd/testdata/jobprog")), "kiln/jobprog:accept")
	bin := buildKiln(t)

	data := t.TempDir()
	addr := freeAddr(t)
	url := "https://" + addr
	start(t, bin, nil, "server", "--data", data, "--listen", addr, "--url", url, "--heartbeat-timeout", "5s")
	cfgPath := filepath.Join(data, "admin-client.json")
	admin := waitAdmin(t, cfgPath)
	ctx := context.Background()
	var jt api.JoinToken
	if err := admin.Do(ctx, "POST", "/v1/join-tokens", api.JoinTokenRequest{}, &jt); err != nil {
		t.Fatal(err)
	}
	cfg, err := api.LoadClientConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(cfg.CAPEM))
	state := filepath.Join(t.TempDir(), "agent")
	if out, err := exec.Command(bin, "join", url, "--token", jt.Secret, "--ca-sha256", api.Fingerprint(block.Bytes),
		"--node", "l40s", "--state", state, "--join-only").CombinedOutput(); err != nil {
		t.Fatalf("kiln join: %v\n%s", err, out)
	}
	args := []string{"agent", "--state", state, "--from", "../testdata/fixtures/pcie4-downtrained-acs", "--heartbeat", "300ms",
		"--containerd", d.Address, "--plain-http", reg.Host, "--cdi-dir", filepath.Join(t.TempDir(), "cdi")}
	if d.Snapshotter != "" {
		args = append(args, "--snapshotter", d.Snapshotter)
	}
	start(t, bin, nil, args...)

	var node api.Node
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := admin.Do(ctx, "GET", "/v1/nodes/l40s", nil, &node); err == nil && node.State == api.NodeReady {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node l40s not ready: %+v", node)
		}
	}
	if node.Containers != "containerd" {
		t.Fatalf("node l40s runs no containers: %q", node.NoContainers)
	}

	env := append(os.Environ(), "KILN_CONFIG="+cfgPath)
	run := exec.Command(bin, "run", "--gpus", "2", "--image", ref, "--detach", "-o", "json", "--", "/jobprog", "report", "/dev/nvidia0")
	run.Env = env
	out, err := run.Output()
	if err != nil {
		t.Fatalf("kiln run --image: %v\n%s", err, out)
	}
	var rec struct {
		Lease api.Lease `json:"lease"`
	}
	if err := json.Unmarshal(out, &rec); err != nil || rec.Lease.ID == "" {
		t.Fatalf("kiln run -o json: %v\n%s", err, out)
	}
	l := rec.Lease
	for deadline := time.Now().Add(2 * time.Minute); !api.LeaseFinal(l.State); time.Sleep(200 * time.Millisecond) {
		if err := admin.Do(ctx, "GET", "/v1/leases/"+l.ID, nil, &l); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s did not end: %+v", l.ID, l)
		}
	}
	logs := exec.Command(bin, "logs", l.ID)
	logs.Env = env
	var stderr bytes.Buffer
	logs.Stderr = &stderr
	got, err := logs.Output()
	if err != nil {
		t.Fatalf("kiln logs: %v\n%s\nlease %+v", err, stderr.String(), l)
	}
	text := string(got)
	t.Logf("kiln logs %s:\n%s", l.ID, text)
	for _, want := range []string{
		"hello from a kiln job",
		"this line went to stderr",
		"env KILN_IMAGE_ENV=from-image",
		"env KILN_ISOLATION=exclusive",
		"env KILN_LEASE_ID=" + l.ID,
		"env CUDA_VISIBLE_DEVICES=",
		"recorded, not real",
		"path /dev/nvidia0: missing",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("kiln logs lacks %q", want)
		}
	}
	var j api.Job
	if err := admin.Do(ctx, "GET", "/v1/jobs/"+l.Jobs[0], nil, &j); err != nil {
		t.Fatal(err)
	}
	if j.ExitCode == nil || *j.ExitCode != 3 || l.State != api.LeaseDone {
		t.Errorf("job ended %s with code %v, lease %s (%s); want exit 3 (jobprog report), lease done", j.State, j.ExitCode, l.State, l.Reason)
	}

	// kiln exec in a container job: the command runs in the job's
	// container as its user, with its environment; input passed, exit
	// code returned.
	run = exec.Command(bin, "run", "--gpus", "1", "--image", ref, "--detach", "-o", "json", "--", "/jobprog", "wait")
	run.Env = env
	if out, err = run.Output(); err != nil {
		t.Fatalf("kiln run --image: %v\n%s", err, out)
	}
	if err := json.Unmarshal(out, &rec); err != nil || rec.Lease.ID == "" {
		t.Fatalf("kiln run -o json: %v\n%s", err, out)
	}
	held := rec.Lease.ID
	defer func() {
		c := exec.Command(bin, "cancel", held)
		c.Env = env
		_ = c.Run()
	}()
	var sessOut []byte
	var code int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		sess := exec.Command(bin, "exec", held, "-i", "--", "/jobprog", "session")
		sess.Env = env
		sess.Stdin = strings.NewReader("hello\nexit 5\n")
		var serr bytes.Buffer
		sess.Stderr = &serr
		sessOut, err = sess.Output()
		code = sess.ProcessState.ExitCode()
		if code == 5 || time.Now().After(deadline) {
			if code != 5 {
				t.Fatalf("kiln exec in a container job: exit %d (%v)\n%s\n%s", code, err, sessOut, serr.String())
			}
			break
		}
	}
	for _, want := range []string{"uid 65534 gid 65534", "env KILN_TEST_VALUE=", "tty no", "got hello"} {
		if !strings.Contains(string(sessOut), want+"\n") {
			t.Errorf("kiln exec's output lacks %q:\n%s", want, sessOut)
		}
	}
	if !strings.Contains(string(sessOut), "proc-cgroup ") || !strings.Contains(string(sessOut), "/kiln/") {
		t.Errorf("kiln exec's command is not in the job's cgroup:\n%s", sessOut)
	}

	// kiln run -i with an image that cannot run the holder (no sleep in
	// it): the job's end is said at once, not waited out.
	began := time.Now()
	ri := exec.Command(bin, "run", "-i", "--gpus", "1", "--image", ref, "--", "/jobprog", "session")
	ri.Env = env
	ri.Stdin = strings.NewReader("")
	riOut, err := ri.CombinedOutput()
	if err == nil || !strings.Contains(string(riOut), "before the session opened") || time.Since(began) > 45*time.Second {
		t.Errorf("kiln run -i with an image without sleep: %v after %s\n%s", err, time.Since(began).Round(time.Second), riOut)
	}
}

func buildKiln(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kiln")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/kiln")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building kiln: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func start(t *testing.T, bin string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
}

func waitAdmin(t *testing.T, path string) *api.Client {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if cfg, err := api.LoadClientConfig(path); err == nil {
			c, err := cfg.Client()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Raw(context.Background(), "GET", "/healthz", nil); err == nil {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("server did not come up")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
