package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/testenv"
)

// tmuxPane is a tmux server of the test's own with one pane.
type tmuxPane struct {
	t      *testing.T
	tmux   string
	socket string
	target string
}

func newTmux(t *testing.T, width, height int, command string) *tmuxPane {
	t.Helper()
	p := &tmuxPane{t: t, tmux: testenv.Need(t, "tmux", "apt-get install tmux"), socket: fmt.Sprintf("kiln-test-%d", os.Getpid()), target: "kiln"}
	t.Cleanup(func() { _ = exec.Command(p.tmux, "-L", p.socket, "kill-server").Run() })
	p.run("-f", "/dev/null", "new-session", "-d", "-s", "kiln", "-x", strconv.Itoa(width), "-y", strconv.Itoa(height), command)
	p.run("set-option", "-g", "status", "off")
	return p
}

func (p *tmuxPane) run(args ...string) string {
	p.t.Helper()
	out, err := exec.Command(p.tmux, append([]string{"-L", p.socket}, args...)...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// screen is what the pane shows, with its history.
func (p *tmuxPane) screen() string {
	return p.run("capture-pane", "-p", "-J", "-S", "-200", "-t", p.target)
}

// keys types into the pane (tmux key names: Enter, C-c, C-d).
func (p *tmuxPane) keys(keys ...string) {
	p.run(append([]string{"send-keys", "-t", p.target}, keys...)...)
}

// line types a line and presses Enter.
func (p *tmuxPane) line(s string) { p.run("send-keys", "-t", p.target, "-l", s); p.keys("Enter") }

// waitFor waits until the pane shows want (count times).
func (p *tmuxPane) waitFor(want string, count int) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Count(p.screen(), want) >= count {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("the pane does not show %q (%d times); it shows:\n%s", want, count, p.screen())
}

// TestShellUnderTmux drives kiln shell and kiln run -it on a real
// terminal (a tmux pane): the prompt, a command's output, the job's user
// and environment, a resize that stty sees, Ctrl-C stopping a command,
// and the exit code of the shell as kiln's; the session is on the lease's
// record.
func TestShellUnderTmux(t *testing.T) {
	e := setupSecurity(t)
	out, stderr, code := e.kilnAs(e.member, "run", "-d", "-o", "json", "--gpus", "1", "--node", "extra",
		"-e", "FROM_JOB=job-env", "--", "sleep", "300")
	var run struct {
		Lease struct {
			ID string `json:"id"`
		} `json:"lease"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &run) != nil || run.Lease.ID == "" {
		t.Fatalf("kiln run: %d %s\n%s", code, stderr, out)
	}
	lease := run.Lease.ID
	// The job must run before a session opens beside it.
	waitFor(t, "the job to run", 30*time.Second, func() bool {
		_, _, code := e.kilnAs(e.member, "exec", lease, "--", "true")
		return code == 0
	})
	if out, stderr, code := e.kilnAs(e.member, "exec", lease, "--", "sh", "-c", "echo $FROM_JOB; id -u; exit 4"); code != 4 || !strings.HasPrefix(out, "job-env\n") || strings.Contains(out, "\n0\n") {
		t.Errorf("kiln exec: exit %d, output %q %s", code, out, stderr)
	}
	if _, stderr, code := e.kilnAs(e.victim, "exec", lease, "--", "true"); code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("victor's kiln exec on mallory's lease: exit %d %s", code, stderr)
	}
	if _, stderr, code := e.kilnAs(e.member, "shell", lease); code != 3 || !strings.Contains(stderr, "needs a terminal") {
		t.Errorf("kiln shell without a terminal: exit %d %s", code, stderr)
	}

	p := newTmux(t, 100, 30, fmt.Sprintf("env KILN_CONFIG=%s %s shell %s --shell /bin/sh; echo kiln-exited=$?; sleep 600", e.member, e.bin, lease))
	p.waitFor("$ ", 1)
	p.line("echo hello-$((6*7)) $FROM_JOB")
	p.waitFor("hello-42 job-env", 1)
	p.line("echo size=$(stty size)")
	p.waitFor("size=30 100", 1)
	p.run("resize-window", "-t", "kiln", "-x", "120", "-y", "40")
	time.Sleep(200 * time.Millisecond)
	p.line("echo size=$(stty size)")
	p.waitFor("size=40 120", 1)
	p.line("sleep 300")
	time.Sleep(300 * time.Millisecond)
	p.keys("C-c")
	p.line("echo after-sleep=$?")
	p.waitFor("after-sleep=130", 1)
	p.line("id -u | sed s/^/uid=/")
	p.waitFor("uid=", 2)
	if strings.Contains(p.screen(), "uid=0\n") {
		t.Error("the shell runs as root")
	}
	p.line("exit 7")
	p.waitFor("kiln-exited=7", 1)

	// kiln run -it: a lease of its own, ended with the session; Ctrl-D
	// ends the shell.
	p2 := newTmuxNamed(t, p, "runit", fmt.Sprintf("env KILN_CONFIG=%s %s run -it --gpus 1 --node extra -- /bin/sh; echo run-exited=$?; sleep 600", e.member, e.bin))
	p2.waitFor("$ ", 1)
	p2.line("echo lease=$KILN_LEASE_ID")
	p2.waitFor("lease=l-", 1)
	p2.keys("C-d")
	p2.waitFor("run-exited=0", 1)
	scr := p2.screen()
	i := strings.Index(scr, "lease=l-")
	runLease := strings.Fields(scr[i+len("lease="):])[0]

	// On record: who opened a session on which lease; and the lease of
	// kiln run -it ended with it.
	c := e.client(e.admin)
	ctx := context.Background()
	if l, err := c.GetLease(ctx, runLease, api.LeaseWait{}); err != nil || !(api.LeaseFinal(l.State) || l.State == api.LeaseStopping) {
		t.Errorf("kiln run -it's lease %s after the session: %+v %v", runLease, l, err)
	}
	evs, err := c.Events(ctx, api.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var opened, closed int
	for _, ev := range evs {
		if ev.Subject == lease && ev.Kind == "session.opened" && strings.HasPrefix(ev.Message, "mallory opened a terminal running \"/bin/sh\"") {
			opened++
		}
		if ev.Subject == lease && ev.Kind == "session.closed" && strings.HasSuffix(ev.Message, "exit code 7") {
			closed++
		}
		if strings.Contains(ev.Message, "hello") {
			t.Errorf("an event holds what was typed: %q", ev.Message)
		}
	}
	if opened != 1 || closed != 1 {
		t.Errorf("the shell on record: %d opened, %d closed with exit code 7", opened, closed)
	}
}

// newTmuxNamed adds a window of its own to p's tmux server.
func newTmuxNamed(t *testing.T, p *tmuxPane, name, command string) *tmuxPane {
	t.Helper()
	p.run("new-session", "-d", "-s", name, "-x", "100", "-y", "30", command)
	return &tmuxPane{t: t, tmux: p.tmux, socket: p.socket, target: name}
}
