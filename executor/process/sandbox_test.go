package process

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/executor"
)

// sandboxed is an executor with a sandbox for the test: uids from a range
// of its own, its work root and kiln's data (hidden) in a directory others
// may enter.
type sandboxed struct {
	e              *Executor
	root, data, st string
}

func newSandboxed(t *testing.T) *sandboxed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving jobs users of their own needs root (CI runs the tests as root)")
	}
	root, err := os.MkdirTemp("", "kiln-sandbox-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o711)
	data := filepath.Join(root, "data")
	os.Mkdir(data, 0o700)
	os.WriteFile(filepath.Join(data, "ca.key"), []byte("THE-CA-KEY"), 0o600)
	os.WriteFile(filepath.Join(data, "kiln.db"), []byte("THE-DATABASE"), 0o644)
	state := filepath.Join(root, "agent")
	os.Mkdir(state, 0o700)
	os.WriteFile(filepath.Join(state, "key.pem"), []byte("THE-AGENT-KEY"), 0o600)
	e := &Executor{StateDir: filepath.Join(state, "jobs"), CgroupParent: filepath.Join(root, "nocgroup", "kiln"),
		Sandbox: &Sandbox{FirstUID: 730000, LastUID: 730099, WorkRoot: filepath.Join(root, "work"), Hide: []string{data, state}}}
	return &sandboxed{e: e, root: root, data: data, st: state}
}

func waitOut(t *testing.T, h executor.Handle) (executor.Exit, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, err := h.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Logs()
	b, _ := io.ReadAll(r)
	r.Close()
	return ex, string(b)
}

