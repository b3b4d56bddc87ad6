package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

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
	p, err := tunneltest.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return p[0]
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

// portServerJob runs TestHelperPortServer as a job: a TCP echo and an HTTP
// server (tunneltest.Serve) on the two ports, declaring those and more.
func portServerJob(echoPort, httpPort int, more ...int) *api.JobSpec {
	return &api.JobSpec{
		Command: []string{os.Args[0], "-test.run=^TestHelperPortServer$"},
		Env:     map[string]string{tunneltest.Env: fmt.Sprintf("%d,%d", echoPort, httpPort)},
		Ports:   append([]int{echoPort, httpPort}, more...)}
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
	echoPort, httpPort, silentPort := tcpPort(t), tcpPort(t), tcpPort(t)
	ctx := context.Background()
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: portServerJob(echoPort, httpPort, silentPort)})
	if err != nil {
		t.Fatal(err)
	}
	st := connectWhenUp(t, alice, l.ID, echoPort)
	// The lease lists its job's ports: the two the job listens on open
	// (once the agent has looked), the third waiting.
	want := fmt.Sprintf("%d:open %d:open %d:waiting", echoPort, httpPort, silentPort)
	waitLease(t, alice, l.ID, 10*time.Second, func(l *api.Lease) bool {
		var got []string
		for _, p := range l.Ports {
			got = append(got, fmt.Sprintf("%d:%s", p.Port, p.State))
		}
		return strings.Join(got, " ") == want
	})
	if s, err := alice.ConnectPort(ctx, l.ID, silentPort, "", 0); err == nil || api.StatusOf(err) != http.StatusBadGateway {
		if s != nil {
			s.Close()
		}
		t.Errorf("a declared port nothing listens on: %v, want 502", err)
	}

	// 32 MiB each way at once, compared by hash.
	if err := tunneltest.CheckEcho(st, 32<<20); err != nil {
		t.Fatal(err)
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
	events := tunneltest.ReadEvents(resp.Body)
	resp.Body.Close()
	if !tunneltest.WantEvents(events) {
		t.Errorf("server-sent events through the tunnel: %q", events)
	}

	// The HTTP path: the server answers for the job, without kiln's
	// credentials reaching it.
	base := fmt.Sprintf("%s/v1/leases/%s/ports/%d/http", c.url, l.ID, httpPort)
	get := func(cl *api.Client, path string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+cl.Token)
		req.AddCookie(&http.Cookie{Name: "kiln_session", Value: "secret"})
		req.AddCookie(&http.Cookie{Name: "app", Value: "kept"})
		resp, err := cl.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(alice, "/a/b?q=1"); code != 200 || !strings.Contains(body, tunneltest.Page+"/a/b") {
		t.Errorf("GET through the HTTP path: %d %q", code, body)
	}
	// Many requests on kept-alive tunnels: none loses its answer.
	for i := range 50 {
		if code, body := get(alice, "/n"+strconv.Itoa(i)); code != 200 || !strings.Contains(body, tunneltest.Page+"/n"+strconv.Itoa(i)) {
			t.Fatalf("request %d through the HTTP path: %d %q", i, code, body)
		}
	}
	// One user's requests in turn reuse one tunnel; another caller (an
	// admin) never gets that user's connection.
	peers := map[string]bool{}
	for range 5 {
		_, p := get(alice, "/peer")
		peers[p] = true
	}
	if len(peers) != 1 {
		t.Errorf("5 requests in turn came on %d connections, want 1 kept alive: %v", len(peers), peers)
	}
	if code, p := get(c.admin, "/peer"); code != 200 || peers[p] {
		t.Errorf("an admin's request: %d on %q, alice's connections %v", code, p, peers)
	}
	code, hdrs := get(alice, "/headers")
	if code != 200 || strings.Contains(hdrs, alice.Token) || strings.Contains(hdrs, "kiln_session") || !strings.Contains(hdrs, "app=kept") ||
		!strings.Contains(hdrs, "X-Forwarded-Prefix: /v1/leases/"+l.ID+"/ports/"+strconv.Itoa(httpPort)+"/http") {
		t.Errorf("the job got these headers through the HTTP path (%d):\n%s", code, hdrs)
	}
	// The job's page keeps its own cookie, and cannot set one of kiln's.
	creq, _ := http.NewRequest("GET", base+"/cookies", nil)
	creq.Header.Set("Authorization", "Bearer "+alice.Token)
	cresp, err := alice.HTTP.Do(creq)
	if err != nil {
		t.Fatal(err)
	}
	cresp.Body.Close()
	if set := strings.Join(cresp.Header.Values("Set-Cookie"), "\n"); strings.Contains(set, "kiln_ui_session") || !strings.Contains(set, "app_session=kept") {
		t.Errorf("the job's cookies through the HTTP path:\n%s", set)
	}
	if code, body := get(alice, "/events"); code != 200 || strings.Count(body, "data: event") != len(tunneltest.Events) {
		t.Errorf("server-sent events through the HTTP path: %d %q", code, body)
	}
	if code, _ := get(bob, "/hello"); code != http.StatusForbidden {
		t.Errorf("bob through the HTTP path: %d, want 403", code)
	}
	if code, _ := get(carol, "/hello"); code != http.StatusNotFound {
		t.Errorf("carol through the HTTP path: %d, want 404", code)
	}
	// A browser: a one-time link traded for a cookie of that path alone.
	link, err := alice.BrowserLink(ctx, l.ID, httpPort)
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	tr := alice.HTTP.Transport.(*http.Transport).Clone()
	browser := &http.Client{Transport: tr, Jar: jar}
	resp, err = browser.Get(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), tunneltest.Page+"/") || strings.Contains(resp.Request.URL.RawQuery, "kiln_code") {
		t.Errorf("the browser link: %d %q at %s", resp.StatusCode, body, resp.Request.URL)
	}
	resp, err = browser.Get(base + "/headers")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(body), "kiln_port_session") || strings.Contains(string(body), "Authorization") {
		t.Errorf("the browser's session through the HTTP path: %d\n%s", resp.StatusCode, body)
	}
	fresh := &http.Client{Transport: tr}
	if resp, err := fresh.Get(link.URL); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the link used a second time: %v %v, want 401", resp.Status, err)
	}
	// The cookie is for that path: another port of the lease is refused.
	sess := jar.Cookies(resp.Request.URL)
	if len(sess) != 1 {
		t.Fatalf("cookies of the path: %v", sess)
	}
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/leases/%s/ports/%d/http/", c.url, l.ID, echoPort), nil)
	req.AddCookie(sess[0])
	if resp, err := fresh.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the session cookie on another port's path: %v %v, want 401", resp.Status, err)
	}
	if _, err := bob.BrowserLink(ctx, l.ID, httpPort); api.StatusOf(err) != http.StatusForbidden {
		t.Errorf("bob asks for a browser link to alice's lease: %v, want 403", err)
	}
	// A session ends with the token that asked for it.
	alice2 := c.user("alice", "default")
	link2, err := alice2.BrowserLink(ctx, l.ID, httpPort)
	if err != nil {
		t.Fatal(err)
	}
	jar2, _ := cookiejar.New(nil)
	browser2 := &http.Client{Transport: tr, Jar: jar2}
	if resp, err := browser2.Get(link2.URL); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the second browser link: %v %v", resp, err)
	}
	tokID, _, _ := strings.Cut(strings.TrimPrefix(alice2.Token, "kiln_"), "_")
	if err := alice2.DeleteToken(ctx, tokID); err != nil {
		t.Fatal(err)
	}
	if resp, err := browser2.Get(base + "/hello"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the browser session after its token was revoked: %v %v, want 401", resp.Status, err)
	}

	// A WebSocket (HTTP/1.1 upgrade) through the HTTP path.
	wsURL := strings.Replace(base, "https://", "wss://", 1) + "/ws"
	wcfg, err := websocket.NewConfig(wsURL, c.url)
	if err != nil {
		t.Fatal(err)
	}
	wcfg.TlsConfig = alice.HTTP.Transport.(*http.Transport).TLSClientConfig.Clone()
	wcfg.TlsConfig.NextProtos = nil
	wcfg.Header.Set("Authorization", "Bearer "+alice.Token)
	ws, err := websocket.DialConfig(wcfg)
	if err != nil {
		t.Fatalf("WebSocket through the HTTP path: %v", err)
	}
	msg := strings.Repeat("websocket ", 1000)
	if err := websocket.Message.Send(ws, msg); err != nil {
		t.Fatal(err)
	}
	echoed := make([]byte, len(msg))
	if _, err := io.ReadFull(ws, echoed); err != nil || string(echoed) != msg {
		t.Errorf("WebSocket echo: %v", err)
	}
	ws.Close()

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

	// Another tenant's job on the same node declares alice's port: the
	// agent sees that the process listening there is not that job's and
	// refuses, so carol does not reach alice's server through her own
	// lease.
	cl, err := carol.CreateLease(ctx, api.LeaseRequest{Project: "other", GPUs: 1, Job: &api.JobSpec{
		Command: []string{"sleep", "60"}, Ports: []int{echoPort}}})
	if err != nil || cl.State != api.LeaseGranted {
		t.Fatalf("carol's lease: %v %+v", err, cl)
	}
	waitLease(t, carol, cl.ID, 10*time.Second, func(l *api.Lease) bool { return len(l.Ports) == 1 })
	var last error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		s, err := carol.ConnectPort(ctx, cl.ID, echoPort, "", 0)
		if err == nil {
			s.Close()
			t.Fatal("carol reached alice's port through a lease of her own")
		}
		if last = err; api.StatusOf(err) == http.StatusBadGateway {
			break
		}
	}
	if api.StatusOf(last) != http.StatusBadGateway || !strings.Contains(last.Error(), "not the job's") {
		t.Errorf("carol's own lease declaring alice's port: %v, want 502 (not the job's)", last)
	}
	if l, _ := carol.GetLease(ctx, cl.ID, api.LeaseWait{}); l == nil || len(l.Ports) != 1 || l.Ports[0].State != api.PortWaiting {
		t.Errorf("carol's lease shows alice's port as %+v, want waiting", l)
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

// TestTunnelIdle: a connection that carries bytes outlives the idle time;
// one that carries nothing for longer is closed by the server, and the
// HTTP path's kept-alive tunnels closed that way are replaced unseen.
func TestTunnelIdle(t *testing.T) {
	const idle = 400 * time.Millisecond
	c := newCluster(t, server.Config{TunnelIdle: idle})
	c.addAgent("n1", machines(t)["pcie"], nil, 200*time.Millisecond)
	c.waitNodes(1)
	alice := c.user("alice", "default")
	echoPort, httpPort := tcpPort(t), tcpPort(t)
	ctx := context.Background()
	l, err := alice.CreateLease(ctx, api.LeaseRequest{Project: "default", GPUs: 1, Job: portServerJob(echoPort, httpPort)})
	if err != nil {
		t.Fatal(err)
	}
	var st *api.Stream
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st = connectWhenUp(t, alice, l.ID, echoPort)
		if tunneltest.CheckEcho(st, 4) == nil {
			break
		}
		st.Close()
		if time.Now().After(deadline) {
			t.Fatal("the job's echo did not answer")
		}
	}
	defer st.Close()
	// Busy for three idle times: still open.
	var quiet time.Time // before the last bytes
	for start := time.Now(); time.Since(start) < 3*idle; time.Sleep(idle / 4) {
		quiet = time.Now()
		if err := tunneltest.CheckEcho(st, 64); err != nil {
			t.Fatalf("a busy connection after %s: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
	// Then silent: closed after the idle time, not before.
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, st)
		ended <- err
	}()
	select {
	case <-ended:
		if d := time.Since(quiet); d < idle {
			t.Errorf("a silent connection was closed after %s, before the idle time %s", d, idle)
		}
	case <-time.After(10 * idle):
		t.Fatalf("a connection silent for %s is still open (idle time %s)", 10*idle, idle)
	}

	// The HTTP path: a kept-alive tunnel outlives its idle time on the
	// server's side only; the next request gets a new one.
	path := fmt.Sprintf("%s/v1/leases/%s/ports/%d/http/peer", c.url, l.ID, httpPort)
	get := func() string {
		req, _ := http.NewRequest("GET", path, nil)
		req.Header.Set("Authorization", "Bearer "+alice.Token)
		resp, err := alice.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	first := get()
	time.Sleep(3 * idle)
	if again := get(); again == first {
		t.Errorf("after %s idle the request came on the same connection %q", 3*idle, first)
	}
}
