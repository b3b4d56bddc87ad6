package process

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln.dev/kiln/executor"
)

// output gathers what a session writes, for reading while it runs.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
	eof chan struct{}
}

func collect(r io.Reader) *output {
	o := &output{eof: make(chan struct{})}
	go func() {
		defer close(o.eof)
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return o
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitFor waits until the output holds want (after the first n bytes).
func (o *output) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(o.String(), want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the session's output lacks %q; it is:\n%s", want, o.String())
}

func waitSession(t *testing.T, s executor.Session) executor.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ex, err := s.Wait(ctx)
	if err != nil {
		t.Fatalf("the session did not end: %v", err)
	}
	return ex
}

func startSleeper(t *testing.T, e *Executor, id string) executor.Handle {
	t.Helper()
	h, err := e.Start(context.Background(), executor.Job{ID: id, LeaseID: "l-" + id,
		Command: []string{"/bin/sh", "-c", "echo job-was-here > /tmp/mark; exec sleep 300"},
		Env:     map[string]string{"JOB_SETTING": "from-the-job"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(context.Background(), 0) })
	return h
}

// TestExecBesideSandboxedJob: a session runs as the job's user, with its
// environment (none of the agent's), its /tmp and its PID namespace; its
// input, output, error output and exit code are its own.
func TestExecBesideSandboxedJob(t *testing.T) {
	s := newSandboxed(t)
	t.Setenv("KILN_AGENT_SECRET", "agent-environment-secret")
	d := s.e.Delivered()
	h := startSleeper(t, s.e, "j-exec")
	jobPID := childOf(t, h.(*handle).cmd.Process.Pid)
	jobUID, _ := procUID(strconv.Itoa(jobPID))
	time.Sleep(100 * time.Millisecond) // the job writes its mark
	// The job holds no descriptor of kiln's: not the init's control
	// socket, through which sessions start.
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", jobPID))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fds {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", jobPID, f.Name())); strings.HasPrefix(l, "socket:") {
			t.Errorf("the job holds descriptor %s, a socket (%s): the init's control socket leaked to it", f.Name(), l)
		}
	}
	script := `echo uid=$(id -u) setting=$JOB_SETTING agent=${KILN_AGENT_SECRET:-none} term=${TERM:-none}
cat /tmp/mark
ls /proc | grep -c '^[0-9]' | sed 's/^/procs=/'
echo to-stderr >&2
read line; echo "read=$line"
exit 3`
	sess, err := h.(executor.Execer).Exec(context.Background(), executor.ExecSpec{Command: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, errOut := collect(sess.Stdout()), collect(sess.Stderr())
	io.WriteString(sess.Stdin(), "typed input\n")
	sess.Stdin().Close()
	ex := waitSession(t, sess)
	<-out.eof
	<-errOut.eof
	t.Logf("session:\n%s", out)
	if ex.Code != 3 {
		t.Errorf("exit %+v: want code 3", ex)
	}
	o := out.String()
	want := "uid=" + strconv.Itoa(int(jobUID)) + " setting=from-the-job agent=none term=none"
	if !strings.Contains(o, want) {
		t.Errorf("want %q in the output", want)
	}
	if !strings.Contains(o, "read=typed input") {
		t.Error("the session's input did not reach it")
	}
	if strings.Contains(o, "to-stderr") || !strings.Contains(errOut.String(), "to-stderr") {
		t.Errorf("error output %q: want it apart from the output", errOut.String())
	}
	if d.PrivateTmp && !strings.Contains(o, "job-was-here") {
		t.Error("the session does not see the job's /tmp")
	}
	if d.PIDNamespace {
		// The init, the job, the shell, ls, grep, sed and the subshell.
		if i := strings.Index(o, "procs="); i >= 0 {
			n, _ := strconv.Atoi(strings.Fields(o[i+6:])[0])
			if n > 10 {
				t.Errorf("the session sees %d processes: not the job's PID namespace", n)
			}
		}
	}
}

// TestExecTerminal: a session on a terminal gets its size, sees a resize,
// stops at Ctrl-C, and its output is the terminal's.
func TestExecTerminal(t *testing.T) {
	s := newSandboxed(t)
	h := startSleeper(t, s.e, "j-tty")
	ex := h.(executor.Execer)
	sess, err := ex.Exec(context.Background(), executor.ExecSpec{TTY: true, Rows: 30, Cols: 100, Term: "vt100",
		Command: []string{"/bin/sh", "-c", `stty size; echo "term=$TERM"; tty >/dev/null && echo on-a-tty; read x; stty size; sleep 300`}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if sess.Stderr() != nil {
		t.Error("a terminal session has an error output of its own")
	}
	out := collect(sess.Stdout())
	out.waitFor(t, "30 100")
	out.waitFor(t, "term=vt100")
	out.waitFor(t, "on-a-tty")
	if err := sess.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	io.WriteString(sess.Stdin(), "\r")
	out.waitFor(t, "40 120")
	time.Sleep(100 * time.Millisecond)
	io.WriteString(sess.Stdin(), "\x03") // Ctrl-C
	e := waitSession(t, sess)
	if e.Signal != "interrupt" || e.Code != 130 {
		t.Errorf("after Ctrl-C: %+v; want the shell interrupted (130)", e)
	}

	// Ctrl-D ends a shell reading its terminal.
	sh, err := ex.Exec(context.Background(), executor.ExecSpec{TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	so := collect(sh.Stdout())
	io.WriteString(sh.Stdin(), "echo $((6*7))\r")
	so.waitFor(t, "42")
	sh.Stdin().Close()
	if e := waitSession(t, sh); e.Code != 0 {
		t.Errorf("the shell after Ctrl-D: %+v", e)
	}
}

// TestExecSignalsAndJobEnd: a signal reaches the session's group; the
// job's end ends its sessions; a job that ended opens none.
func TestExecSignalsAndJobEnd(t *testing.T) {
	s := newSandboxed(t)
	h := startSleeper(t, s.e, "j-sig")
	ex := h.(executor.Execer)
	a, err := ex.Exec(context.Background(), executor.ExecSpec{Command: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	if e := waitSession(t, a); e.Code != 143 {
		t.Errorf("after TERM: %+v", e)
	}
	if err := a.Signal("STOP"); err == nil {
		t.Error("a signal outside the list was taken")
	}
	b, err := ex.Exec(context.Background(), executor.ExecSpec{Command: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := ex.Exec(context.Background(), executor.ExecSpec{Command: []string{"no-such-program-here"}}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing program: %v", err)
	}
	if err := h.Stop(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if e := waitSession(t, b); e.Code == 0 {
		t.Errorf("a session outlived its job: %+v", e)
	}
	if _, err := ex.Exec(context.Background(), executor.ExecSpec{Command: []string{"true"}}); err == nil {
		t.Error("a job that ended opened a session")
	}
}

// TestExecWithoutSandbox: a library caller's executor runs sessions with
// the job's environment and directory.
func TestExecWithoutSandbox(t *testing.T) {
	dir := t.TempDir()
	e := &Executor{Env: []string{"PATH=" + cleanPath}}
	h, err := e.Start(context.Background(), executor.Job{ID: "j-plain", Command: []string{"sleep", "300"}, WorkDir: dir, Env: map[string]string{"X": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop(context.Background(), 0)
	sess, err := h.(executor.Execer).Exec(context.Background(), executor.ExecSpec{Command: []string{"/bin/sh", "-c", "echo x=$X; pwd; exit 5"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out := collect(sess.Stdout())
	sess.Stdin().Close()
	if e := waitSession(t, sess); e.Code != 5 {
		t.Errorf("exit %+v", e)
	}
	<-out.eof
	if o := out.String(); !strings.Contains(o, "x=y") || !strings.Contains(o, dir) {
		t.Errorf("output %q: want the job's environment and directory", o)
	}
}
