package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln.dev/kiln/server/tunneltest"
)

// TestHelperForwardJob is the job TestForward reaches, not a test.
func TestHelperForwardJob(t *testing.T) {
	if !tunneltest.Wanted() {
		t.Skip("the job of TestForward")
	}
	t.Fatal(tunneltest.Serve())
}

// jobBinary copies this test binary where a job can run it: a job runs as
// a user of its own, with a /tmp of its own but for its working directory,
// which dir is.
func jobBinary(t *testing.T) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "kiln-job-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "job")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// TestForward runs kiln up --demo and a separate kiln agent, starts a job
// with a TCP echo and an HTTP server on each, and reaches them with kiln
// forward: bytes both ways checked by hash, curl (or Go's client) for
// HTTP; another project's member is refused; the lease's end ends the
// forward.
func TestForward(t *testing.T) {
	e := setupSecurity(t)
	dir, job := jobBinary(t)
	for _, node := range []string{"extra", "demo-hgx-h100"} {
		t.Run(node, func(t *testing.T) {
			ports, err := tunneltest.FreePorts(4)
			if err != nil {
				t.Fatal(err)
			}
			echoPort, httpPort, localEcho, localHTTP := ports[0], ports[1], ports[2], ports[3]
			out, stderr, code := e.kilnAs(e.member, "run", "-d", "-o", "json", "--gpus", "1", "--node", node,
				"--port", strconv.Itoa(echoPort), "--port", strconv.Itoa(httpPort), "--workdir", dir,
				"-e", fmt.Sprintf("%s=%d,%d", tunneltest.Env, echoPort, httpPort), "--", job, "-test.run=^TestHelperForwardJob$")
			var run struct {
				Lease struct {
					ID string `json:"id"`
				} `json:"lease"`
			}
			if code != 0 || json.Unmarshal([]byte(out), &run) != nil || run.Lease.ID == "" {
				t.Fatalf("kiln run: %d %s\n%s", code, stderr, out)
			}
			lease := run.Lease.ID
			fwd := func(cfg string, port, local int) (*exec.Cmd, *bytes.Buffer) {
				cmd := exec.Command(e.bin, "forward", lease, strconv.Itoa(port), strconv.Itoa(local))
				cmd.Env = append(os.Environ(), "KILN_CONFIG="+cfg)
				var errb bytes.Buffer
				cmd.Stderr = &errb
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				e.procs = append(e.procs, cmd)
				return cmd, &errb
			}
			echoFwd, echoErr := fwd(e.member, echoPort, localEcho)
			fwd(e.member, httpPort, localHTTP)
			defer func() {
				if t.Failed() {
					logs, _, _ := e.kilnAs(e.member, "logs", lease)
					t.Logf("kiln forward said:\n%s\nthe job's log:\n%s", echoErr, logs)
				}
			}()

			// The job may take a moment to listen: the first connections
			// are closed until it does.
			var conn net.Conn
			waitFor(t, "the echo through kiln forward", 30*time.Second, func() bool {
				c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(localEcho)))
				if err != nil {
					return false
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write([]byte("ping")); err != nil {
					c.Close()
					return false
				}
				b := make([]byte, 4)
				if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
					c.Close()
					return false
				}
				c.SetDeadline(time.Time{})
				conn = c
				return true
			})
			if err := tunneltest.CheckEcho(conn, 16<<20); err != nil {
				t.Fatal(err)
			}
			conn.Close()

			// HTTP: curl where it is installed, as users reach a model
			// server, else Go's client.
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/models", localHTTP)
			var page string
			waitFor(t, "HTTP through kiln forward", 30*time.Second, func() bool {
				if curl, err := exec.LookPath("curl"); err == nil {
					out, err := exec.Command(curl, "-sS", "--max-time", "5", url).Output()
					page = string(out)
					return err == nil
				}
				resp, err := http.Get(url)
				if err != nil {
					return false
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				page = string(b)
				return true
			})
			if !strings.Contains(page, tunneltest.Page+"/v1/models") {
				t.Errorf("GET /v1/models through kiln forward: %q", page)
			}
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/events", localHTTP))
			if err != nil {
				t.Fatal(err)
			}
			events := tunneltest.ReadEvents(resp.Body)
			resp.Body.Close()
			if !tunneltest.WantEvents(events) {
				t.Errorf("server-sent events through kiln forward: %q", events)
			}

			// Victor, of another project, gets nothing through a forward of
			// his own: the server does not show him the lease.
			if _, stderr, code := e.kilnAs(e.victim, "forward", lease, strconv.Itoa(echoPort), "0"); code == 0 || !strings.Contains(stderr, "not found") {
				t.Errorf("victor's kiln forward of mallory's lease: exit %d %s", code, stderr)
			}

			// The lease's end ends kiln forward.
			if _, stderr, code := e.kilnAs(e.member, "cancel", lease); code != 0 {
				t.Fatalf("kiln cancel: %d %s", code, stderr)
			}
			exited := make(chan error, 1)
			go func() { exited <- echoFwd.Wait() }()
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if !errAs(err, &ee) || ee.ExitCode() != 2 {
					t.Errorf("kiln forward after the lease ended: %v, want exit 2", err)
				}
			case <-time.After(40 * time.Second):
				t.Error("kiln forward still runs after the lease ended")
			}
		})
	}
}

func errAs(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok
}
