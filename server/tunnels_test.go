package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/server/tunneltest"
)

// TestHelperPortServer is the job of the tunnel tests, not a test.
func TestHelperPortServer(t *testing.T) {
	if !tunneltest.Wanted() {
		t.Skip("the job of TestTunnels")
	}
	t.Fatal(tunneltest.Serve())
}

func tcpPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// connectWhenUp retries while the job is not listening yet.
func connectWhenUp(t *testing.T, cl *api.Client, lease string, port int) *api.Stream {
	t.Helper()
	var last error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st, err := cl.ConnectPort(context.Background(), lease, port, "", 0)
		if err == nil {
			return st
		}
		last = err
	}
	t.Fatalf("connecting to port %d of lease %s: %v", port, lease, last)
	return nil
}

// TestTunnels reaches a real TCP echo and HTTP server run as a job
// through the server and the agent: bytes both ways checked by hash, an
// HTTP request and a server-sent event stream; who may not connect is
// refused; the lease's end closes the connections.
func TestTunnels(t *testing.T) {
	c := newCluster(t, server.Config{TunnelIdle: time.Minute})
	c.addAgent("n1", machines(t)["pcie"], nil, 200*time.Millisecond)
	c.waitNodes(1)
	alice := c.user("alice", "default")
	bob := c.user("bob", "default")
	c.project("other", 1)
	carol := c.user("carol", "other")
	echoPort, httpPort := tcpPort(t), tcpPort(t)
	ctx := context.Background()
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: &api.JobSpec{
		Command: []string{os.Args[0], "-test.run=^TestHelperPortServer$"},
		Env:     map[string]string{tunneltest.Env: fmt.Sprintf("%d,%d", echoPort, httpPort)},
		Ports:   []int{echoPort, httpPort}}})
	if err != nil {
		t.Fatal(err)
	}
	st := connectWhenUp(t, alice, l.ID, echoPort)

	// 32 MiB each way at once, compared by hash.
	const size = 32 << 20
	sent := sha256.New()
	got := sha256.New()
	werr := make(chan error, 1)
	go func() {
		_, err := io.CopyN(st, io.TeeReader(rand.Reader, sent), size)
		werr <- err
	}()
	if n, err := io.CopyN(got, st, size); err != nil || n != size {
		t.Fatalf("echo: read %d of %d bytes: %v", n, size, err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		t.Fatal("echo: the bytes that came back differ from those sent")
	}

	// HTTP over a tunnel, as kiln forward carries it.
	connectWhenUp(t, alice, l.ID, httpPort).Close()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		s, err := alice.ConnectPort(ctx, l.ID, httpPort, "", 0)
		if err != nil {
			return nil, err
		}
		return streamConn{s}, nil
	}}}
	resp, err := hc.Get("http://job/hello")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), tunneltest.Page+"/hello") {
		t.Errorf("GET /hello through the tunnel: %s %q", resp.Status, body)
	}
	resp, err = hc.Get("http://job/events")
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	resp.Body.Close()
	if strings.Join(events, ",") != strings.Join(tunneltest.Events, ",") {
		t.Errorf("server-sent events through the tunnel: %q", events)
	}

	// Who may not connect, and what is not declared.
	for _, c := range []struct {
		who    string
		cl     *api.Client
		port   int
		status int
	}{
		{"bob, a member of the project but not the owner", bob, echoPort, http.StatusForbidden},
		{"carol, of another project", carol, echoPort, http.StatusNotFound},
		{"alice, a port the job did not declare", alice, tcpPort(t), http.StatusNotFound},
	} {
		s, err := c.cl.ConnectPort(ctx, l.ID, c.port, "", 0)
		if err == nil {
			s.Close()
			t.Errorf("%s: connected", c.who)
			continue
		}
		if api.StatusOf(err) != c.status {
			t.Errorf("%s: %v (status %d), want %d", c.who, err, api.StatusOf(err), c.status)
		}
	}
	if _, err := c.admin.ConnectPort(ctx, l.ID, echoPort, "", 0); err != nil {
		t.Errorf("an admin reaches a lease's ports: %v", err)
	}

	// The lease's end closes the tunnel it carries.
	open := connectWhenUp(t, alice, l.ID, echoPort)
	if _, err := open.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(open, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo before the end: %q %v", buf, err)
	}
	if _, err := alice.CancelLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, open); ended <- err }()
	select {
	case <-ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the tunnel stayed open after the lease ended")
	}
	waitLease(t, alice, l.ID, 15*time.Second, func(l *api.Lease) bool { return api.LeaseFinal(l.State) })
	if s, err := alice.ConnectPort(ctx, l.ID, echoPort, "", 0); err == nil || api.StatusOf(err) != http.StatusConflict {
		if s != nil {
			s.Close()
		}
		t.Errorf("connecting to an ended lease: %v, want 409", err)
	}
}

// streamConn is an api.Stream as a net.Conn, for an http.Transport.
type streamConn struct{ *api.Stream }

func (streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (streamConn) SetDeadline(time.Time) error      { return nil }
func (streamConn) SetReadDeadline(time.Time) error  { return nil }
func (streamConn) SetWriteDeadline(time.Time) error { return nil }
func (s streamConn) String() string                 { return strconv.Quote("tunnel") }