// childOf finds a child process of pid (the job under its init).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	for i := 0; i < 200; i++ {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			c, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
			j := strings.LastIndexByte(string(b), ')')
			if j < 0 {
				continue
			}
			if f := strings.Fields(string(b[j+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
				return c
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d has no child", pid)
	return 0
}

// TestSandboxKeepsJobsApart: a job runs as a uid of its own (not root, not
// the agent's), with a clean environment and a private home and /tmp, and
// can neither read kiln's keys and data, nor another job's environment or
// /proc entries, nor signal it. Where the kernel lacks a feature, the
// statement the job gets (KILN_SANDBOX) says so, and the test checks the
// statement against what the job sees.
func TestSandboxKeepsJobsApart(t *testing.T) {
	s := newSandboxed(t)
	t.Setenv("KILN_AGENT_SECRET", "agent-environment-secret")
	d := s.e.Delivered()
	t.Logf("delivered: %s; missing: %s", d, strings.Join(d.Missing, "; "))
	if !d.OwnUser || !d.CleanEnv {
		t.Fatalf("a root agent with a uid range delivers %+v", d)
	}
	ctx := context.Background()
	a, err := s.e.Start(ctx, executor.Job{ID: "j-a", LeaseID: "l-a", Command: []string{"sleep", "300"}, Env: map[string]string{"SECRET_A": "hunter2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop(ctx, 0)
	apid := childOf(t, a.(*handle).cmd.Process.Pid)
	auid, _ := procUID(strconv.Itoa(apid))
	script := `echo uid=$(id -u) gid=$(id -g)
echo pid=$$
echo home=$HOME cwd=$(pwd) mode=$(stat -c %a "$HOME")
echo agentenv=$(env | grep -c KILN_AGENT_SECRET)
echo vars=$(env | cut -d= -f1 | sort | tr '\n' ,)
echo sandbox=$KILN_SANDBOX
cat /proc/$APID/environ >/dev/null 2>&1 && echo A-ENV-READ || echo a-env-refused
[ -e /proc/$APID ] && echo a-proc-seen || echo a-proc-hidden
kill -0 $APID 2>/dev/null && echo A-SIGNALLED || echo a-signal-refused
cat $DATA/ca.key 2>/dev/null || echo ca-key-refused
cat $DATA/kiln.db 2>/dev/null || echo db-refused
cat $STATE/key.pem 2>/dev/null || echo agent-key-refused
echo procs=$(ls /proc | grep -c '^[0-9]')
echo b > /tmp/kiln-sandbox-test-b && echo tmp-written
`
	b, err := s.e.Start(ctx, executor.Job{ID: "j-b", LeaseID: "l-b", Command: []string{"/bin/sh", "-c", script},
		Env: map[string]string{"APID": strconv.Itoa(apid), "DATA": s.data, "STATE": s.st}})
	if err != nil {
		t.Fatal(err)
	}
	ex, out := waitOut(t, b)
	if ex.Code != 0 {
		t.Fatalf("job b: %+v\n%s", ex, out)
	}
	t.Logf("job b:\n%s", out)
	fields := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k] = v
			}
		}
	}
	uid, _ := strconv.Atoi(fields["uid"])
	if uid < 730000 || uid > 730099 || uid == int(auid) {
		t.Errorf("job b ran as uid %d (job a as %d): want a uid of its own from 730000-730099", uid, auid)
	}
	if auid < 730000 || auid > 730099 {
		t.Errorf("job a runs as uid %d", auid)
	}
	if fields["mode"] != "700" || fields["cwd"] != fields["home"] || !strings.HasPrefix(fields["home"], filepath.Join(s.root, "work")) {
		t.Errorf("home %s mode %s cwd %s: want a private directory under the work root", fields["home"], fields["mode"], fields["cwd"])
	}
	if fields["agentenv"] != "0" {
		t.Error("the agent's environment reached the job")
	}
	for _, v := range strings.Split(strings.TrimSuffix(fields["vars"], ","), ",") {
		switch v {
		case "PATH", "HOME", "LANG", "TMPDIR", "KILN_JOB_ID", "KILN_LEASE_ID", "KILN_SANDBOX", "APID", "DATA", "STATE", "PWD", "SHLVL", "_", "OLDPWD":
		default:
			t.Errorf("the job's environment has %s", v)
		}
	}
	for _, want := range []string{"a-env-refused", "a-signal-refused", "ca-key-refused", "db-refused", "agent-key-refused", "tmp-written"} {
		if !strings.Contains(out, want) {
			t.Errorf("job b's output lacks %q", want)
		}
	}
	// What the statement promises, the job must see.
	if !strings.Contains(out, "sandbox="+d.String()) {
		t.Errorf("KILN_SANDBOX is not the executor's statement %q", d)
	}
	if d.PIDNamespace {
		// The init and its threads take the first pids of the namespace.
		if pid, _ := strconv.Atoi(fields["pid"]); pid < 2 || pid > 100 {
			t.Errorf("the statement says pid-namespace, the job's shell is pid %s", fields["pid"])
		}
		if !strings.Contains(out, "a-proc-hidden") {
			t.Error("the statement says pid-namespace, the job sees job a's /proc entry")
		}
		// The init, the shell, the command substitution, ls and grep.
		if n, _ := strconv.Atoi(fields["procs"]); n > 5 {
			t.Errorf("the job sees %d processes", n)
		}
	}
	if d.MountNamespace || d.PrivateTmp {
		if _, err := os.Stat("/tmp/kiln-sandbox-test-b"); err == nil {
			os.Remove("/tmp/kiln-sandbox-test-b")
			t.Error("the statement says private-tmp, the job wrote to the host's /tmp")
		}
	}
	if _, err := os.Stat(fields["home"]); !os.IsNotExist(err) {
		t.Errorf("job b's directory is left after it ended: %v", err)
	}
}

// TestSandboxRefusesLess: a job that requires what the node does not give
// is refused, never run with less; root and the agent's user are never a
// job's user.
func TestSandboxRefusesLess(t *testing.T) {
	s := newSandboxed(t)
	d := s.e.Delivered()
	ctx := context.Background()
	for _, want := range []string{GiveOwnUser, GivePIDNamespace, GiveMountNamespace, GiveCgroup, GiveDevices} {
		h, err := s.e.StartWith(ctx, executor.Job{ID: "j-r-" + want, LeaseID: "l-r", Command: []string{"true"}}, JobOptions{Require: []string{want}})
		switch {
		case d.Has(want) && err != nil:
			t.Errorf("requiring %s, which is delivered: %v", want, err)
		case !d.Has(want) && err == nil:
			t.Errorf("requiring %s, which is not delivered (%v): started", want, d.Missing)
		case !d.Has(want) && !strings.Contains(err.Error(), "refused rather than run with less"):
			t.Errorf("requiring %s: %v", want, err)
		}
		if h != nil {
			waitOut(t, h)
		}
	}
	for _, u := range []string{"root", "0", strconv.Itoa(os.Getuid())} {
		e := &Executor{Sandbox: &Sandbox{Users: UsersFixed, User: u, WorkRoot: s.e.Sandbox.WorkRoot}}
		if h, err := e.Start(ctx, executor.Job{ID: "j-root", Command: []string{"id", "-u"}}); err == nil {
			_, out := waitOut(t, h)
			t.Errorf("--job-user %s: the job ran (%s)", u, out)
		}
	}
	plain := &Executor{}
	if _, err := plain.StartWith(ctx, executor.Job{ID: "j-p", Command: []string{"true"}}, JobOptions{Require: []string{GiveOwnUser}}); err == nil {
		t.Error("an executor without a sandbox ran a job that requires its own user")
	}
}

// TestSandboxSignalsAndExit: a stopped job gets SIGTERM through its init,
// then SIGKILL; exit codes and signals come back as the job's own; what a
// job left running under its uid (outside its process group too) is gone
// once its lease's last job ended.
func TestSandboxSignalsAndExit(t *testing.T) {
	s := newSandboxed(t)
	ctx := context.Background()
	h, err := s.e.Start(ctx, executor.Job{ID: "j-3", LeaseID: "l-3", Command: []string{"/bin/sh", "-c", `exit 3`}})
	if err != nil {
		t.Fatal(err)
	}
	if ex, out := waitOut(t, h); ex.Code != 3 || ex.Signal != "" {
		t.Errorf("exit 3: %+v %s", ex, out)
	}
	h, err = s.e.Start(ctx, executor.Job{ID: "j-9", LeaseID: "l-9", Command: []string{"/bin/sh", "-c", `kill -9 $$`}})
	if err != nil {
		t.Fatal(err)
	}
	if ex, out := waitOut(t, h); ex.Signal != syscall.SIGKILL.String() {
		t.Errorf("killed: %+v %s", ex, out)
	}
	h, err = s.e.Start(ctx, executor.Job{ID: "j-t", LeaseID: "l-t", Command: []string{"/bin/sh", "-c",
		`setsid sleep 300 & trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done`}})
	if err != nil {
		t.Fatal(err)
	}
	r := h.Logs()
	defer r.Close()
	var seen strings.Builder
	buf := make([]byte, 256)
	for !strings.Contains(seen.String(), "ready\n") {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("no ready: %q %v", seen.String(), err)
		}
		seen.Write(buf[:n])
	}
	uid, _ := procUID(strconv.Itoa(childOf(t, h.(*handle).cmd.Process.Pid)))
	if err := h.Stop(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	ex, out := waitOut(t, h)
	if !strings.Contains(out, "got-term") || ex.Code != 0 {
		t.Errorf("the job did not get SIGTERM through its init: %+v %q", ex, out)
	}
	if uidsOfProcesses()[uid] {
		t.Errorf("a process of the ended lease's uid %d is still running", uid)
	}
}

func TestDeliveredString(t *testing.T) {
	d := Delivered{User: "per-lease uid from 1-2", PIDNamespace: true, CleanEnv: true}
	got := d.String()
	for _, want := range []string{"user=per-lease uid from 1-2", "pid-namespace", "no-mount-namespace", "clean-env", "no-cgroup"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	_ = fmt.Sprint
}
