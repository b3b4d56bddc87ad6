package server_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
)

// runSession opens a session on the lease and carries it to its end.
func runSession(t *testing.T, cl *api.Client, lease string, req api.SessionRequest, stdin string) (api.SessionExit, string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, fw, err := cl.OpenSession(ctx, lease, "", 0, req)
	if err != nil {
		return api.SessionExit{}, "", "", err
	}
	var out, errOut bytes.Buffer
	ex, err := api.RunSession(ctx, st, fw, api.SessionIO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut})
	return ex, out.String(), errOut.String(), err
}

// TestSessions runs commands beside a lease's job through the server and
// the agent: input, output, error output and exit code; a terminal's
// size; who may not open one; the record in the lease's events; the
// lease's end closing an open session.
func TestSessions(t *testing.T) {
	c := newCluster(t, server.Config{})
	c.addAgent("n1", machines(t)["pcie"], nil, 200*time.Millisecond)
	c.waitNodes(1)
	alice := c.user("alice", "default")
	bob := c.user("bob", "default")
	c.project("other", 1)
	carol := c.user("carol", "other")
	ctx := context.Background()
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{
		Command: []string{"sleep", "120"}, Env: map[string]string{"FROM_JOB": "job-env"}}})
	if err != nil || l.State != api.LeaseGranted {
		t.Fatalf("lease: %v %+v", err, l)
	}
	waitLease(t, alice, l.ID, 10*time.Second, func(l *api.Lease) bool { return len(l.Jobs) == 1 })

	script := `echo "out $FROM_JOB"; echo err >&2; read x; echo "got=$x"; exit 7`
	req := api.SessionRequest{Command: []string{"/bin/sh", "-c", script}}
	var ex api.SessionExit
	var out, errOut string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// The job's task runs once the agent has started it.
		ex, out, errOut, err = runSession(t, alice, l.ID, req, "typed\n")
		if err == nil || time.Now().After(deadline) || api.StatusOf(err) != http.StatusConflict {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if ex.Code != 7 || out != "out job-env\ngot=typed\n" || errOut != "err\n" {
		t.Errorf("session: exit %+v, output %q, error output %q", ex, out, errOut)
	}

	// A terminal of the size asked; its output is all on stdout.
	ex, out, _, err = runSession(t, alice, l.ID, api.SessionRequest{TTY: true, Rows: 33, Cols: 77,
		Command: []string{"/bin/sh", "-c", "stty size; echo e >&2"}}, "")
	if err != nil || ex.Code != 0 || !strings.Contains(out, "33 77") || !strings.Contains(out, "e") {
		t.Errorf("terminal session: %v %+v %q", err, ex, out)
	}

	// Who may not.
	for _, w := range []struct {
		who    string
		cl     *api.Client
		status int
	}{
		{"bob, a member of the project but not the owner", bob, http.StatusForbidden},
		{"carol, of another project", carol, http.StatusNotFound},
	} {
		_, _, _, err := runSession(t, w.cl, l.ID, api.SessionRequest{Command: []string{"id"}}, "")
		if api.StatusOf(err) != w.status {
			t.Errorf("%s: %v, want %d", w.who, err, w.status)
		}
	}
	if _, _, _, err := runSession(t, c.admin, l.ID, api.SessionRequest{Command: []string{"true"}}, ""); err != nil {
		t.Errorf("an admin opens a session: %v", err)
	}
	if _, _, _, err := runSession(t, alice, l.ID, api.SessionRequest{Command: []string{"a\x00b"}}, ""); err == nil {
		t.Error("a command with a NUL byte was sent")
	}
	if _, _, _, err := runSession(t, alice, l.ID, api.SessionRequest{Command: []string{"no-such-program-anywhere"}}, ""); err == nil || api.StatusOf(err) != http.StatusBadGateway {
		t.Errorf("a missing program: %v, want 502", err)
	}

	// The lease's end closes an open session.
	st, fw, err := alice.OpenSession(ctx, l.ID, "", 0, api.SessionRequest{Command: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		ex, err := api.RunSession(ctx, st, fw, api.SessionIO{Stdin: blockingReader{}})
		if err == nil && ex.Code == 0 {
			err = errors.New("the session ended with code 0")
		}
		ended <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if _, err := alice.CancelLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		t.Logf("the session after the lease's end: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the session stayed open after the lease ended")
	}
	waitLease(t, alice, l.ID, 15*time.Second, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	if _, _, _, err := runSession(t, alice, l.ID, api.SessionRequest{Command: []string{"true"}}, ""); api.StatusOf(err) != http.StatusConflict {
		t.Errorf("a session on an ended lease: %v, want 409", err)
	}

	// On record: who opened what, and its end; nothing typed.
	evs, err := c.admin.Events(ctx, api.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var opened, closed []string
	for _, e := range evs {
		if e.Subject != l.ID {
			continue
		}
		switch e.Kind {
		case "session.opened":
			opened = append(opened, e.Message)
		case "session.closed":
			closed = append(closed, e.Message)
		}
		if strings.Contains(e.Message, "typed") || strings.Contains(e.Message, "FROM_JOB") {
			t.Errorf("an event holds what was typed or run: %q", e.Message)
		}
	}
	t.Logf("opened: %q\nclosed: %q", opened, closed)
	if len(opened) < 4 || !strings.HasPrefix(opened[0], `alice opened a session running "/bin/sh" beside job `) {
		t.Errorf("session.opened events: %q", opened)
	}
	if len(closed) < len(opened) || !strings.HasSuffix(closed[0], "exit code 7") || !strings.Contains(closed[len(closed)-1], "the job ended") {
		t.Errorf("%d sessions opened, %d closed on record: %q", len(opened), len(closed), closed)
	}
}

// blockingReader is input that never comes.
type blockingReader struct{}

func (blockingReader) Read([]byte) (int, error) { select {} }
